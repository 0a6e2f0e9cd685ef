#include "cache/policies/streaming_llm.h"

#include <algorithm>

#include "base/status_macros.h"
#include "cache/policies/decode_cap.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {
namespace {

class StreamingLlmPolicy : public CompressionPolicy {
 public:
  StreamingLlmPolicy(const PolicyConfig& config, const PolicyContext& context, int32_t sinks,
                     DecodeCap cap)
      : CompressionPolicy(config, context), sinks_(sinks), cap_(cap) {
    cap_.prefill_kept = KeepCount(config.budget(), context.layout.num_tokens);
  }

  std::string name() const override { return "streaming_llm"; }

  ObservationRequest Observation() const override {
    return ObservationRequest{layout().num_tokens, false};  // position-only: observes nothing
  }
  absl::Status ObserveLayer(const ObservationAttention&) override { return absl::OkStatus(); }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t n = layout().num_tokens;
    return Trim(cap_.prefill_kept, [n](int32_t) { return n; });
  }

  bool EvictsDuringDecode() const override { return cap_.mode != DecodeCap::Mode::kOff; }

  absl::StatusOr<KeepPlan> OnDecodeStep(const DecodeStep& step) override {
    const SlotPositions& slots = *step.slots;
    bool any = false;
    for (int32_t l = 0; l < slots.num_layers(); ++l) {
      any |= cap_.ShouldEvict(slots.num_slots(l), step.tokens_seen);
    }
    if (!any) return KeepPlan{};
    return Trim(cap_.Cap(step.tokens_seen), [&slots](int32_t l) { return slots.num_slots(l); });
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    return cap_.SteadyStateSlots(dims(), prompt_tokens, generated);
  }

 private:
  // Keeps the first sinks_ slots and the most recent ones, `keep` in all, in every layer. Slot
  // order is position order and the sinks are never evicted, so slot indices suffice.
  template <typename SlotsOf>
  KeepPlan Trim(int32_t keep, SlotsOf slots_of) const {
    KeepPlan plan;
    bool changed = false;
    plan.layers.resize(dims().num_layers);
    for (int32_t l = 0; l < dims().num_layers; ++l) {
      const int32_t n = slots_of(l);
      if (n <= keep) continue;
      // At least one recent slot: the newest token matters more than a fourth sink.
      const int32_t sinks = std::min(sinks_, keep - 1);
      const std::vector<int32_t> kept = SinksAndWindow(n, sinks, keep - sinks);
      plan.layers[l].heads.assign(dims().num_kv_heads, kept);
      changed = true;
    }
    if (!changed) plan.layers.clear();
    return plan;
  }

  int32_t sinks_;
  DecodeCap cap_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateStreamingLlmPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  int32_t sinks = 4;
  WINNOW_RETURN_IF_ERROR(config.ReadInt("sinks", &sinks, 0, 1 << 20));
  WINNOW_ASSIGN_OR_RETURN(const DecodeCap cap, DecodeCap::FromConfig(config, context.dims));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("streaming_llm"));
  return std::make_unique<StreamingLlmPolicy>(config, context, sinks, cap);
}

}  // namespace winnow::cache::policies
