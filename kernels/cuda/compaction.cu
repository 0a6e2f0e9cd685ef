#include "kernels/cuda/compaction.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// Rows are moved as 16-bit words: every f16/bf16 row is a whole number of them.
using Word = uint16_t;

// Scratch layout: [kv_head][K or V][entry] rows; the offset of one, in words.
__device__ inline int64_t ScratchOffset(const DevicePagedKv& kv, int32_t kept, int32_t h,
                                        bool values, int32_t i) {
  return ((int64_t{h} * 2 + (values ? 1 : 0)) * kept + i) * kv.head_dim;
}

// grid (kept, num_kv_heads, 2): x = entry, y = KV head, z = K (0) or V (1).
__global__ void GatherKernel(DevicePagedKv kv, const int32_t* src_table, const int32_t* kept_slots,
                             int32_t kept, bool in_place, Word* scratch) {
  const int32_t i = blockIdx.x;
  const int32_t h = blockIdx.y;
  const bool values = blockIdx.z == 1;
  const int32_t slot = kept_slots[int64_t{h} * kept + i];
  if (in_place && slot == i) return;
  const Word* src = detail::KvRow<Word>(kv, src_table[slot / kv.block_size], h,
                                        slot % kv.block_size, values);
  Word* dst = scratch + ScratchOffset(kv, kept, h, values, i);
  for (int32_t c = threadIdx.x; c < kv.head_dim; c += blockDim.x) dst[c] = src[c];
}

__global__ void ScatterKernel(DevicePagedKv kv, const int32_t* dst_table,
                              const int32_t* kept_slots, int32_t kept, bool in_place,
                              const Word* scratch) {
  const int32_t i = blockIdx.x;
  const int32_t h = blockIdx.y;
  const bool values = blockIdx.z == 1;
  if (in_place && kept_slots[int64_t{h} * kept + i] == i) return;
  Word* dst = detail::KvRow<Word>(kv, dst_table[i / kv.block_size], h, i % kv.block_size, values);
  const Word* src = scratch + ScratchOffset(kv, kept, h, values, i);
  for (int32_t c = threadIdx.x; c < kv.head_dim; c += blockDim.x) dst[c] = src[c];
}

// grid (kept, num_kv_heads, 2) as GatherKernel; entry i of head h is the mean of its group.
template <typename KvT>
__global__ void MergeGatherKernel(DevicePagedKv kv, const int32_t* table, const int32_t* offsets,
                                  const int32_t* sources, int32_t kept, Word* scratch) {
  const int32_t i = blockIdx.x;
  const int32_t h = blockIdx.y;
  const bool values = blockIdx.z == 1;
  const int32_t begin = offsets[int64_t{h} * kept + i];
  const int32_t end = offsets[int64_t{h} * kept + i + 1];
  KvT* dst = reinterpret_cast<KvT*>(scratch + ScratchOffset(kv, kept, h, values, i));
  auto row = [&](int32_t k) {
    const int32_t slot = sources[k];
    return detail::KvRow<KvT>(kv, table[slot / kv.block_size], h, slot % kv.block_size, values);
  };
  if (end - begin == 1) {
    const Word* src = reinterpret_cast<const Word*>(row(begin));
    for (int32_t c = threadIdx.x; c < kv.head_dim; c += blockDim.x) {
      reinterpret_cast<Word*>(dst)[c] = src[c];
    }
    return;
  }
  const float inv = 1.0f / static_cast<float>(end - begin);
  for (int32_t c = threadIdx.x; c < kv.head_dim; c += blockDim.x) {
    float sum = 0.0f;
    for (int32_t k = begin; k < end; ++k) sum += detail::ToFloat(row(k)[c]);
    dst[c] = detail::FromFloat<KvT>(__fmul_rn(sum, inv));
  }
}

}  // namespace

int64_t CompactionScratchBytes(const DevicePagedKv& kv, int32_t kept) {
  return 2 * int64_t{kv.num_kv_heads} * kept * kv.row_bytes();
}

absl::Status CompactLayer(const DevicePagedKv& kv, const int32_t* src_table,
                          const int32_t* dst_table, const int32_t* kept_slots, int32_t kept,
                          std::byte* scratch, cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (kept <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("CompactLayer: kept is ", kept,
                                                   "; a compacted layer keeps at least one slot"));
  }
  if (src_table == nullptr || dst_table == nullptr || kept_slots == nullptr ||
      scratch == nullptr) {
    return absl::InvalidArgumentError(
        "CompactLayer: src_table, dst_table, kept_slots and scratch are required");
  }
  const bool in_place = src_table == dst_table;
  const dim3 grid(kept, kv.num_kv_heads, 2);
  Word* words = reinterpret_cast<Word*>(scratch);
  GatherKernel<<<grid, kThreads, 0, stream>>>(kv, src_table, kept_slots, kept, in_place, words);
  WINNOW_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ScatterKernel<<<grid, kThreads, 0, stream>>>(kv, dst_table, kept_slots, kept, in_place, words);
  return LastLaunchStatus("ScatterKernel");
}

absl::Status MergeLayer(const DevicePagedKv& kv, const int32_t* table, const int32_t* offsets,
                        const int32_t* sources, int32_t kept, std::byte* scratch,
                        cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (kept <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MergeLayer: kept is ", kept,
                                                   "; a compacted layer keeps at least one slot"));
  }
  if (table == nullptr || offsets == nullptr || sources == nullptr || scratch == nullptr) {
    return absl::InvalidArgumentError(
        "MergeLayer: table, offsets, sources and scratch are required");
  }
  const dim3 grid(kept, kv.num_kv_heads, 2);
  Word* words = reinterpret_cast<Word*>(scratch);
  if (kv.dtype == KvDtype::kF16) {
    MergeGatherKernel<__half><<<grid, kThreads, 0, stream>>>(kv, table, offsets, sources, kept,
                                                            words);
  } else {
    MergeGatherKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(kv, table, offsets, sources,
                                                                   kept, words);
  }
  WINNOW_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // Every entry was gathered, so none is skipped (kept_slots is not read).
  ScatterKernel<<<grid, kThreads, 0, stream>>>(kv, table, nullptr, kept, /*in_place=*/false,
                                               words);
  return LastLaunchStatus("ScatterKernel");
}

}  // namespace winnow::kernels::cuda
