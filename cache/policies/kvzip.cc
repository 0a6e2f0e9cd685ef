#include "cache/policies/kvzip.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/layer_budget_split.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {
namespace {

enum class Allocation { kGlobal, kNeediest, kUniform };

struct KvzipOptions {
  int32_t window = 8;
  GroupAggregation aggregation = GroupAggregation::kMax;
  Allocation allocation = Allocation::kNeediest;
  int32_t neighbours = 0;
  // Experimental, off by default: the radius of a second ranking, the maxima divided by their
  // local mean (DivideByLocalMean), hedged with the first (HedgeRankings). On the default model
  // the repeat's maxima rise along the document and the two rankings keep different ends of it
  // (docs/compression.md, "kvzip").
  int32_t hedge = 0;
};

absl::StatusOr<KvzipOptions> ParseKvzipOptions(const PolicyConfig& config) {
  KvzipOptions options;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("window", &options.window, 1, 1 << 16));
  WINNOW_RETURN_IF_ERROR(ReadGroupAggregation(config, "gqa", &options.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadChoice(
      "allocation", &options.allocation,
      {{"global", Allocation::kGlobal},
       {"neediest", Allocation::kNeediest},
       {"uniform", Allocation::kUniform}}));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("neighbours", &options.neighbours, 0, 64));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("hedge", &options.hedge, 0, 1 << 16));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("kvzip"));
  return options;
}

// Each layer's KV heads' scores outside the window (the last `window` slots), head after head:
// [layer] num_kv_heads x (n - window).
std::vector<std::vector<float>> CandidateScores(const std::vector<std::vector<float>>& scores,
                                                int32_t num_kv_heads, int32_t n,
                                                int32_t window) {
  std::vector<std::vector<float>> candidates(scores.size());
  for (size_t l = 0; l < scores.size(); ++l) {
    for (int32_t g = 0; g < num_kv_heads; ++g) {
      const auto row = scores[l].begin() + int64_t{g} * n;
      candidates[l].insert(candidates[l].end(), row, row + (n - window));
    }
  }
  return candidates;
}

// Counts per KV head from per-layer shares of the candidates: the window plus the share,
// rounded, summing to at most `total` over the layers.
std::vector<int32_t> WithWindow(std::vector<double> shares, int32_t n, int32_t window,
                                int64_t total) {
  for (double& s : shares) s += window;
  return RoundBudgets(shares, total, window, n);
}

// `global`: every (layer, KV head, slot) score outside the window in one ranking, as KVzip ranks
// pairs; a layer's share is its heads' kept pairs averaged over the heads (heads of a layer
// keep the same count in the paged cache).
std::vector<int32_t> GlobalLayerBudgets(const std::vector<std::vector<float>>& scores,
                                        int32_t num_kv_heads, int32_t n, int32_t window,
                                        int64_t total) {
  const int64_t layers = static_cast<int64_t>(scores.size());
  const int64_t picks = std::max<int64_t>(0, total - layers * window) * num_kv_heads;
  return WithWindow(RankedShares(CandidateScores(scores, num_kv_heads, n, window), picks,
                                 num_kv_heads),
                    n, window, total);
}

// `neediest`: AdaKV's head-adaptive counts (NeediestHeadShares) over the candidates; the raw
// maxima are comparable across heads and layers as they are.
std::vector<int32_t> NeediestLayerBudgets(const std::vector<std::vector<float>>& scores,
                                          int32_t num_kv_heads, int32_t n, int32_t window,
                                          int64_t total) {
  const int64_t layers = static_cast<int64_t>(scores.size());
  const int64_t picks = std::max<int64_t>(0, total - layers * window);
  return WithWindow(NeediestHeadShares(CandidateScores(scores, num_kv_heads, n, window),
                                       num_kv_heads, picks),
                    n, window, total);
}

// Each KV head's keys rescored by their better rank in its two rankings, `scores` and `other`
// (1 / (1 + rank), ties to the lower slot), so that a top-k takes the two rankings' picks in
// turn.
void HedgeRankings(std::vector<float>& scores, const std::vector<float>& other,
                   int32_t num_kv_heads, int32_t n) {
  std::vector<int32_t> order(n);
  std::vector<int32_t> best(n);
  for (int32_t g = 0; g < num_kv_heads; ++g) {
    const std::span<float> row(scores.data() + int64_t{g} * n, n);
    const std::span<const float> other_row(other.data() + int64_t{g} * n, n);
    std::fill(best.begin(), best.end(), n);
    for (const std::span<const float> ranking : {std::span<const float>(row), other_row}) {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&ranking](int32_t a, int32_t b) { return ranking[a] > ranking[b]; });
      for (int32_t r = 0; r < n; ++r) best[order[r]] = std::min(best[order[r]], r);
    }
    for (int32_t j = 0; j < n; ++j) row[j] = 1.0f / (1.0f + static_cast<float>(best[j]));
  }
}

class KvzipPolicy : public CompressionPolicy {
 public:
  KvzipPolicy(const PolicyConfig& config, const PolicyContext& context,
              const KvzipOptions& options)
      : CompressionPolicy(config, context), options_(options) {
    const int32_t n = context.layout.num_tokens;
    keep_ = KeepCount(config.budget(), n);
    // The window is kept in every layer: never more of it than the budget.
    window_ = std::clamp(options_.window, 1, std::max(keep_, 1));
    scores_.resize(context.dims.num_layers);
  }

  std::string name() const override { return "kvzip"; }

  ObservationRequest Observation() const override {
    ObservationRequest request{layout().num_tokens - window_, false};
    request.row_probabilities = false;
    request.window_reduce = kernels::ColumnReduce::kMax;
    return request;
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    const int32_t n = layout().num_tokens;
    WINNOW_RETURN_IF_ERROR(CheckObservation("kvzip", attention, dims(), n, -1));
    if (attention.window_max.size() != static_cast<size_t>(attention.num_heads) * n) {
      return absl::InternalError("kvzip: the window's maxima are missing from the observation");
    }
    scores_[attention.layer] = AggregateGroups(attention.window_max, attention.num_heads,
                                               attention.num_kv_heads, n, options_.aggregation);
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t n = layout().num_tokens;
    const int32_t layers = dims().num_layers;
    for (int32_t l = 0; l < layers; ++l) {
      if (scores_[l].empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("kvzip: Plan() before layer ", l, " was observed"));
      }
    }
    if (keep_ >= n) return KeepPlan{};
    const int64_t total = int64_t{layers} * keep_;
    std::vector<int32_t> budgets = LayerBudgets(scores_, total);
    if (options_.hedge > 0) {
      // The second ranking: each head's maxima over their local mean. The layers' counts are
      // the two rankings' mean; each head's keys alternate between the two.
      std::vector<std::vector<float>> divided = scores_;
      for (std::vector<float>& layer : divided) {
        DivideByLocalMean(layer, dims().num_kv_heads, n, options_.hedge);
      }
      const std::vector<int32_t> other = LayerBudgets(divided, total);
      for (int32_t l = 0; l < layers; ++l) {
        budgets[l] = (budgets[l] + other[l]) / 2;
        HedgeRankings(scores_[l], divided[l], dims().num_kv_heads, n);
      }
    }
    budgets = SpillPastWindows(std::move(budgets), dims(), n, window_);
    const std::vector<int32_t> window = SinksAndWindow(n, 0, window_);
    return PlanPerLayer(scores_, [&](int32_t layer, std::span<const float> scores)
                                     -> std::optional<LayerKeep> {
      if (budgets[layer] >= n) return std::nullopt;
      return PerHeadTopK(scores, dims().num_kv_heads, n, window, budgets[layer], threads(),
                         options_.neighbours);
    });
  }

 private:
  // Per-layer counts for one set of scores (the `allocation`), summing to at most `total`.
  std::vector<int32_t> LayerBudgets(const std::vector<std::vector<float>>& scores,
                                    int64_t total) const {
    const int32_t n = layout().num_tokens;
    if (options_.allocation == Allocation::kGlobal) {
      return GlobalLayerBudgets(scores, dims().num_kv_heads, n, window_, total);
    }
    if (options_.allocation == Allocation::kNeediest) {
      return NeediestLayerBudgets(scores, dims().num_kv_heads, n, window_, total);
    }
    return std::vector<int32_t>(dims().num_layers, keep_);
  }

  KvzipOptions options_;
  int32_t keep_ = 1;    // mean slots per layer and KV head
  int32_t window_ = 1;  // the last prompt tokens every layer keeps
  std::vector<std::vector<float>> scores_;  // [layer] num_kv_heads x n, until the plan
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateKvzipPolicy(const PolicyConfig& config,
                                                                     const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const KvzipOptions options, ParseKvzipOptions(config));
  return std::make_unique<KvzipPolicy>(config, context, options);
}

}  // namespace winnow::cache::policies
