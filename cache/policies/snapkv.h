// SnapKV (Li et al.): the last `window` prompt tokens observe the prompt; each key's score is the
// sum of their attention, pooled along the sequence; every KV head keeps its own top keys plus
// the window. PyramidKV (pyramidkv.h) reuses the scores with per-layer budgets.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

struct SnapKvOptions {
  int32_t window = 32;                              // observation window = kept recent window
  int32_t kernel = 5;                               // pooling kernel
  Pooling pooling = Pooling::kAvg;
  GroupAggregation aggregation = GroupAggregation::kMean;  // GQA: query heads -> KV head
};

// Params: window, kernel, pooling (none|avg|max), gqa (sum|mean|max).
absl::StatusOr<SnapKvOptions> ParseSnapKvOptions(const PolicyConfig& config);

// Per-KV-head scores of the prefix keys [0, prefix), [num_kv_heads][prefix]: the observed rows'
// probabilities summed per query head, pooled, then folded into KV heads.
std::vector<float> SnapKvScores(const ObservationAttention& attention, int32_t prefix,
                                const SnapKvOptions& options,
                                kernels::ThreadPool* threads = nullptr);

// SnapKV with every layer keeping KeepCount(budget, n) slots when `layer_budgets` is empty,
// else layer l keeping layer_budgets[l] (PyramidKV).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateSnapKvFamilyPolicy(
    const std::string& name, const PolicyConfig& config, const PolicyContext& context,
    const SnapKvOptions& options, std::vector<int32_t> layer_budgets);

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateSnapKvPolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
