// Causal attention over a paged KV cache (CPU; any KV dtype, float32 arithmetic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// How attention probabilities are folded onto each key over a set of query rows: their sum
// (what a window of the prompt's own last rows gives SnapKV and H2O), or their maximum (KVzip's
// reconstruction scoring: a key that one probe row needs scores what that row gives it, however
// many other rows ignore it).
enum class ColumnReduce { kSum, kMax };

// A raw view of the block arena (see cache/block_pool.h for the layout): each block holds
// K[kv_head][slot][row] then V[kv_head][slot][row], a row being head_dim values stored as
// `dtype` in row_bytes bytes, then, when bias_offset > 0, Bias[kv_head][slot] floats that the
// attention adds to each logit (a merged slot's share of evicted attention mass).
struct PagedKvView {
  const std::byte* arena = nullptr;
  int64_t bytes_per_block = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  int64_t row_bytes = 0;  // KvRowBytes(dtype, head_dim)
  int64_t bias_offset = 0;  // 0: no logit bias

  // A block's logit biases for one KV head (block_size floats), or null without them.
  const float* Bias(int32_t block, int32_t kv_head) const {
    if (bias_offset == 0) return nullptr;
    return reinterpret_cast<const float*>(arena + block * bytes_per_block + bias_offset) +
           int64_t{kv_head} * block_size;
  }
  // Adds slots [lo, hi) of a head block's biases (lo, hi within the block) to logits[0, hi-lo).
  void AddBias(int32_t block, int32_t kv_head, int32_t lo, int32_t hi, float* logits) const {
    const float* bias = Bias(block, kv_head);
    if (bias == nullptr) return;
    for (int32_t j = lo; j < hi; ++j) logits[j - lo] += bias[j];
  }

  const std::byte* Keys(int32_t block, int32_t kv_head) const {
    return arena + block * bytes_per_block + int64_t{kv_head} * block_size * row_bytes;
  }
  const std::byte* Values(int32_t block, int32_t kv_head) const {
    return Keys(block, kv_head) + int64_t{num_kv_heads} * block_size * row_bytes;
  }
  // The first `rows` rows of a head block (Keys or Values) as float32: the arena itself for
  // f32 (no copy, so the f32 path reads exactly what it always did), else decoded into
  // `scratch` (rows x head_dim floats).
  const float* Rows(const std::byte* head_block, int32_t rows, float* scratch) const {
    if (dtype == KvDtype::kF32) return reinterpret_cast<const float*>(head_block);
    DecodeKv(dtype, head_block, int64_t{rows} * head_dim, scratch);
    return scratch;
  }
  // Row `slot` (within its block) of a head block as float32, like Rows.
  const float* Row(const std::byte* head_block, int32_t slot, float* scratch) const {
    return Rows(head_block + slot * row_bytes, 1, scratch);
  }
};

// One sequence's part of a batched attention call. Its new tokens' K/V are already in the
// cache, as the last `num_new` of its `num_slots` slots; new token i sees slots
// [0, num_slots - num_new + i], or with a `window` only the last `window` of those.
struct AttentionSequence {
  const int32_t* block_table = nullptr;
  int32_t num_slots = 0;
  int32_t num_new = 0;
  int32_t first_row = 0;  // row of its first new token in q/out
  // Optional sparse attention (decode-time selection): when `selected` is set, the new tokens
  // attend only to the num_selected past slots it lists (ascending, < num_slots - num_new) plus,
  // causally, the new tokens themselves; a window drops those before it.
  const int32_t* selected = nullptr;
  int32_t num_selected = 0;
  // Optional: receives the attention probabilities, probs[(i * num_heads + h) * num_slots + j]
  // for new token i, query head h, slot j (0 where not attended). The caller zero-fills it.
  float* probs = nullptr;
  // Sliding-window attention when > 0: new token i sees slots [last - window + 1, last], last
  // being its own slot (transformers' kv_idx > q_idx - sliding_window, in slots).
  int32_t window = 0;
  // Optional: the attention probabilities of new tokens [fold_from, num_new) folded onto each
  // slot per query head, column_fold[h * num_slots + j] = their sum (or maximum: fold_reduce)
  // on slot j, 0 where none of them sees it; overwritten, so the caller need not clear it.
  // What the scoring kernels' AccumulateAttentionColumns computes for the same rows, from the
  // probabilities this attention computes anyway instead of two more passes over the keys. The
  // sum's order is fixed by the sequence alone (its token tiles summed in kFoldStripes
  // interleaved stripes, then the stripes in order), so neither the thread count nor the rest
  // of the batch changes it. Memory: kFoldStripes x num_heads x num_slots floats, transient.
  float* column_fold = nullptr;
  int32_t fold_from = 0;
  ColumnReduce fold_reduce = ColumnReduce::kSum;
};

// Stripes of a sequence's column fold (AttentionSequence::column_fold): also how many of its
// token tiles per KV head can run at once while it folds.
inline constexpr int32_t kFoldStripes = 16;

// q and out: rows x num_heads x head_dim. Query head h reads KV head h / (num_heads /
// num_kv_heads) (grouped-query attention). Each (token, KV head) is computed the same way
// whatever else is in the batch, so results do not depend on batch composition or chunking.
void PagedAttention(const PagedKvView& kv, std::span<const AttentionSequence> sequences,
                    const float* q, int32_t num_heads, float scale, float* out,
                    ThreadPool& pool);

}  // namespace winnow::kernels
