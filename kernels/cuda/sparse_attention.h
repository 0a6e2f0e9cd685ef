// Decode attention restricted to listed slots, for TokenSelect (cache/policies/tokenselect.h):
// each item is one sequence's one new token, which attends only to the slots its list names
// (the selected past tokens and its own slot), through its layer's block table. The CPU
// counterpart is kernels::PagedAttention with AttentionSequence::selected. FlashInfer's paged
// attention takes a page table per sequence, not a slot list, hence a kernel of our own:
// one block per (item, query head), float32 arithmetic with an online softmax per warp, merged
// across the block's warps; q and out are bf16 rows (the CUDA worker's activations).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_kv.h"

namespace winnow::kernels::cuda {

// Device arrays describing the items.
struct DeviceSparseDecode {
  int32_t num_items = 0;
  const int32_t* rows = nullptr;           // per item: its row in q and out
  const int32_t* table_offsets = nullptr;  // per item: where its block table starts in tables
  const int32_t* list_offsets = nullptr;   // num_items + 1: item i's slots are
                                           // lists[list_offsets[i], list_offsets[i + 1])
  const int32_t* tables = nullptr;
  const int32_t* lists = nullptr;          // layer slots, each < its sequence's slot count
};

// out[row, h] = sum over the item's listed slots j of softmax_j(scale * q[row, h] . k_j) v_j,
// query head h reading KV head h / (num_heads / num_kv_heads). Rows of q/out are num_heads x
// head_dim bf16 values. Other rows of out are left as they are.
absl::Status SparseDecodeAttention(const DevicePagedKv& kv, const DeviceSparseDecode& in,
                                   const __nv_bfloat16* q, int32_t num_heads, float scale,
                                   __nv_bfloat16* out, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
