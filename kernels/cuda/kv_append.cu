#include "kernels/cuda/kv_append.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;

constexpr int kThreads = 256;

// A block per row; threads cover num_kv_heads * head_dim values of K and of V.
template <typename T, typename KvT>
__global__ void KvAppendKernel(DevicePagedKv kv, const T* k, const T* v, int64_t src_stride,
                               const int64_t* slot_mapping, int64_t rows) {
  const int32_t d = kv.head_dim;
  const int32_t width = kv.num_kv_heads * d;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t mapped = slot_mapping[r];
    if (mapped < 0) continue;
    const int32_t block = static_cast<int32_t>(mapped / kv.block_size);
    const int32_t slot = static_cast<int32_t>(mapped % kv.block_size);
    for (int32_t i = threadIdx.x; i < width; i += blockDim.x) {
      const int32_t h = i / d;
      const int32_t c = i % d;
      const int64_t src = r * src_stride + i;
      detail::KvRow<KvT>(kv, block, h, slot, false)[c] = FromFloat<KvT>(ToFloat(k[src]));
      detail::KvRow<KvT>(kv, block, h, slot, true)[c] = FromFloat<KvT>(ToFloat(v[src]));
    }
  }
}

}  // namespace

template <typename T>
absl::Status KvAppend(const DevicePagedKv& kv, const T* k, const T* v, int64_t src_stride,
                      const int64_t* slot_mapping, int64_t rows, cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("KvAppend: rows is ", rows));
  if (src_stride < int64_t{kv.num_kv_heads} * kv.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvAppend: src_stride ", src_stride, " is shorter than num_kv_heads x head_dim"));
  }
  if (rows == 0) return absl::OkStatus();
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, 1 << 30));
  if (kv.dtype == KvDtype::kF16) {
    KvAppendKernel<T, __half><<<grid, kThreads, 0, stream>>>(kv, k, v, src_stride, slot_mapping,
                                                             rows);
  } else {
    KvAppendKernel<T, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(kv, k, v, src_stride,
                                                                     slot_mapping, rows);
  }
  return LastLaunchStatus("KvAppendKernel");
}

template absl::Status KvAppend<__half>(const DevicePagedKv&, const __half*, const __half*, int64_t,
                                       const int64_t*, int64_t, cudaStream_t);
template absl::Status KvAppend<__nv_bfloat16>(const DevicePagedKv&, const __nv_bfloat16*,
                                              const __nv_bfloat16*, int64_t, const int64_t*,
                                              int64_t, cudaStream_t);

}  // namespace winnow::kernels::cuda
