// Observation-window scoring on the GPU: the CUDA counterparts of kernels/cpu/attention_scores.h
// (what the compression policies observe after prefill) and of TokenSelect's head soft vote
// (cache/policies/tokenselect.cc, TokenSelectSelector::Vote). Keys are read from the paged device
// pool (f16/bf16, kernels/cuda/paged_kv.h) through one layer's block table; arithmetic is float32
// with a softmax whose normaliser is computed online (running max and sum), so nothing beyond
// what each function returns is materialised.
//
// Q is float, __half or __nv_bfloat16 (post-RoPE query rows, as the forward produced them).
// Every pointer in DeviceScoreInput is device memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_kv.h"

namespace winnow::kernels::cuda {

// kernels::ScoreInput with device pointers.
template <typename Q>
struct DeviceScoreInput {
  const int32_t* block_table = nullptr;
  int32_t num_slots = 0;   // keys in the layer
  const Q* q = nullptr;    // num_rows x num_heads x head_dim
  int32_t num_rows = 0;
  // visible[r]: row r sees slots [0, visible[r]), 1 <= visible[r] <= num_slots (values outside
  // are clamped to that range's bounds [0, num_slots]).
  const int32_t* visible = nullptr;
  int32_t num_heads = 0;   // query head h reads KV head h / (num_heads / num_kv_heads)
  float scale = 1.0f;
  // AccumulateAttentionColumns and ColumnSumsFromLse: fold the rows by their maximum, not their
  // sum (kernels::ColumnReduce::kMax).
  bool column_max = false;
};

// probs[(h * num_rows + r) * num_slots + j] = softmax over j < visible[r] of scale * q.k_j, 0 for
// j >= visible[r]; log_normalizer (optional, num_heads x num_rows) = ln sum_j exp(scale * q.k_j).
// As kernels::AttentionProbabilities. One block per (row, head); the logits pass through `probs`
// (the output) and are normalised in place.
template <typename Q>
absl::Status AttentionProbabilities(const DevicePagedKv& kv, const DeviceScoreInput<Q>& in,
                                    float* probs, float* log_normalizer, cudaStream_t stream);

// column_sums[h * num_slots + j] += sum over rows r with j < visible[r] of probs(h, r, j)
// (with in.column_max: = max of itself and those rows' probabilities), without materialising
// probs: pass 1 computes each (head, row)'s log-normaliser online into
// log_normalizer (num_heads x num_rows floats, required: the caller's scratch), pass 2 recomputes
// the logits per (KV head, key block); each column has one writer, so no atomics. As
// kernels::AccumulateAttentionColumns.
template <typename Q>
absl::Status AccumulateAttentionColumns(const DevicePagedKv& kv, const DeviceScoreInput<Q>& in,
                                        float* column_sums, float* log_normalizer,
                                        cudaStream_t stream);

// TokenSelect's head soft vote over candidate slots [begin, end) of one layer for one query
// (num_heads x head_dim): vote[t - begin] = sum over heads h of softmax_t(scale * q_h . k_t),
// each softmax over the candidates only. Query head h scores against KV head h / group, or
// h % num_kv_heads when gqa_mod (the option of the same name). log_normalizer: num_heads floats
// of scratch. As TokenSelectSelector::Vote; the top-k over the vote stays with the caller.
template <typename Q>
absl::Status TokenSelectVote(const DevicePagedKv& kv, const int32_t* block_table, const Q* query,
                             int32_t num_heads, int32_t begin, int32_t end, float scale,
                             bool gqa_mod, float* vote, float* log_normalizer,
                             cudaStream_t stream);

// norms[g * num_slots + j] = ||v_j|| (L2, float32 arithmetic) of KV head g, over the first
// num_slots slots of one layer's block table (device pointers): kernels::ValueNorms. One warp
// per (slot, KV head).
absl::Status ValueNorms(const DevicePagedKv& kv, const int32_t* block_table, int32_t num_slots,
                        float* norms, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
