#include "cache/policies/h2o.h"

#include <algorithm>
#include <cmath>

#include "base/status_macros.h"
#include "cache/keep_plan.h"
#include "cache/policies/decode_cap.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {
namespace {

class H2oPolicy : public CompressionPolicy {
 public:
  H2oPolicy(const PolicyConfig& config, const PolicyContext& context, double recent_fraction,
            int32_t sinks, GroupAggregation agg, bool normalize, DecodeCap cap)
      : CompressionPolicy(config, context),
        recent_fraction_(recent_fraction),
        sinks_(sinks),
        agg_(agg),
        normalize_(normalize),
        cap_(cap) {
    cap_.prefill_kept = KeepCount(config.budget(), context.layout.num_tokens);
    scores_.resize(context.dims.num_layers);
  }

  std::string name() const override { return "h2o"; }

  ObservationRequest Observation() const override {
    return ObservationRequest{layout().num_tokens, true};
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(CheckColumnSums(name(), attention));
    const int32_t n = attention.num_slots;
    std::vector<float> sums(attention.column_sums.begin(), attention.column_sums.end());
    if (normalize_) {
      // Key j is seen by the n - j prompt rows at or after it.
      for (int32_t h = 0; h < attention.num_heads; ++h) {
        for (int32_t j = 0; j < n; ++j) sums[int64_t{h} * n + j] /= static_cast<float>(n - j);
      }
    }
    scores_[attention.layer] =
        AggregateGroups(sums, attention.num_heads, attention.num_kv_heads, n, agg_);
    return absl::OkStatus();
  }

  absl::StatusOr<KeepPlan> Plan() override {
    return Evict(cap_.prefill_kept, [n = layout().num_tokens](int32_t) { return n; });
  }

  bool WantsDecodeAttention() const override { return cap_.mode != DecodeCap::Mode::kOff; }
  bool EvictsDuringDecode() const override { return cap_.mode != DecodeCap::Mode::kOff; }

  absl::StatusOr<KeepPlan> OnDecodeStep(const DecodeStep& step) override {
    if (cap_.mode == DecodeCap::Mode::kOff) return KeepPlan{};
    const SlotPositions& slots = *step.slots;
    const int32_t num_kv = dims().num_kv_heads;
    bool any = false;
    for (int32_t l = 0; l < slots.num_layers(); ++l) {
      const int32_t n = slots.num_slots(l);
      std::vector<float>& s = scores_[l];
      const int32_t before = static_cast<int32_t>(s.size()) / num_kv;
      if (n != before + 1) {
        return absl::InternalError("h2o: slot count out of step with the accumulated scores");
      }
      // Grow every head's row by the new token's slot, then add this step's attention.
      std::vector<float> grown(static_cast<size_t>(num_kv) * n, 0.0f);
      for (int32_t g = 0; g < num_kv; ++g) {
        std::copy_n(s.begin() + int64_t{g} * before, before, grown.begin() + int64_t{g} * n);
      }
      if (l < static_cast<int32_t>(step.attention.size()) &&
          step.attention[l].size() == static_cast<size_t>(dims().num_heads) * n) {
        const std::vector<float> add =
            AggregateGroups(step.attention[l], dims().num_heads, num_kv, n, agg_);
        for (size_t i = 0; i < grown.size(); ++i) grown[i] += add[i];
      }
      s = std::move(grown);
      any |= cap_.ShouldEvict(n, step.tokens_seen);
    }
    if (!any) return KeepPlan{};
    return Evict(cap_.Cap(step.tokens_seen), [&slots](int32_t l) { return slots.num_slots(l); });
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    return cap_.SteadyStateSlots(dims(), prompt_tokens, generated);
  }

 private:
  // Keeps, per layer and KV head, `keep` slots: sinks, the recent window, then heavy hitters.
  // Slot order is position order in every head, so the recent window is the last slots.
  template <typename SlotsOf>
  KeepPlan Evict(int32_t keep, SlotsOf slots_of) {
    const int32_t num_kv = dims().num_kv_heads;
    KeepPlan plan;
    plan.layers.resize(dims().num_layers);
    bool changed = false;
    for (int32_t l = 0; l < dims().num_layers; ++l) {
      const int32_t n = slots_of(l);
      if (n <= keep) continue;
      const int32_t recent = std::min(
          keep, static_cast<int32_t>(std::lround(recent_fraction_ * keep)));
      const int32_t sinks = std::min(sinks_, keep - recent);
      const std::vector<int32_t> forced = SinksAndWindow(n, sinks, recent);
      plan.layers[l] = PerHeadTopK(scores_[l], num_kv, n, forced, keep);
      // The session confines sliding layers to their window; the scores must follow the plan.
      KeepSlidingWindow(plan.layers[l], n, dims().WindowOf(l));
      scores_[l] = ApplyLayerKeepToSlotValues(plan.layers[l], scores_[l], num_kv, n);
      changed = true;
    }
    if (!changed) plan.layers.clear();
    return plan;
  }

  double recent_fraction_;
  int32_t sinks_;
  GroupAggregation agg_;
  bool normalize_;
  DecodeCap cap_;
  std::vector<std::vector<float>> scores_;  // [layer][kv_head * slots + slot]
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateH2oPolicy(const PolicyConfig& config,
                                                                   const PolicyContext& context) {
  double recent_fraction = 0.5;
  int32_t sinks = 0;
  GroupAggregation aggregation = GroupAggregation::kSum;
  bool normalize = false;
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("recent_fraction", &recent_fraction, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("sinks", &sinks, 0, 1 << 20));
  WINNOW_RETURN_IF_ERROR(ReadGroupAggregation(config, "gqa", &aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("normalize", &normalize));
  WINNOW_ASSIGN_OR_RETURN(const DecodeCap cap, DecodeCap::FromConfig(config, context.dims));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("h2o"));
  return std::make_unique<H2oPolicy>(config, context, recent_fraction, sinks, aggregation,
                                     normalize, cap);
}

}  // namespace winnow::cache::policies
