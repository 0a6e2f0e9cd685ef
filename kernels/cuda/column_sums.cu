#include "kernels/cuda/column_sums.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Logit rows are padded to a multiple of 8 floats (32 bytes), so that every head's output and
// every row starts aligned for cuBLAS's vectorised epilogue whatever the key count.
int32_t PaddedKeys(int32_t keys) { return (keys + 7) / 8 * 8; }

__device__ inline int32_t Visible(const int32_t* visible, int32_t r, int32_t num_slots) {
  return min(max(visible[r], 0), num_slots);
}

// keys[g][j][c] = K of slot j, KV head g, in order: the GEMM needs each head's keys as one
// matrix, the paged pool holds them block by block.
__global__ void GatherKeysKernel(DevicePagedKv kv, const int32_t* table, int32_t num_keys,
                                 __nv_bfloat16* keys) {
  const int32_t d = kv.head_dim;
  const int64_t total = int64_t{kv.num_kv_heads} * num_keys * d;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t c = static_cast<int32_t>(i % d);
    const int32_t j = static_cast<int32_t>((i / d) % num_keys);
    const int32_t g = static_cast<int32_t>(i / (int64_t{d} * num_keys));
    keys[i] = detail::KvRow<__nv_bfloat16>(kv, table[j / kv.block_size], g, j % kv.block_size,
                                           false)[c];
  }
}

// One block per (row, head) of the chunk: lse[h * rows + r] = ln sum over j < visible[r] of
// exp(logit), -inf for a row that sees no key. Logit (h, r, j) is at (h * rows + r) * ld + j.
__global__ void ChunkLogNormalizersKernel(const float* logits, int32_t rows, int32_t keys,
                                          int32_t ld, const int32_t* visible, int32_t num_slots,
                                          float* lse) {
  __shared__ float reduce[detail::kWarp];
  const int32_t r = blockIdx.x;
  const int32_t h = blockIdx.y;
  const float* row = logits + (int64_t{h} * rows + r) * ld;
  const int32_t end = min(Visible(visible, r, num_slots), keys);
  float local_max = -INFINITY;
  for (int32_t j = threadIdx.x; j < end; j += blockDim.x) local_max = fmaxf(local_max, row[j]);
  const float max_logit = detail::BlockReduce<true>(local_max, reduce);
  float local_sum = 0.0f;
  for (int32_t j = threadIdx.x; j < end; j += blockDim.x) local_sum += expf(row[j] - max_logit);
  const float sum = detail::BlockReduce<false>(local_sum, reduce);
  if (threadIdx.x == 0) lse[int64_t{h} * rows + r] = end > 0 ? max_logit + logf(sum) : -INFINITY;
}

// A thread per (key, head): the column's probabilities over the chunk's rows, in row order,
// added to its sum. Adjacent threads read adjacent logits of a row.
__global__ void ChunkColumnSumsKernel(const float* logits, int32_t rows, int32_t keys,
                                      int32_t ld, const int32_t* visible, int32_t num_slots,
                                      const float* lse, float* column_sums) {
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t h = blockIdx.y;
  if (j >= keys) return;
  const float* column = logits + int64_t{h} * rows * ld + j;
  const float* row_lse = lse + int64_t{h} * rows;
  float sum = 0.0f;
  for (int32_t r = 0; r < rows; ++r) {
    if (j < Visible(visible, r, num_slots)) sum += expf(column[int64_t{r} * ld] - row_lse[r]);
  }
  column_sums[int64_t{h} * num_slots + j] += sum;
}

// Grows `buffer` to exactly `count` elements when it holds fewer (kernels::cuda::Reserve
// doubles, which would overshoot ScratchBytes).
template <typename T>
absl::Status ReserveExactly(DeviceBuffer<T>& buffer, int64_t count) {
  if (buffer.size() >= count) return absl::OkStatus();
  buffer = DeviceBuffer<T>();  // free first: the old and new scratch need not coexist
  absl::StatusOr<DeviceBuffer<T>> grown = DeviceBuffer<T>::Allocate(count);
  if (!grown.ok()) return grown.status();
  buffer = *std::move(grown);
  return absl::OkStatus();
}

int32_t ChunkRows(int64_t logits_bytes, int32_t num_heads, int32_t keys, int32_t rows) {
  const int64_t per_row = int64_t{num_heads} * keys * static_cast<int64_t>(sizeof(float));
  const int64_t fit = std::max<int64_t>(logits_bytes / per_row,
                                        TensorCoreColumnSums::kMinChunkRows);
  return static_cast<int32_t>(std::min<int64_t>(fit, rows));
}

}  // namespace

int64_t TensorCoreColumnSums::ScratchBytes(int32_t num_heads, int32_t num_kv_heads,
                                           int32_t head_dim, int32_t max_keys,
                                           int64_t max_rows) {
  const int64_t logits = std::max<int64_t>(
      kLogitsBytes, int64_t{num_heads} * kMinChunkRows * PaddedKeys(max_keys) * sizeof(float));
  const int64_t keys = int64_t{num_kv_heads} * max_keys * head_dim * sizeof(__nv_bfloat16);
  const int64_t lse = int64_t{num_heads} * max_rows * sizeof(float);
  return logits + keys + lse + 3 * int64_t{num_heads} * sizeof(void*);
}

absl::Status TensorCoreColumnSums::Run(const DevicePagedKv& kv,
                                       const DeviceScoreInput<__nv_bfloat16>& in,
                                       std::span<const int32_t> host_visible,
                                       float* column_sums, Gemm& gemm, PinnedStager& stager,
                                       cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (kv.dtype != KvDtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorCoreColumnSums: the arena holds ", KvDtypeName(kv.dtype), ", not bf16"));
  }
  if (in.num_heads <= 0 || in.num_heads % kv.num_kv_heads != 0 || in.num_slots <= 0 ||
      static_cast<int64_t>(host_visible.size()) != in.num_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorCoreColumnSums: num_heads ", in.num_heads, " (a multiple of num_kv_heads ",
        kv.num_kv_heads, "), num_slots ", in.num_slots, " (positive) and host_visible (",
        host_visible.size(), " values for ", in.num_rows, " rows) disagree"));
  }
  if (in.block_table == nullptr || in.q == nullptr || in.visible == nullptr ||
      column_sums == nullptr) {
    return absl::InvalidArgumentError(
        "TensorCoreColumnSums: block_table, q, visible and column_sums are required");
  }
  auto visible_of = [&](int32_t r) { return std::clamp(host_visible[r], 0, in.num_slots); };
  int32_t all_keys = 0;
  for (int32_t r = 0; r < in.num_rows; ++r) all_keys = std::max(all_keys, visible_of(r));
  if (all_keys == 0) return absl::OkStatus();

  const int32_t reserved_keys = std::max(all_keys, max_keys_);
  WINNOW_RETURN_IF_ERROR(
      ReserveExactly(keys_, int64_t{kv.num_kv_heads} * reserved_keys * kv.head_dim));
  const int64_t gathered = int64_t{kv.num_kv_heads} * all_keys * kv.head_dim;
  const int64_t blocks = std::min<int64_t>((gathered + kThreads - 1) / kThreads, 1 << 16);
  // The gather writes keys with stride all_keys; RunChunk reads them with the same stride.
  GatherKeysKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      kv, in.block_table, all_keys, keys_.data());
  WINNOW_RETURN_IF_ERROR(LastLaunchStatus("GatherKeysKernel"));

  const int32_t chunk =
      ChunkRows(logits_bytes_, in.num_heads, PaddedKeys(all_keys), in.num_rows);
  WINNOW_RETURN_IF_ERROR(ReserveExactly(
      logits_, std::max<int64_t>(logits_bytes_ / static_cast<int64_t>(sizeof(float)),
                                 int64_t{in.num_heads} * chunk * PaddedKeys(all_keys))));
  WINNOW_RETURN_IF_ERROR(ReserveExactly(lse_, int64_t{in.num_heads} * chunk));
  for (int32_t first = 0; first < in.num_rows; first += chunk) {
    const int32_t rows = std::min(chunk, in.num_rows - first);
    int32_t keys = 0;
    for (int32_t r = first; r < first + rows; ++r) keys = std::max(keys, visible_of(r));
    if (keys == 0) continue;
    WINNOW_RETURN_IF_ERROR(RunChunk(in, kv.num_kv_heads, kv.head_dim, all_keys, first, rows,
                                    keys, column_sums, gemm, stager, stream));
  }
  return absl::OkStatus();
}

absl::Status TensorCoreColumnSums::RunChunk(const DeviceScoreInput<__nv_bfloat16>& in,
                                            int32_t num_kv_heads, int32_t head_dim,
                                            int32_t key_stride, int32_t first, int32_t rows,
                                            int32_t keys, float* column_sums, Gemm& gemm,
                                            PinnedStager& stager, cudaStream_t stream) {
  const int32_t heads = in.num_heads;
  const int32_t group = heads / num_kv_heads;
  const int32_t ld = PaddedKeys(keys);
  // Per query head h: x = its rows of Q (every heads-th row of head_dim values), w = its KV
  // head's keys, y = logits[h] as [rows x keys] with rows ld apart.
  std::vector<const void*> pointers(3 * static_cast<size_t>(heads));
  for (int32_t h = 0; h < heads; ++h) {
    pointers[h] = in.q + (int64_t{first} * heads + h) * head_dim;
    pointers[heads + h] = keys_.data() + int64_t{h / group} * key_stride * head_dim;
    pointers[2 * heads + h] = logits_.data() + int64_t{h} * rows * ld;
  }
  WINNOW_RETURN_IF_ERROR(stager.Upload<const void*>(pointers, pointers_, stream));
  GemmArgs args;
  args.input = GemmType::kBF16;
  args.output = GemmType::kF32;
  args.m = rows;
  args.n = keys;
  args.k = head_dim;
  args.x = pointers_.data();
  args.w = pointers_.data() + heads;
  args.y = pointers_.data() + 2 * heads;
  args.ldx = int64_t{heads} * head_dim;
  args.ldy = ld;
  args.alpha = in.scale;
  WINNOW_RETURN_IF_ERROR(gemm.RunBatched(args, heads, stream));
  const int32_t* visible = in.visible + first;
  ChunkLogNormalizersKernel<<<dim3(rows, heads), kThreads, 0, stream>>>(
      logits_.data(), rows, keys, ld, visible, in.num_slots, lse_.data());
  ChunkColumnSumsKernel<<<dim3((keys + kThreads - 1) / kThreads, heads), kThreads, 0, stream>>>(
      logits_.data(), rows, keys, ld, visible, in.num_slots, lse_.data(), column_sums);
  return LastLaunchStatus("ChunkLogNormalizersKernel/ChunkColumnSumsKernel");
}

}  // namespace winnow::kernels::cuda
