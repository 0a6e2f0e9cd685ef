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

enum class Allocation { kGlobal, kUniform };

struct KvzipOptions {
  int32_t window = 8;
  GroupAggregation aggregation = GroupAggregation::kMax;
  Allocation allocation = Allocation::kGlobal;
  int32_t neighbours = 0;
};

absl::StatusOr<KvzipOptions> ParseKvzipOptions(const PolicyConfig& config) {
  KvzipOptions options;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("window", &options.window, 1, 1 << 16));
  WINNOW_RETURN_IF_ERROR(ReadGroupAggregation(config, "gqa", &options.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadChoice(
      "allocation", &options.allocation,
      {{"global", Allocation::kGlobal}, {"uniform", Allocation::kUniform}}));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("neighbours", &options.neighbours, 0, 64));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("kvzip"));
  return options;
}

// Per-layer slot counts (per KV head, `total` over the layers) from one ranking of every
// (layer, KV head, slot) score outside the forced window: the best of them, as many as the
// budget leaves after the windows, are the kept candidates, and a layer's count
// is its forced slots plus its share of those, averaged over its heads (heads of a layer keep
// the same count). Rounded so that the counts sum to at most `total`.
std::vector<int32_t> GlobalLayerBudgets(const std::vector<std::vector<float>>& scores,
                                        int32_t num_kv_heads, int32_t n, int32_t window,
                                        int64_t total) {
  const int32_t layers = static_cast<int32_t>(scores.size());
  const int32_t prefix = n - window;
  // total counts slots per KV head; every head ranks its own keys.
  const int64_t picks = std::max<int64_t>(0, total - int64_t{layers} * window) * num_kv_heads;
  std::vector<float> all;
  all.reserve(static_cast<size_t>(layers) * num_kv_heads * prefix);
  for (const std::vector<float>& layer : scores) {
    for (int32_t g = 0; g < num_kv_heads; ++g) {
      const auto row = layer.begin() + int64_t{g} * n;
      all.insert(all.end(), row, row + prefix);
    }
  }
  std::vector<double> targets(layers, window);
  if (picks > 0 && !all.empty()) {
    const int64_t k = std::min<int64_t>(picks, static_cast<int64_t>(all.size()));
    std::nth_element(all.begin(), all.begin() + (k - 1), all.end(), std::greater<float>());
    const float threshold = all[k - 1];
    // Candidates strictly above the threshold count in full; the ties at it share what is left
    // in proportion, so the layers' shares sum to exactly k.
    std::vector<int64_t> above(layers, 0), at(layers, 0);
    int64_t above_total = 0, at_total = 0;
    for (int32_t l = 0; l < layers; ++l) {
      for (int32_t g = 0; g < num_kv_heads; ++g) {
        const float* row = scores[l].data() + int64_t{g} * n;
        for (int32_t j = 0; j < prefix; ++j) {
          above[l] += row[j] > threshold;
          at[l] += row[j] == threshold;
        }
      }
      above_total += above[l];
      at_total += at[l];
    }
    const double tie_share =
        at_total > 0 ? static_cast<double>(k - above_total) / static_cast<double>(at_total) : 0.0;
    for (int32_t l = 0; l < layers; ++l) {
      targets[l] += (above[l] + tie_share * at[l]) / num_kv_heads;
    }
  }
  return RoundBudgets(targets, total, window, n);
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
    const std::vector<int32_t> budgets =
        options_.allocation == Allocation::kGlobal
            ? GlobalLayerBudgets(scores_, dims().num_kv_heads, n, window_, int64_t{layers} * keep_)
            : std::vector<int32_t>(layers, keep_);
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
