// TokenSelect's head soft vote on the host (its GPU twin: kernels/cuda/scoring.h,
// TokenSelectVote). Over the candidate slots [begin, end) of one layer (`table`, the layer's
// block table in `kv`) for one query (num_heads x head_dim floats):
//   vote[t - begin] = sum over query heads h of softmax_t(scale * q_h . k_t),
// each softmax over the candidates only. Query head h reads KV head h / group (the model's
// pairing), or h % num_kv_heads with `gqa_mod` (the reference code's, an option).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// `logits`: scratch, grown to num_heads x (end - begin) floats and reused across calls. The
// candidates are split into fixed chunks spread over `threads` (null: the calling thread);
// every reduction runs in chunk order, so the vote does not depend on the thread count.
void TokenSelectVote(const PagedKvView& kv, std::span<const int32_t> table,
                     std::span<const float> query, int32_t num_heads, int32_t begin, int32_t end,
                     float scale, bool gqa_mod, float* vote, std::vector<float>* logits,
                     ThreadPool* threads);

}  // namespace winnow::kernels
