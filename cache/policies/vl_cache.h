// VL-Cache (Tu et al., "Sparsity and Modality-Aware KV Cache Compression for Vision-Language
// Model Inference Acceleration"). Once, after prefill: (1) each layer's sparsity is the share of
// causally valid post-vision attention entries below p x their row's max, averaged over query
// heads; (2) the budget is split across layers in proportion to (1 - sparsity) and clipped to
// [beta_min, beta_max] of the evictable tokens; (3) each KV head keeps its top tokens by the
// accumulated post-vision attention (column sums over the observed rows, summed over the
// group's query heads). Decisions on the brief's open points: docs/compression.md "## vl_cache".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/layer_budget_split.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

struct VlCacheOptions {
  double p = 0.01;          // ThresholdFilter: entries below p x row max count as sparse
  double beta_min = 0.01;   // per-layer budget clip, as fractions of the evictable tokens
  double beta_max = 1.0;
  double recent_frac = 0.1;  // text-only fallback: recent window = this share of a layer's budget
  int32_t window = 50;       // text-only fallback: observed rows (the paper's speed-bench tau)
  int32_t min_window = 1;    // post-vision rows are the text after the last span, clamped to
  int32_t max_window = 256;  // [min_window, max_window] (cost: heads x rows x prompt per layer)
  GroupAggregation aggregation = GroupAggregation::kSum;
  // Optional 1-D pooling of the scores (SnapKV's clustering). The paper has none (the default);
  // offered because decode-time induction needs a kept token's neighbours (see the docs).
  int32_t kernel = 1;
  Pooling pooling = Pooling::kNone;
  bool redistribute = false;  // water-fill what clipping frees (off: the paper drops it)
  bool shared_selection = false;  // one keep set per layer instead of per KV head
  BudgetBase budget_base = BudgetBase::kPrompt;  // span mode: what `budget` is a fraction of
  // Span mode: the top-k ranks text and span keys together, as the paper does (`rank=all`), or
  // only the span tokens, all other text kept (`rank=spans`).
  bool rank_text = true;
};

// Params: p, beta_min, beta_max, recent_frac, window, min_window, max_window, gqa
// (sum|mean|max), kernel, pooling (none|avg|max), redistribute (bool), selection
// (per_head|shared), budget_of (prompt|spans), rank (all|spans).
absl::StatusOr<VlCacheOptions> ParseVlCacheOptions(const PolicyConfig& config);

// Alg. 1's sparsity of one layer: per query head, the fraction of causally valid (row, key)
// entries whose probability is below p x the row's max, averaged over heads.
double VlCacheLayerSparsity(const ObservationAttention& attention, double p);

// Alg. 1's SkewedCacheBudgetAllocation: beta_l = clip((1 - sparsity_l) / Z * alpha * L,
// beta_min, beta_max) with Z = sum_l (1 - sparsity_l).
std::vector<double> VlCacheLayerFractions(std::span<const double> sparsity, double alpha,
                                          double beta_min, double beta_max);

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateVlCachePolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
