#include "cache/policies/snapkv.h"

#include <algorithm>
#include <numeric>

#include "base/status_macros.h"
#include "cache/policies/layer_budget_split.h"

namespace winnow::cache::policies {
namespace {

class SnapKvFamilyPolicy : public CompressionPolicy {
 public:
  SnapKvFamilyPolicy(std::string name, const PolicyConfig& config, const PolicyContext& context,
                     const SnapKvOptions& options, std::vector<int32_t> layer_budgets)
      : CompressionPolicy(config, context),
        name_(std::move(name)),
        options_(options),
        budgets_(std::move(layer_budgets)) {
    const int32_t n = context.layout.num_tokens;
    if (budgets_.empty()) budgets_.assign(context.dims.num_layers, KeepCount(config.budget(), n));
    window_ = std::clamp(options_.window, 1, std::max(n, 1));
    budgets_ = SpillPastWindows(std::move(budgets_), context.dims, n, window_);
    plan_.layers.resize(context.dims.num_layers);
    device_spec_ = {window_, options_.kernel, options_.pooling, options_.aggregation, {}};
    for (int32_t b : budgets_) device_spec_.keep.push_back(std::clamp(b, 1, std::max(n, 1)));
  }

  std::string name() const override { return name_; }

  ObservationRequest Observation() const override {
    ObservationRequest request{layout().num_tokens - window_, false};
    request.row_probabilities = false;  // SnapKvScores sums every window row
    return request;
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    const int32_t n = attention.num_slots;
    const int32_t keep = std::clamp(budgets_[attention.layer], 1, n);
    if (keep >= n) return absl::OkStatus();  // this layer keeps everything
    const int32_t prefix = n - window_;
    std::vector<float> scores(static_cast<size_t>(dims().num_kv_heads) * n, 0.0f);
    const std::vector<float> prefix_scores =
        SnapKvScores(attention, prefix, options_, threads());
    // Lay the prefix scores out over all n slots; window slots are forced anyway.
    for (int32_t g = 0; g < dims().num_kv_heads; ++g) {
      std::copy_n(prefix_scores.begin() + int64_t{g} * prefix, prefix,
                  scores.begin() + int64_t{g} * n);
    }
    const std::vector<int32_t> window = SinksAndWindow(n, 0, window_);
    plan_.layers[attention.layer] =
        PerHeadTopK(scores, dims().num_kv_heads, n, window, keep, threads());
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    if (plan_.empty()) plan_.layers.clear();
    return std::move(plan_);
  }

  const WindowTopKSpec* window_top_k() const override { return &device_spec_; }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    int64_t total = 0;
    for (int32_t b : budgets_) total += std::clamp(b, 1, std::max(prompt_tokens, 1)) + generated;
    return total;
  }

 private:
  std::string name_;
  SnapKvOptions options_;
  std::vector<int32_t> budgets_;
  int32_t window_ = 1;
  WindowTopKSpec device_spec_;
  KeepPlan plan_;
};

}  // namespace

absl::StatusOr<SnapKvOptions> ParseSnapKvOptions(const PolicyConfig& config) {
  SnapKvOptions options;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("window", &options.window, 1, 1 << 16));
  WINNOW_RETURN_IF_ERROR(
      ReadPoolingParams(config, &options.kernel, &options.pooling, &options.aggregation));
  return options;
}

std::vector<float> SnapKvScores(const ObservationAttention& attention, int32_t prefix,
                                const SnapKvOptions& options, kernels::ThreadPool* threads) {
  const int32_t n = attention.num_slots;
  prefix = std::clamp(prefix, 0, n);
  // SnapKV sums the window rows' attention (not a mean) and scores only keys before the window.
  const std::vector<float> summed =
      SumObservedRows(attention, 0, attention.num_rows, false, threads);
  const std::vector<float> pooled = PoolRowPrefixes(summed, attention.num_heads, n, prefix,
                                                    options.kernel, options.pooling, threads);
  return AggregateGroups(pooled, attention.num_heads, attention.num_kv_heads, prefix,
                         options.aggregation);
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateSnapKvFamilyPolicy(
    const std::string& name, const PolicyConfig& config, const PolicyContext& context,
    const SnapKvOptions& options, std::vector<int32_t> layer_budgets) {
  return std::make_unique<SnapKvFamilyPolicy>(name, config, context, options,
                                              std::move(layer_budgets));
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateSnapKvPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const SnapKvOptions options, ParseSnapKvOptions(config));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("snapkv"));
  return CreateSnapKvFamilyPolicy("snapkv", config, context, options, {});
}

}  // namespace winnow::cache::policies
