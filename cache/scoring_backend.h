// Where the compression hooks score the K/V: the one seam between the policies' machinery
// (cache/compression.h, the TokenSelect selector) and the device that holds the data. The host
// implementation (cache/host_scoring.h) runs kernels/cpu over the pool's arena on the host
// threads; a GPU forward implements it over its device arena (model/cuda_kv_device.h). The
// forward backend that runs the model hands its own to the worker (model/forward_backend.h),
// so the machinery never asks where the data is, and a policy that needs a new score on the
// device adds one method here and one in each implementation.
//
// Every call is ordered after the forwards that wrote the data and before the next forward;
// results written to host memory are complete when the call returns. Pointers in a ScoreInput,
// like the outputs, are host memory.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache {

class ScoringBackend {
 public:
  virtual ~ScoringBackend() = default;

  // kernels::AttentionProbabilities, kernels::AccumulateAttentionColumns (adds into
  // column_sums) and kernels::ValueNorms over the backend's copy of the data. `device_q`, when
  // not null, holds the query rows already on the device (QueryCapture::device_rows) and in.q
  // is not read; only a device backend is given one.
  virtual absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                              float* log_normalizer) = 0;
  virtual absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in,
                                                  float* column_sums, const void* device_q) = 0;
  virtual absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                                  float* norms) = 0;
  // TokenSelect's head soft vote (kernels/cpu/token_select_vote.h) over the candidate slots
  // [begin, end) of one layer (`table`) for one query (num_heads x head_dim floats):
  // vote[t - begin] = sum over heads of softmax over the candidates of scale * q_h . k_t, query
  // head h reading KV head h / group, or h % num_kv_heads with `gqa_mod`.
  virtual absl::Status TokenSelectVote(std::span<const int32_t> table,
                                       std::span<const float> query, int32_t num_heads,
                                       int32_t begin, int32_t end, float scale, bool gqa_mod,
                                       float* vote) = 0;

  // The host threads, idle while the hooks run (between forwards, or between a forward's
  // kernels for a selector), for the policies' own work on the scores: per-head pooling and
  // top-k (CompressionPolicy::threads()).
  virtual kernels::ThreadPool& host_threads() = 0;
};

}  // namespace winnow::cache
