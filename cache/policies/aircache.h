// AirCache (Huang et al., "Activating Inter-modal Relevancy KV Cache Compression for Efficient
// Large Vision-Language Model Inference"). Once, after prefill, per layer: the elite observation
// window is the instruction text whose attention from the last prompt token is within alpha of
// its best (Eq. 5); the elite rows' softmax restricted to visual + elite keys, averaged over the
// elite rows, is each visual token's importance (Eqs. 6-8). Layer budgets mix the normalised
// strength (total importance, Eq. 9) and skewness (Eq. 10) of that importance (Eq. 11). Only
// image / marked-context tokens are evicted. Decisions on the brief's open points:
// docs/compression.md "## aircache".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/layer_budget_split.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

struct AirCacheOptions {
  enum class Allocation { kStrengthSkew, kStrength, kSkew, kUniform };

  double alpha = 0.9;        // elite threshold relative to the best text key (Eq. 5)
  int32_t window = 32;       // text-only fallback: the last `window` tokens are the text set
  int32_t min_window = 1;    // with spans: the text after the last span, clamped to
  int32_t max_window = 256;  // [min_window, max_window] tokens
  int32_t min_keep = 1;      // floor of evictable tokens kept per layer (when the budget allows)
  GroupAggregation aggregation = GroupAggregation::kMean;
  Allocation allocation = Allocation::kStrengthSkew;  // Table 5's ablations as options
  bool shared_selection = false;  // one keep set per layer instead of per KV head
  BudgetBase budget_base = BudgetBase::kPrompt;  // span mode: what `budget` is a fraction of
};

// Params: alpha, window, min_window, max_window, min_keep, gqa (sum|mean|max),
// allocation (strength_skew|strength|skew|uniform), selection (per_head|shared),
// budget_of (prompt|spans).
absl::StatusOr<AirCacheOptions> ParseAirCacheOptions(const PolicyConfig& config);

// One layer's visual importance (Eqs. 4-8), per query head: out[h * visual.size() + i] for
// visual token visual[i]. `text` are the positions of the text set (observed rows, ascending);
// the reference row is the last observed row. Uses the observed probabilities renormalised over
// key subsets, which equals the paper's restricted softmax exactly.
// `elite_rows`, when set, receives the elite window size summed over heads (the brief asks to
// watch it: at alpha = 0.9 it often collapses to one token).
std::vector<float> AirCacheImportance(const ObservationAttention& attention,
                                      std::span<const int32_t> visual, double alpha,
                                      int64_t* elite_rows = nullptr);

// Eq. 10: adjusted Fisher-Pearson skewness (sample std, ddof = 1); 0 when fewer than 3 values
// or no spread.
double AirCacheSkewness(std::span<const float> values);

// Eq. 11 with our normalisation: per-layer targets 0.5 * (S'_l + K'_l) * mean_budget, where
// S'_l = L * S_l / sum S and K'_l = L * max(K_l, 0) / sum max(K, 0) (each averages 1 over the
// layers; an all-zero term becomes 1 everywhere).
std::vector<double> AirCacheLayerWeights(std::span<const double> strength,
                                         std::span<const double> skewness,
                                         AirCacheOptions::Allocation allocation);

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateAirCachePolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
