#include "cache/policies/kvzip.h"

#include <algorithm>
#include <functional>
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
    std::vector<int32_t> budgets(layers, keep_);
    if (options_.allocation == Allocation::kGlobal) {
      budgets = GlobalLayerBudgets(scores_, dims().num_kv_heads, n, window_, total);
    } else if (options_.allocation == Allocation::kNeediest) {
      budgets = NeediestLayerBudgets(scores_, dims().num_kv_heads, n, window_, total);
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
