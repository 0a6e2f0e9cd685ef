#include "cache/host_scoring.h"

#include "kernels/cpu/token_select_vote.h"

namespace winnow::cache {

absl::Status HostScoring::AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                                 float* log_normalizer) {
  kernels::AttentionProbabilities(pool_.View(), in, probs, log_normalizer, threads_);
  return absl::OkStatus();
}

absl::Status HostScoring::AccumulateAttentionColumns(const kernels::ScoreInput& in,
                                                     float* column_sums,
                                                     const DeviceRows& device) {
  if (device.q != nullptr) {
    return absl::InternalError("host scoring was given query rows on a device");
  }
  kernels::AccumulateAttentionColumns(pool_.View(), in, column_sums, threads_);
  return absl::OkStatus();
}

absl::Status HostScoring::ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                                     float* norms) {
  kernels::ValueNorms(pool_.View(), table.data(), num_slots, norms);
  return absl::OkStatus();
}

absl::Status HostScoring::TokenSelectVote(std::span<const int32_t> table,
                                          std::span<const float> query, int32_t num_heads,
                                          int32_t begin, int32_t end, float scale, bool gqa_mod,
                                          float* vote) {
  kernels::TokenSelectVote(pool_.View(), table, query, num_heads, begin, end, scale, gqa_mod,
                           vote, &vote_logits_, &threads_);
  return absl::OkStatus();
}

}  // namespace winnow::cache
