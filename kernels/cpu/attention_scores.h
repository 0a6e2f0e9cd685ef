// Attention-probability extraction for KV-compression policies: the softmax of a few captured
// query rows against one sequence's paged keys in one layer, without running (or storing) the
// whole prompt's attention. Keys of any KV dtype, float32 arithmetic, CPU, threaded; results do
// not depend on the thread count.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// One sequence's keys in one layer and the query rows to score against them.
struct ScoreInput {
  const int32_t* block_table = nullptr;
  int32_t num_slots = 0;      // keys in the layer
  const float* q = nullptr;   // num_rows x num_heads x head_dim (post-RoPE, like the keys)
  int32_t num_rows = 0;
  // visible[r]: row r sees slots [0, visible[r]) (causal limit), 1 <= visible[r] <= num_slots.
  const int32_t* visible = nullptr;
  int32_t num_heads = 0;      // query head h reads KV head h / (num_heads / num_kv_heads)
  float scale = 1.0f;         // 1/sqrt(head_dim) for the model's own attention
  ColumnReduce reduce = ColumnReduce::kSum;  // AccumulateAttentionColumns only
};

// probs[(h * num_rows + r) * num_slots + j] = softmax over j < visible[r] of scale * q.k_j, and
// 0 for j >= visible[r]. log_normalizer (optional, num_heads x num_rows) receives ln sum_j
// exp(scale * q.k_j) so that logit = ln(prob) + log_normalizer. Memory: the caller's buffers,
// num_heads x num_rows x num_slots floats.
void AttentionProbabilities(const PagedKvView& kv, const ScoreInput& in, float* probs,
                            float* log_normalizer, ThreadPool& pool);

// column_sums[h * num_slots + j] += sum over rows r with j < visible[r] of probs(h, r, j)
// (with in.reduce kMax: column_sums[...] = max(column_sums[...], max over those rows), the
// buffer holding maxima, or zeros, already), without materialising probs: pass 1 computes each
// row's log-normaliser, pass 2 recomputes the logits per key block (threads own disjoint key
// ranges, so no atomics and a fixed summation order). Costs two QK passes over the visible
// keys; a CPU attention that computes the same rows can fold them itself for free
// (AttentionSequence::column_fold).
void AccumulateAttentionColumns(const PagedKvView& kv, const ScoreInput& in,
                                float* column_sums, ThreadPool& pool);

// norms[g * num_slots + j] = ||v_j|| (L2, float32 arithmetic) of KV head g, for the first
// num_slots slots of one sequence's layer (value-weighted token importance).
void ValueNorms(const PagedKvView& kv, const int32_t* block_table, int32_t num_slots,
                float* norms);

}  // namespace winnow::kernels
