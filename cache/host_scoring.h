// The scoring backend of K/V in a pool's host arena: kernels/cpu on the host threads.
#pragma once

#include <vector>

#include "cache/block_pool.h"
#include "cache/scoring_backend.h"

namespace winnow::cache {

class HostScoring : public ScoringBackend {
 public:
  // Both must outlive the backend.
  HostScoring(const BlockPool& pool, kernels::ThreadPool& threads)
      : pool_(pool), threads_(threads) {}

  absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                      float* log_normalizer) override;
  absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in, float* column_sums,
                                          const DeviceRows& device) override;
  absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                          float* norms) override;
  absl::Status TokenSelectVote(std::span<const int32_t> table, std::span<const float> query,
                               int32_t num_heads, int32_t begin, int32_t end, float scale,
                               bool gqa_mod, float* vote) override;
  kernels::ThreadPool& host_threads() override { return threads_; }

  const BlockPool& pool() const { return pool_; }

 private:
  const BlockPool& pool_;
  kernels::ThreadPool& threads_;
  std::vector<float> vote_logits_;  // TokenSelectVote's scratch, reused across calls
};

}  // namespace winnow::cache
