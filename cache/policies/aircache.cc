#include "cache/policies/aircache.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/layer_budget_split.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace winnow::cache::policies {
namespace {

class AirCachePolicy : public SplitBudgetPolicy {
 public:
  AirCachePolicy(const PolicyConfig& config, const PolicyContext& context,
                 const AirCacheOptions& options)
      : SplitBudgetPolicy(config, context, /*min_text=*/1), options_(options) {
    const int32_t n = context.layout.num_tokens;
    const int32_t layers = context.dims.num_layers;
    const bool span_mode = context.layout.HasCompressibleSpans();
    // Without spans the budget is a fraction of the whole prompt, window included, so the
    // window may not exceed it (tiny prompts).
    const int32_t fallback_window =
        span_mode ? options.window : std::min(options.window, KeepCount(config.budget(), n));
    window_ = ObservationWindow(context.layout, fallback_window, options.min_window,
                                options.max_window);
    split_ = SplitEvictable(context.layout, window_, /*window_evictable=*/false);
    const int64_t base = static_cast<int64_t>(split_.evictable.size());
    if (span_mode) {
      cap_ = SpanModeCap(config.budget(), options.budget_base, layers, n, split_);
    } else {
      cap_ = int64_t{layers} * (KeepCount(config.budget(), n) - window_.size());
    }
    cap_ = std::clamp<int64_t>(cap_, 0, int64_t{layers} * base);
    strength_.assign(layers, 0.0);
    skewness_.assign(layers, 0.0);
    elite_mean_.assign(layers, 0.0f);
  }

  std::string name() const override { return "aircache"; }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(BeginObservation(attention, window_.size()));
    const std::span<const int32_t> visual = split_.evictable;
    const int32_t v = static_cast<int32_t>(visual.size());
    if (v == 0) {
      strength_[attention.layer] = 0.0;
      return absl::OkStatus();
    }
    int64_t elite_rows = 0;
    const std::vector<float> importance =
        AirCacheImportance(attention, visual, options_.alpha, &elite_rows);
    elite_mean_[attention.layer] = static_cast<float>(elite_rows) / attention.num_heads;
    // Strength and skewness are layer-wise [paper]: computed on the mean over all query heads.
    const std::vector<float> layer_importance =
        MeanOverHeads(importance, attention.num_heads, v);
    double strength = 0.0;
    for (float x : layer_importance) strength += x;
    strength_[attention.layer] = strength;
    skewness_[attention.layer] = AirCacheSkewness(layer_importance);

    // Selection scores laid out over all slots (non-visual slots are forced anyway).
    const int32_t n = attention.num_slots;
    const std::vector<float> grouped =
        options_.shared_selection
            ? layer_importance
            : AggregateGroups(importance, attention.num_heads, attention.num_kv_heads, v,
                              options_.aggregation);
    const int32_t rows = options_.shared_selection ? 1 : attention.num_kv_heads;
    std::vector<float>& scores = scores_[attention.layer];
    scores.assign(static_cast<size_t>(rows) * n, 0.0f);
    for (int32_t g = 0; g < rows; ++g) {
      for (int32_t i = 0; i < v; ++i) {
        scores[int64_t{g} * n + visual[i]] = grouped[int64_t{g} * v + i];
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t layers = dims().num_layers;
    const int32_t n = layout().num_tokens;
    const int32_t base = static_cast<int32_t>(split_.evictable.size());
    if (base == 0 || cap_ >= int64_t{layers} * base) return KeepPlan{};
    WINNOW_RETURN_IF_ERROR(CheckEveryLayerObserved(name(), observed_));
    const std::vector<double> weights =
        AirCacheLayerWeights(strength_, skewness_, options_.allocation);
    // A floor the budget cannot pay for is lowered rather than breaking the budget.
    const int32_t lo = static_cast<int32_t>(
        std::min<int64_t>(std::min(options_.min_keep, base), cap_ / layers));
    const std::vector<double> targets =
        WaterFill(weights, static_cast<double>(cap_), static_cast<double>(lo), base);
    budgets_ = RoundBudgets(targets, cap_, lo, base);
    spdlog::debug("aircache: {} text rows; elite rows per layer (mean over heads) [{:.1f}]; "
                  "visual kept per layer [{}] of {}",
                  window_.size(), fmt::join(elite_mean_, ", "), fmt::join(budgets_, ", "), base);

    const int32_t kv_heads = dims().num_kv_heads;
    const int32_t forced = static_cast<int32_t>(split_.always_kept.size());
    return PlanPerLayer(scores_, [&](int32_t l, std::span<const float> scores)
                                     -> std::optional<LayerKeep> {
      if (budgets_[l] >= base) return std::nullopt;
      return SelectTopK(options_.shared_selection, scores, kv_heads, n, split_.always_kept,
                        std::max(1, forced + budgets_[l]));
    });
  }


 private:
  AirCacheOptions options_;
  std::vector<double> strength_;   // [layer]
  std::vector<double> skewness_;   // [layer]
  std::vector<float> elite_mean_;  // [layer] elite window size, mean over heads
};

}  // namespace

absl::StatusOr<AirCacheOptions> ParseAirCacheOptions(const PolicyConfig& config) {
  using Allocation = AirCacheOptions::Allocation;
  AirCacheOptions o;
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("alpha", &o.alpha, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(ReadWindowParams(config, &o.window, &o.min_window, &o.max_window));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("min_keep", &o.min_keep, 0, 1 << 20));
  WINNOW_RETURN_IF_ERROR(ReadGroupAggregation(config, "gqa", &o.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadChoice<Allocation>(
      "allocation", &o.allocation,
      {{"strength_skew", Allocation::kStrengthSkew}, {"strength", Allocation::kStrength},
       {"skew", Allocation::kSkew}, {"uniform", Allocation::kUniform}}));
  WINNOW_RETURN_IF_ERROR(ReadSelection(config, &o.shared_selection));
  WINNOW_RETURN_IF_ERROR(ReadBudgetBase(config, &o.budget_base));
  return o;
}

std::vector<float> AirCacheImportance(const ObservationAttention& attention,
                                      std::span<const int32_t> visual, double alpha,
                                      int64_t* elite_rows) {
  const int32_t v = static_cast<int32_t>(visual.size());
  const int32_t rows = attention.num_rows;
  std::vector<float> out(static_cast<size_t>(attention.num_heads) * v, 0.0f);
  if (rows == 0 || v == 0) return out;
  std::vector<int32_t> elite;
  elite.reserve(rows);
  for (int32_t h = 0; h < attention.num_heads; ++h) {
    // Eqs. 4-5: the last prompt token's softmax over the text keys only. Renormalising the
    // observed probabilities over that subset leaves their ratios unchanged, so the elite test
    // p_j >= alpha * max p needs no renormalisation at all.
    std::span<const float> last = attention.Row(h, rows - 1);
    float best = 0.0f;
    for (int32_t r = 0; r < rows; ++r) best = std::max(best, last[attention.row_positions[r]]);
    elite.clear();
    for (int32_t r = 0; r < rows; ++r) {
      if (best > 0.0f && last[attention.row_positions[r]] >= alpha * best) elite.push_back(r);
    }
    if (elite.empty()) elite.push_back(rows - 1);  // everything underflowed: the last row alone
    if (elite_rows != nullptr) *elite_rows += static_cast<int64_t>(elite.size());
    // Eqs. 6-8: each elite row's softmax over visual + elite keys (the causal mask already
    // zeroes later elite keys), averaged over the elite rows.
    float* dst = out.data() + int64_t{h} * v;
    int32_t used = 0;
    for (int32_t e : elite) {
      std::span<const float> row = attention.Row(h, e);
      double denom = 0.0;
      for (int32_t i = 0; i < v; ++i) denom += row[visual[i]];
      for (int32_t e2 : elite) denom += row[attention.row_positions[e2]];
      if (denom <= 0.0) continue;
      const float inv = static_cast<float>(1.0 / denom);
      for (int32_t i = 0; i < v; ++i) dst[i] += row[visual[i]] * inv;
      ++used;
    }
    if (used > 1) {
      const float inv = 1.0f / static_cast<float>(used);
      for (int32_t i = 0; i < v; ++i) dst[i] *= inv;
    }
  }
  return out;
}

double AirCacheSkewness(std::span<const float> values) {
  const size_t count = values.size();
  if (count < 3) return 0.0;
  double mean = 0.0;
  for (float x : values) mean += x;
  mean /= static_cast<double>(count);
  double m2 = 0.0;
  double m3 = 0.0;
  for (float x : values) {
    const double d = x - mean;
    m2 += d * d;
    m3 += d * d * d;
  }
  const double sd = std::sqrt(m2 / static_cast<double>(count - 1));
  // A flat layer (all equal) has no skew; tiny spreads are float noise, not a head effect.
  if (!(sd > 1e-12 * std::max(1.0, std::abs(mean)))) return 0.0;
  const double n = static_cast<double>(count);
  return n / ((n - 1.0) * (n - 2.0)) * (m3 / (sd * sd * sd));
}

std::vector<double> AirCacheLayerWeights(std::span<const double> strength,
                                         std::span<const double> skewness,
                                         AirCacheOptions::Allocation allocation) {
  const size_t layers = strength.size();
  auto normalise = [layers](std::span<const double> raw) {
    std::vector<double> out(layers, 1.0);
    double sum = 0.0;
    for (double x : raw) sum += std::max(x, 0.0);
    if (sum <= 0.0) return out;
    for (size_t l = 0; l < layers; ++l) out[l] = layers * std::max(raw[l], 0.0) / sum;
    return out;
  };
  const std::vector<double> s = normalise(strength);
  const std::vector<double> k = normalise(skewness);
  std::vector<double> out(layers, 1.0);
  for (size_t l = 0; l < layers; ++l) {
    switch (allocation) {
      case AirCacheOptions::Allocation::kStrengthSkew:
        out[l] = 0.5 * (s[l] + k[l]);
        break;
      case AirCacheOptions::Allocation::kStrength:
        out[l] = s[l];
        break;
      case AirCacheOptions::Allocation::kSkew:
        out[l] = k[l];
        break;
      case AirCacheOptions::Allocation::kUniform:
        break;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateAirCachePolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const AirCacheOptions options, ParseAirCacheOptions(config));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("aircache"));
  return std::make_unique<AirCachePolicy>(config, context, options);
}

}  // namespace winnow::cache::policies
