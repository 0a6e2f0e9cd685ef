#include "cache/policies/vl_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/layer_budget_split.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace winnow::cache::policies {
namespace {

class VlCachePolicy : public SplitBudgetPolicy {
 public:
  VlCachePolicy(const PolicyConfig& config, const PolicyContext& context,
                const VlCacheOptions& options)
      : SplitBudgetPolicy(config, context, /*min_text=*/0), options_(options) {
    window_ = ObservationWindow(context.layout, options.window, options.min_window,
                                options.max_window);
    // The text-only fallback keeps a per-layer recent window sized from that layer's budget,
    // so the observed rows themselves stay candidates there.
    split_ = context.layout.HasCompressibleSpans() && options.rank_text
                 ? SplitBeforeWindow(context.layout, window_)
                 : SplitEvictable(context.layout, window_, /*window_evictable=*/true);
    const int32_t layers = context.dims.num_layers;
    const int64_t base = static_cast<int64_t>(split_.evictable.size());
    if (split_.span_mode) {
      cap_ = SpanModeCap(config.budget(), options.budget_base, layers, context.layout.num_tokens,
                         split_);
      // Alg. 1's α is a fraction of the tokens it ranks: the span tokens here.
      alpha_ = base > 0 ? static_cast<double>(cap_) / (static_cast<double>(layers) * base) : 1.0;
    } else {
      // Every token is evictable, but a layer must keep at least one.
      cap_ = std::max<int64_t>(
          static_cast<int64_t>(std::floor(config.budget() * layers * base + 1e-6)), layers);
      alpha_ = config.budget();
    }
    sparsity_.assign(layers, 0.0);
  }

  std::string name() const override { return "vl_cache"; }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(BeginObservation(attention, /*rows=*/-1));
    sparsity_[attention.layer] = VlCacheLayerSparsity(attention, options_.p);
    const int32_t n = attention.num_slots;
    // Accumulated post-vision attention: the column sums over the observed rows (a sum, as in
    // the paper's §3.2; keys in the rows' own range are kept anyway in span mode).
    const std::vector<float> per_head =
        SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false);
    std::vector<float> per_kv = AggregateGroups(per_head, attention.num_heads,
                                                attention.num_kv_heads, n, options_.aggregation);
    if (options_.pooling != Pooling::kNone && options_.kernel > 1) {
      per_kv = PoolRowPrefixes(per_kv, attention.num_kv_heads, n, n, options_.kernel,
                               options_.pooling);
    }
    scores_[attention.layer] = options_.shared_selection
                                   ? MeanOverHeads(per_kv, attention.num_kv_heads, n)
                                   : std::move(per_kv);
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t layers = dims().num_layers;
    const int32_t n = layout().num_tokens;
    const int32_t base = static_cast<int32_t>(split_.evictable.size());
    if (base == 0) return KeepPlan{};
    WINNOW_RETURN_IF_ERROR(CheckEveryLayerObserved(name(), observed_));
    const double alpha = alpha_;
    std::vector<double> targets;
    if (options_.redistribute) {
      std::vector<double> density(layers);
      for (int32_t l = 0; l < layers; ++l) density[l] = 1.0 - sparsity_[l];
      targets = WaterFill(density, alpha * layers * base, options_.beta_min * base,
                          options_.beta_max * base);
    } else {
      targets = VlCacheLayerFractions(sparsity_, alpha, options_.beta_min, options_.beta_max);
      for (double& t : targets) t *= base;
    }
    budgets_ = RoundBudgets(targets, cap_, split_.span_mode ? 0 : 1, base);
    spdlog::debug("vl_cache: {} post-vision rows; sparsity per layer [{:.3f}]; kept per layer "
                  "[{}] of {} evictable",
                  window_.size(), fmt::join(sparsity_, ", "), fmt::join(budgets_, ", "), base);

    const int32_t kv_heads = dims().num_kv_heads;
    return PlanPerLayer(scores_, [&](int32_t l, std::span<const float> scores)
                                     -> std::optional<LayerKeep> {
      const int32_t k = budgets_[l];
      if (k >= base) return std::nullopt;  // the layer keeps every token
      if (split_.span_mode) {
        return SelectTopK(options_.shared_selection, scores, kv_heads, n, split_.always_kept,
                          static_cast<int32_t>(split_.always_kept.size()) + k);
      }
      // The paper's recent window: 10% of the layer's budget, part of it.
      const int32_t r = std::min(k, static_cast<int32_t>(std::ceil(options_.recent_frac * k)));
      std::vector<int32_t> recent(r);
      std::iota(recent.begin(), recent.end(), n - r);
      return SelectTopK(options_.shared_selection, scores, kv_heads, n, recent, k);
    });
  }


 private:
  VlCacheOptions options_;
  double alpha_ = 1.0;            // cap_ as a fraction of the evictable tokens
  std::vector<double> sparsity_;  // [layer]
};

}  // namespace

absl::StatusOr<VlCacheOptions> ParseVlCacheOptions(const PolicyConfig& config) {
  VlCacheOptions o;
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("p", &o.p, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("beta_min", &o.beta_min, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("beta_max", &o.beta_max, o.beta_min, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("recent_frac", &o.recent_frac, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(ReadWindowParams(config, &o.window, &o.min_window, &o.max_window));
  WINNOW_RETURN_IF_ERROR(ReadPoolingParams(config, &o.kernel, &o.pooling, &o.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("redistribute", &o.redistribute));
  WINNOW_RETURN_IF_ERROR(ReadSelection(config, &o.shared_selection));
  WINNOW_RETURN_IF_ERROR(ReadBudgetBase(config, &o.budget_base));
  WINNOW_RETURN_IF_ERROR(
      config.ReadChoice<bool>("rank", &o.rank_text, {{"all", true}, {"spans", false}}));
  return o;
}

double VlCacheLayerSparsity(const ObservationAttention& attention, double p) {
  const int32_t n = attention.num_slots;
  if (attention.num_heads <= 0) return 0.0;
  double sum = 0.0;
  for (int32_t h = 0; h < attention.num_heads; ++h) {
    int64_t below = 0;
    int64_t valid = 0;
    for (int32_t r = 0; r < attention.num_rows; ++r) {
      std::span<const float> row = attention.Row(h, r);
      // Masked (future) keys count in neither the numerator nor the denominator.
      const int32_t visible = std::clamp(attention.row_positions[r] + 1, 0, n);
      if (visible == 0) continue;
      const float row_max = *std::max_element(row.begin(), row.begin() + visible);
      // p x max on probabilities equals the paper's logit test s - max s < ln p.
      const float threshold = static_cast<float>(p) * row_max;
      for (int32_t j = 0; j < visible; ++j) below += row[j] < threshold;
      valid += visible;
    }
    if (valid > 0) sum += static_cast<double>(below) / static_cast<double>(valid);
  }
  return sum / attention.num_heads;
}

std::vector<double> VlCacheLayerFractions(std::span<const double> sparsity, double alpha,
                                          double beta_min, double beta_max) {
  const size_t layers = sparsity.size();
  std::vector<double> out(layers, alpha);
  double z = 0.0;
  for (double g : sparsity) z += 1.0 - g;
  // Every row keeps its argmax, so 1 - sparsity > 0 in practice; guard the degenerate case
  // (all layers fully sparse) with the uniform split.
  for (size_t l = 0; l < layers; ++l) {
    const double raw = z > 0.0 ? (1.0 - sparsity[l]) / z * alpha * layers : alpha;
    out[l] = std::clamp(raw, beta_min, beta_max);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateVlCachePolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const VlCacheOptions options, ParseVlCacheOptions(config));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("vl_cache"));
  return std::make_unique<VlCachePolicy>(config, context, options);
}

}  // namespace winnow::cache::policies
