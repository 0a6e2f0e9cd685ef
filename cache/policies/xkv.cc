#include "cache/policies/xkv.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/layer_budget_split.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace winnow::cache::policies {
namespace {

class XkvPolicy : public CompressionPolicy {
 public:
  XkvPolicy(const PolicyConfig& config, const PolicyContext& context, const XkvOptions& options)
      : CompressionPolicy(config, context), options_(options) {
    const int32_t n = context.layout.num_tokens;
    const int32_t layers = context.dims.num_layers;
    const int32_t per_layer = KeepCount(config.budget(), n);
    // The budget counts the window (the paper's ratio is cached / original over everything),
    // so a window larger than the per-layer budget is shrunk to it.
    window_ = std::clamp(std::min(options.window, per_layer), 1, std::max(n, 1));
    prefix_ = std::max(0, n - window_);
    prefix_budget_ = int64_t{layers} * (per_layer - window_);
    compresses_ = prefix_ > 0 && prefix_budget_ < int64_t{layers} * prefix_;
    normalised_.assign(static_cast<size_t>(layers) * prefix_, 0.0f);
    observed_.assign(layers, 0);
    scores_.resize(layers);
  }

  std::string name() const override { return "xkv"; }

  ObservationRequest Observation() const override {
    ObservationRequest request{layout().num_tokens - window_, false};
    request.row_probabilities = false;  // Select + Merge sums every window row
    return request;
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(
        CheckObservation(name(), attention, dims(), layout().num_tokens, window_));
    const int32_t n = attention.num_slots;
    observed_[attention.layer] = 1;
    if (!compresses_) return absl::OkStatus();
    const int32_t heads = attention.num_heads;
    const int32_t kv_heads = attention.num_kv_heads;
    // Select + Merge: the window rows' attention on the prefix. The paper averages the rows;
    // a sum ranks and normalises identically, so the division is skipped.
    const std::vector<float> summed =
        SumObservedRows(attention, 0, attention.num_rows, false, threads());
    const std::vector<float> pooled = PoolRowPrefixes(summed, heads, n, prefix_, options_.kernel,
                                                      options_.pooling, threads());
    // Allocation input w_l: the mean over every query head, normalised to sum 1 (R_l's
    // denominator), so layers compete on the share of their own importance they keep.
    std::vector<float> layer_scores = MeanOverHeads(pooled, heads, prefix_);
    NormalizeSum(layer_scores);
    std::copy(layer_scores.begin(), layer_scores.end(),
              normalised_.begin() + int64_t{attention.layer} * prefix_);
    // Eviction scores: the group's query heads folded into their KV head.
    const std::vector<float> grouped =
        AggregateGroups(pooled, heads, kv_heads, prefix_, options_.aggregation);
    std::vector<float>& scores = scores_[attention.layer];
    scores.assign(static_cast<size_t>(kv_heads) * n, 0.0f);
    for (int32_t g = 0; g < kv_heads; ++g) {
      std::copy_n(grouped.begin() + int64_t{g} * prefix_, prefix_,
                  scores.begin() + int64_t{g} * n);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t layers = dims().num_layers;
    const int32_t n = layout().num_tokens;
    if (!compresses_) return KeepPlan{};
    WINNOW_RETURN_IF_ERROR(CheckEveryLayerObserved(name(), observed_));
    std::vector<int32_t> counts;
    XkvProfileStore& store = XkvProfileStore::Global();
    std::optional<std::vector<double>> profile;
    if (options_.profile &&
        !store.ShouldProfile(options_.category, layers, options_.profile_warmup,
                             options_.profile_rate)) {
      profile = store.Average(options_.category, layers);
    }
    if (profile.has_value()) {
      // Reuse: the averaged fractions rescaled to this request's budget, clamped to what each
      // layer has, the excess spread over the others.
      const int32_t lo = static_cast<int32_t>(std::min<int64_t>(
          std::min(options_.min_per_layer, prefix_), prefix_budget_ / layers));
      const std::vector<double> targets =
          WaterFill(*profile, static_cast<double>(prefix_budget_), lo, prefix_);
      counts = RoundBudgets(targets, prefix_budget_, lo, prefix_);
    } else {
      XkvAllocation allocation = XkvAllocate(normalised_, layers, prefix_, prefix_budget_,
                                             options_.min_per_layer, options_.r_target);
      spdlog::debug("xkv: R_avg {:.4f}", allocation.r_avg);
      counts = std::move(allocation.counts);
      if (options_.profile) store.Record(options_.category, counts);
    }
    spdlog::debug("xkv: {} prefix kept per layer [{}] of {} ({})", prefix_budget_,
                  fmt::join(counts, ", "), prefix_, profile ? "profile" : "per request");
    std::vector<float>().swap(normalised_);

    std::vector<int32_t> window(window_);
    std::iota(window.begin(), window.end(), prefix_);
    return PlanPerLayer(scores_, [&](int32_t l, std::span<const float> scores)
                                     -> std::optional<LayerKeep> {
      if (counts[l] >= prefix_) return std::nullopt;
      return PerHeadTopK(scores, dims().num_kv_heads, n, window, window_ + counts[l], threads());
    });
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    const int64_t layers = dims().num_layers;
    if (!compresses_) return KeepAllSlots(dims().num_layers, prompt_tokens, generated);
    return layers * window_ + prefix_budget_ + layers * generated;
  }

 private:
  XkvOptions options_;
  int32_t window_ = 1;
  int32_t prefix_ = 0;
  int64_t prefix_budget_ = 0;  // N: prefix tokens kept, summed over layers
  bool compresses_ = false;
  std::vector<float> normalised_;           // [layer][prefix], each layer summing to 1
  std::vector<char> observed_;              // [layer]
  std::vector<std::vector<float>> scores_;  // [layer][kv_head][slot]
};

}  // namespace

absl::StatusOr<XkvOptions> ParseXkvOptions(const PolicyConfig& config) {
  XkvOptions o;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("window", &o.window, 1, 1 << 16));
  WINNOW_RETURN_IF_ERROR(ReadPoolingParams(config, &o.kernel, &o.pooling, &o.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("min_per_layer", &o.min_per_layer, 0, 1 << 20));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("r_target", &o.r_target, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(
      config.ReadChoice<bool>("mode", &o.profile, {{"request", false}, {"profile", true}}));
  WINNOW_RETURN_IF_ERROR(
      config.ReadInt("category", &o.category, 0, std::numeric_limits<int32_t>::max()));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("profile_warmup", &o.profile_warmup, 1, 1 << 20));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("profile_rate", &o.profile_rate, 0.0, 1.0));
  return o;
}

XkvAllocation XkvAllocate(std::span<const float> scores, int32_t layers, int32_t prefix,
                          int64_t budget, int32_t min_per_layer, double r_target) {
  XkvAllocation out;
  out.counts.assign(std::max(layers, 0), 0);
  if (layers <= 0 || prefix <= 0) return out;
  budget = std::clamp<int64_t>(budget, 0, int64_t{layers} * prefix);
  // Each layer's scores sorted descending: the greedy's wait list is the head of each list, and
  // a layer's top-n tokens are its first n entries.
  std::vector<float> sorted(scores.begin(), scores.begin() + int64_t{layers} * prefix);
  std::vector<double> layer_sum(layers, 0.0);
  for (int32_t l = 0; l < layers; ++l) {
    auto begin = sorted.begin() + int64_t{l} * prefix;
    std::sort(begin, begin + prefix, std::greater<float>());
    for (int32_t i = 0; i < prefix; ++i) layer_sum[l] += begin[i];
  }
  const int32_t floor = static_cast<int32_t>(
      std::min<int64_t>(std::min(min_per_layer, prefix), budget / layers));
  double kept_mass = 0.0;  // sum over layers of kept normalised mass (R_avg * layers)
  for (int32_t l = 0; l < layers; ++l) {
    for (int32_t i = 0; i < floor; ++i) kept_mass += sorted[int64_t{l} * prefix + i];
  }
  int64_t rest = budget - int64_t{layers} * floor;
  std::vector<float> pool;
  pool.reserve(static_cast<size_t>(layers) * (prefix - floor));
  for (int32_t l = 0; l < layers; ++l) {
    auto begin = sorted.begin() + int64_t{l} * prefix;
    pool.insert(pool.end(), begin + floor, begin + prefix);
  }
  if (r_target > 0.0) {
    // Eq. 18: the fewest extra tokens whose mass lifts R_avg to the target.
    std::vector<float> ordered = pool;
    std::sort(ordered.begin(), ordered.end(), std::greater<float>());
    const double target = r_target * layers;
    int64_t needed = 0;
    double mass = kept_mass;
    while (needed < static_cast<int64_t>(ordered.size()) && mass < target - 1e-9) {
      mass += ordered[needed++];
    }
    rest = std::min(rest, needed);
  }
  std::vector<int32_t> above(layers, 0);
  if (rest > 0) {
    // The rest-th largest remaining score is the greedy's last pick; everything strictly above
    // it is picked, and ties at it go to the lower layers (Algorithm 1's first-index argmax).
    std::nth_element(pool.begin(), pool.begin() + (rest - 1), pool.end(), std::greater<float>());
    const float threshold = pool[rest - 1];
    int64_t picked = 0;
    std::vector<int32_t> ties(layers, 0);
    for (int32_t l = 0; l < layers; ++l) {
      auto begin = sorted.begin() + int64_t{l} * prefix + floor;
      auto end = sorted.begin() + int64_t{l} * prefix + prefix;
      auto first_not_above = std::lower_bound(begin, end, threshold, std::greater<float>());
      auto first_below = std::upper_bound(begin, end, threshold, std::greater<float>());
      above[l] = static_cast<int32_t>(first_not_above - begin);
      ties[l] = static_cast<int32_t>(first_below - first_not_above);
      picked += above[l];
    }
    for (int32_t l = 0; l < layers && picked < rest; ++l) {
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(ties[l], rest - picked));
      above[l] += take;
      picked += take;
    }
  }
  double r_sum = 0.0;
  for (int32_t l = 0; l < layers; ++l) {
    out.counts[l] = floor + above[l];
    if (layer_sum[l] <= 0.0) continue;
    double kept = 0.0;
    for (int32_t i = 0; i < out.counts[l]; ++i) kept += sorted[int64_t{l} * prefix + i];
    r_sum += kept / layer_sum[l];
  }
  out.r_avg = r_sum / layers;
  return out;
}

// ---------------------------------------------------------------------------------------------
// XkvProfileStore

XkvProfileStore& XkvProfileStore::Global() {
  static XkvProfileStore* store = new XkvProfileStore();
  return *store;
}

std::string XkvProfileStore::Key(int64_t category, int32_t layers) {
  return absl::StrCat(category, "/", layers);
}

bool XkvProfileStore::ShouldProfile(int64_t category, int32_t layers, int32_t warmup,
                                    double rate) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[Key(category, layers)];
  const int64_t index = e.planned++;
  // Nothing recorded yet (e.g. the warm-up requests have not finished planning): profile.
  if (e.samples == 0 || index < warmup) return true;
  if (rate <= 0.0) return false;
  const int64_t period = std::max<int64_t>(1, std::llround(1.0 / rate));
  return (index - warmup + 1) % period == 0;
}

void XkvProfileStore::Record(int64_t category, std::span<const int32_t> counts) {
  int64_t total = 0;
  for (int32_t c : counts) total += c;
  if (total <= 0) return;  // an all-zero allocation says nothing about the layers' shares
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[Key(category, static_cast<int32_t>(counts.size()))];
  e.sum.resize(counts.size(), 0.0);
  for (size_t l = 0; l < counts.size(); ++l) {
    e.sum[l] += static_cast<double>(counts[l]) / static_cast<double>(total);
  }
  ++e.samples;
}

std::optional<std::vector<double>> XkvProfileStore::Average(int64_t category,
                                                            int32_t layers) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(Key(category, layers));
  if (it == entries_.end() || it->second.samples == 0) return std::nullopt;
  std::vector<double> out = it->second.sum;
  for (double& f : out) f /= static_cast<double>(it->second.samples);
  return out;
}

int64_t XkvProfileStore::Samples(int64_t category, int32_t layers) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(Key(category, layers));
  return it == entries_.end() ? 0 : it->second.samples;
}

void XkvProfileStore::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateXkvPolicy(const PolicyConfig& config,
                                                                    const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const XkvOptions options, ParseXkvOptions(config));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("xkv"));
  return std::make_unique<XkvPolicy>(config, context, options);
}

}  // namespace winnow::cache::policies
