#include "kernels/cuda/gather.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {
namespace {

template <typename T>
__global__ void GatherRowsKernel(const T* src, int64_t src_rows, int64_t cols,
                                 const int32_t* row_ids, int64_t num_rows, T* out) {
  for (int64_t i = blockIdx.x; i < num_rows; i += gridDim.x) {
    const int32_t row = row_ids[i];
    const bool valid = row >= 0 && row < src_rows;
    T* dst = out + i * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      dst[c] = valid ? src[int64_t{row} * cols + c] : T(0.0f);
    }
  }
}

}  // namespace

template <typename T>
absl::Status GatherRows(const T* src, int64_t src_rows, int64_t cols, const int32_t* row_ids,
                        int64_t num_rows, T* out, cudaStream_t stream) {
  if (num_rows < 0 || src_rows < 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GatherRows: num_rows (", num_rows,
                                                   ") and src_rows (", src_rows,
                                                   ") must be >= 0 and cols (", cols,
                                                   ") positive"));
  }
  if (num_rows == 0) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(num_rows, 1 << 30));
  GatherRowsKernel<T><<<grid, 256, 0, stream>>>(src, src_rows, cols, row_ids, num_rows, out);
  return LastLaunchStatus("GatherRows");
}

template absl::Status GatherRows<float>(const float*, int64_t, int64_t, const int32_t*, int64_t,
                                        float*, cudaStream_t);
template absl::Status GatherRows<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                const int32_t*, int64_t, __nv_bfloat16*,
                                                cudaStream_t);
template absl::Status GatherRows<__half>(const __half*, int64_t, int64_t, const int32_t*,
                                         int64_t, __half*, cudaStream_t);

}  // namespace winnow::kernels::cuda
