// Causal attention over a paged KV cache (float32, CPU).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// A raw view of the block arena (see cache/block_pool.h for the layout): each block holds
// K[kv_head][slot][head_dim] then V[kv_head][slot][head_dim].
struct PagedKvView {
  const float* arena = nullptr;
  int64_t floats_per_block = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;

  const float* Keys(int32_t block, int32_t kv_head) const {
    return arena + block * floats_per_block + int64_t{kv_head} * block_size * head_dim;
  }
  const float* Values(int32_t block, int32_t kv_head) const {
    return Keys(block, kv_head) + int64_t{num_kv_heads} * block_size * head_dim;
  }
};

// One sequence's part of a batched attention call. Its new tokens' K/V are already in the
// cache, as the last `num_new` of its `num_slots` slots; new token i sees slots
// [0, num_slots - num_new + i].
struct AttentionSequence {
  const int32_t* block_table = nullptr;
  int32_t num_slots = 0;
  int32_t num_new = 0;
  int32_t first_row = 0;  // row of its first new token in q/out
  // Optional sparse attention (decode-time selection): when `selected` is set, the new tokens
  // attend only to the num_selected past slots it lists (ascending, < num_slots - num_new) plus,
  // causally, the new tokens themselves.
  const int32_t* selected = nullptr;
  int32_t num_selected = 0;
  // Optional: receives the attention probabilities, probs[(i * num_heads + h) * num_slots + j]
  // for new token i, query head h, slot j (0 where not attended). The caller zero-fills it.
  float* probs = nullptr;
};

// q and out: rows x num_heads x head_dim. Query head h reads KV head h / (num_heads /
// num_kv_heads) (grouped-query attention). Each (token, KV head) is computed the same way
// whatever else is in the batch, so results do not depend on batch composition or chunking.
void PagedAttention(const PagedKvView& kv, std::span<const AttentionSequence> sequences,
                    const float* q, int32_t num_heads, float scale, float* out,
                    ThreadPool& pool);

}  // namespace winnow::kernels
