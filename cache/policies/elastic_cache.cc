#include "cache/policies/elastic_cache.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

ElasticLayerPlan PlanElasticLayer(const std::vector<float>& scores, int32_t keep, int32_t sinks,
                                  int32_t protect_last) {
  const int32_t n = static_cast<int32_t>(scores.size());
  ElasticLayerPlan plan;
  if (keep >= n) {
    plan.kept.resize(n);
    std::iota(plan.kept.begin(), plan.kept.end(), 0);
    for (int32_t j = 0; j < n; ++j) plan.groups.push_back({j});
    return plan;
  }
  keep = std::max(keep, 1);
  int32_t s = std::min(sinks, n);
  int32_t p = std::min(protect_last, n - s);
  // A budget too small for the protected tokens plus one anchor: protecting them would leave the
  // rest of the prompt nowhere to merge into, so every kept entry becomes an anchor instead.
  if (keep < s + p + 1) s = p = 0;
  const int32_t num_anchors = keep - s - p;
  std::vector<int32_t> candidates(n - s - p);
  std::iota(candidates.begin(), candidates.end(), s);
  // Top-k by score, ties to the lower position (the brief's rule), ascending.
  const std::vector<int32_t> anchors = TopK(scores, candidates, num_anchors);

  for (int32_t j = 0; j < s; ++j) {
    plan.kept.push_back(j);
    plan.groups.push_back({j});
  }
  // Buckets: every candidate joins its nearest anchor by position; equidistant ones join the
  // left anchor (eq. 2's midpoint belongs to B_k). Positions only grow, so one sweep suffices
  // and every bucket is a contiguous run containing its anchor.
  size_t first_group = plan.groups.size();
  for (int32_t anchor : anchors) {
    plan.kept.push_back(anchor);
    plan.groups.emplace_back();
  }
  size_t a = 0;
  for (int32_t pos = s; pos < n - p; ++pos) {
    while (a + 1 < anchors.size() && anchors[a + 1] - pos < std::abs(pos - anchors[a])) ++a;
    plan.groups[first_group + a].push_back(pos);
  }
  for (int32_t j = n - p; j < n; ++j) {
    plan.kept.push_back(j);
    plan.groups.push_back({j});
  }
  return plan;
}

namespace {

class ElasticCachePolicy : public CompressionPolicy {
 public:
  struct Options {
    int32_t sinks = 1;
    int32_t protect_last = 1;
    int32_t fix_offset = -25;
    bool merge = true;
    bool decode = true;
    int32_t evict_every = 1;
  };

  ElasticCachePolicy(const PolicyConfig& config, const PolicyContext& context, Options options)
      : CompressionPolicy(config, context), options_(options) {
    layers_.resize(context.dims.num_layers);
  }

  std::string name() const override { return "elastic_cache"; }

  // Every prompt row's probabilities, as column sums (the importance metric is a sum over all
  // query rows); no row window.
  ObservationRequest Observation() const override {
    return ObservationRequest{layout().num_tokens, true};
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(CheckColumnSums(name(), attention));
    const int32_t n = attention.num_slots;
    // I_n = (1/H_q) sum_h sum_m A[h][m][n]: averaging over every query head equals averaging each
    // GQA group first, and anchors are per layer, so GQA needs nothing else.
    const std::vector<float> scores =
        MeanOverHeads(attention.column_sums, attention.num_heads, n);
    const int32_t keep = PrefillKeep(n);
    if (keep >= n) return absl::OkStatus();  // untouched layer
    ElasticLayerPlan layer =
        PlanElasticLayer(scores, keep, options_.sinks, options_.protect_last);
    LayerKeep& out = layers_[attention.layer];
    out.heads.assign(dims().num_kv_heads, layer.kept);
    if (options_.merge) out.merge.assign(dims().num_kv_heads, std::move(layer.groups));
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t n = layout().num_tokens;
    const int32_t kept = PrefillKeep(n);
    // The fixed point: computed once from the compressed prompt length, then frozen. Clamped so
    // that it never evicts a sink (brief pitfall 5) and always points inside the cache.
    const int32_t raw = options_.fix_offset < 0 ? kept + options_.fix_offset : options_.fix_offset;
    const int32_t sinks = std::min(options_.sinks, std::max(kept - 1, 0));
    fix_ = std::min(std::max(raw, sinks), std::max(kept - 1, 0));
    KeepPlan plan;
    plan.layers = std::move(layers_);
    layers_.clear();
    if (plan.empty()) plan.layers.clear();
    return plan;
  }

  bool EvictsDuringDecode() const override { return options_.decode; }

  absl::StatusOr<KeepPlan> OnDecodeStep(const DecodeStep& step) override {
    if (!options_.decode) return KeepPlan{};
    const SlotPositions& slots = *step.slots;
    const int32_t cap = KeepCount(config().budget(), step.tokens_seen);
    KeepPlan plan;
    plan.layers.resize(dims().num_layers);
    bool changed = false;
    for (int32_t l = 0; l < slots.num_layers(); ++l) {
      const int32_t n = slots.num_slots(l);
      const int32_t excess = std::min(n - cap, n - fix_);
      if (excess < options_.evict_every || excess <= 0) continue;
      // Deleting logical index `fix` `excess` times = dropping [fix, fix + excess): slot order is
      // position order, so these are the oldest entries of the FIFO region.
      std::vector<int32_t> kept;
      kept.reserve(n - excess);
      for (int32_t j = 0; j < fix_; ++j) kept.push_back(j);
      for (int32_t j = fix_ + excess; j < n; ++j) kept.push_back(j);
      plan.layers[l].heads.assign(dims().num_kv_heads, std::move(kept));
      changed = true;
    }
    if (!changed) plan.layers.clear();
    return plan;
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    const int64_t kept = PrefillKeep(prompt_tokens);
    int64_t per_layer = kept + generated;
    if (options_.decode) {
      // The cap grows with the tokens seen; the cache may exceed it by evict_every - 1 between
      // compactions, plus the new token written before the step's eviction.
      const int64_t capped =
          int64_t{KeepCount(config().budget(), prompt_tokens + generated)} + options_.evict_every;
      per_layer = std::min(per_layer, std::max(capped, kept));
    }
    return int64_t{dims().num_layers} * per_layer;
  }

 private:
  // floor(budget x n) entries per layer (at least 1): the same rounding as every other policy,
  // so that kept <= budget x prompt holds exactly (the reference code keeps ceil, one more).
  int32_t PrefillKeep(int32_t n) const { return KeepCount(config().budget(), n); }

  Options options_;
  std::vector<LayerKeep> layers_;  // per layer, filled by ObserveLayer
  int32_t fix_ = 0;                // slot index of the fixed point
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateElasticCachePolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  ElasticCachePolicy::Options o;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("sinks", &o.sinks, 0, 1 << 20));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("protect_last", &o.protect_last, 0, 1 << 20));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("fix_offset", &o.fix_offset, -(1 << 24), 1 << 24));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("merge", &o.merge));
  WINNOW_RETURN_IF_ERROR(
      config.ReadChoice<bool>("decode", &o.decode, {{"fixed_point", true}, {"off", false}}));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("evict_every", &o.evict_every, 1, 1 << 20));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("elastic_cache"));
  return std::make_unique<ElasticCachePolicy>(config, context, o);
}

}  // namespace winnow::cache::policies
