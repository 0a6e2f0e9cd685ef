#include "cache/policies/vl_cache.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "cache/policies/layer_budget_split.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace winnow::cache::policies {
namespace {

class VlCachePolicy : public CompressionPolicy {
 public:
  VlCachePolicy(const PolicyConfig& config, const PolicyContext& context,
                const VlCacheOptions& options)
      : CompressionPolicy(config, context), options_(options) {
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
    sparsity_.assign(layers, -1.0);
    scores_.resize(layers);
  }

  std::string name() const override { return "vl_cache"; }

  ObservationRequest Observation() const override {
    return ObservationRequest{window_.begin, false};
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    if (attention.layer < 0 || attention.layer >= dims().num_layers ||
        attention.num_slots != layout().num_tokens) {
      return absl::InternalError(absl::StrCat("vl_cache: unexpected observation of layer ",
                                              attention.layer, " with ", attention.num_slots,
                                              " slots"));
    }
    sparsity_[attention.layer] = VlCacheLayerSparsity(attention, options_.p);
    const int32_t n = attention.num_slots;
    // Accumulated post-vision attention: the column sums over the observed rows (a sum, as in
    // the paper's §3.2; keys in the rows' own range are kept anyway in span mode).
    const std::vector<float> per_head =
        SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false);
    std::vector<float> per_kv = AggregateGroups(per_head, attention.num_heads,
                                                attention.num_kv_heads, n, options_.aggregation);
    if (options_.pooling != Pooling::kNone && options_.kernel > 1) {
      for (int32_t g = 0; g < attention.num_kv_heads; ++g) {
        std::span<float> row = std::span<float>(per_kv).subspan(int64_t{g} * n, n);
        const std::vector<float> pooled = Pool1d(row, options_.kernel, options_.pooling);
        std::copy(pooled.begin(), pooled.end(), row.begin());
      }
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
    KeepPlan plan;
    if (base == 0) return plan;
    for (int32_t l = 0; l < layers; ++l) {
      if (sparsity_[l] < 0.0) {
        return absl::FailedPreconditionError(
            absl::StrCat("vl_cache: layer ", l, " was never observed"));
      }
    }
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

    plan.layers.resize(layers);
    const int32_t kv_heads = dims().num_kv_heads;
    std::vector<int32_t> recent;
    for (int32_t l = 0; l < layers; ++l) {
      const int32_t k = budgets_[l];
      if (k >= base) continue;  // the layer keeps every token
      std::span<const int32_t> forced = split_.always_kept;
      int32_t total = static_cast<int32_t>(forced.size()) + k;
      if (!split_.span_mode) {
        // The paper's recent window: 10% of the layer's budget, part of it.
        const int32_t r = std::min(k, static_cast<int32_t>(std::ceil(options_.recent_frac * k)));
        recent.clear();
        for (int32_t p = n - r; p < n; ++p) recent.push_back(p);
        forced = recent;
        total = k;
      }
      plan.layers[l] = options_.shared_selection
                           ? SharedTopK(scores_[l], kv_heads, n, forced, total)
                           : PerHeadTopK(scores_[l], kv_heads, n, forced, total);
      std::vector<float>().swap(scores_[l]);  // done with this layer's scores
    }
    if (plan.empty()) plan.layers.clear();
    return plan;
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    const int64_t layers = dims().num_layers;
    const int64_t kept_text = std::max<int64_t>(
        0, prompt_tokens - static_cast<int64_t>(split_.evictable.size()));
    return layers * kept_text + cap_ + layers * generated;
  }

 private:
  VlCacheOptions options_;
  WindowRange window_;
  EvictableSplit split_;
  int64_t cap_ = 0;                          // evictable tokens kept, summed over layers
  double alpha_ = 1.0;                       // cap_ as a fraction of the evictable tokens
  std::vector<double> sparsity_;             // [layer]; -1 until observed
  std::vector<std::vector<float>> scores_;   // [layer][kv_head or 1][slot]
  std::vector<int32_t> budgets_;             // [layer] evictable tokens kept
};

}  // namespace

absl::StatusOr<VlCacheOptions> ParseVlCacheOptions(const PolicyConfig& config) {
  VlCacheOptions o;
  absl::StatusOr<double> p = config.GetDouble("p", o.p, 0.0, 1.0);
  if (!p.ok()) return p.status();
  absl::StatusOr<double> beta_min = config.GetDouble("beta_min", o.beta_min, 0.0, 1.0);
  if (!beta_min.ok()) return beta_min.status();
  absl::StatusOr<double> beta_max = config.GetDouble("beta_max", o.beta_max, *beta_min, 1.0);
  if (!beta_max.ok()) return beta_max.status();
  absl::StatusOr<double> recent = config.GetDouble("recent_frac", o.recent_frac, 0.0, 1.0);
  if (!recent.ok()) return recent.status();
  absl::StatusOr<int64_t> window = config.GetInt("window", o.window, 1, 1 << 16);
  if (!window.ok()) return window.status();
  absl::StatusOr<int64_t> min_window = config.GetInt("min_window", o.min_window, 1, 1 << 16);
  if (!min_window.ok()) return min_window.status();
  absl::StatusOr<int64_t> max_window =
      config.GetInt("max_window", std::max<int64_t>(o.max_window, *min_window), *min_window,
                    1 << 16);
  if (!max_window.ok()) return max_window.status();
  absl::StatusOr<GroupAggregation> agg = GetGroupAggregation(config, "gqa", o.aggregation);
  if (!agg.ok()) return agg.status();
  absl::StatusOr<int64_t> kernel = config.GetInt("kernel", o.kernel, 1, 1 << 10);
  if (!kernel.ok()) return kernel.status();
  absl::StatusOr<Pooling> pooling = GetPooling(config, "pooling", o.pooling);
  if (!pooling.ok()) return pooling.status();
  absl::StatusOr<bool> redistribute = config.GetBool("redistribute", o.redistribute);
  if (!redistribute.ok()) return redistribute.status();
  absl::StatusOr<std::string> selection =
      config.GetEnum("selection", "per_head", {"per_head", "shared"});
  if (!selection.ok()) return selection.status();
  absl::StatusOr<BudgetBase> budget_base = GetBudgetBase(config);
  if (!budget_base.ok()) return budget_base.status();
  absl::StatusOr<std::string> rank = config.GetEnum("rank", "all", {"all", "spans"});
  if (!rank.ok()) return rank.status();
  o.p = *p;
  o.beta_min = *beta_min;
  o.beta_max = *beta_max;
  o.recent_frac = *recent;
  o.window = static_cast<int32_t>(*window);
  o.min_window = static_cast<int32_t>(*min_window);
  o.max_window = static_cast<int32_t>(*max_window);
  o.aggregation = *agg;
  o.kernel = static_cast<int32_t>(*kernel);
  o.pooling = *pooling;
  o.redistribute = *redistribute;
  o.shared_selection = *selection == "shared";
  o.budget_base = *budget_base;
  o.rank_text = *rank == "all";
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
  absl::StatusOr<VlCacheOptions> options = ParseVlCacheOptions(config);
  if (!options.ok()) return options.status();
  if (absl::Status s = config.CheckAllUsed("vl_cache"); !s.ok()) return s;
  return std::make_unique<VlCachePolicy>(config, context, *options);
}

}  // namespace winnow::cache::policies
