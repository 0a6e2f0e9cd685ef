// Turning per-layer weights into per-layer slot counts, shared by the adaptive-budget policies
// (vl_cache, aircache, xkv's profile mode). Their papers give real-valued per-layer budgets and
// leave rounding, clamping and redistribution open; doing it in one place keeps the three
// consistent and keeps the hard invariant (the counts never exceed the request's budget) in one
// tested function.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Which prompt tokens a modality-aware policy may evict. With image/context spans: the span
// tokens before the observation window (the window and all other text are always kept). Without
// spans (text-only fallback): every token before the window, or every token when
// `window_evictable` (VL-Cache's fallback protects a per-layer recent window instead).
struct EvictableSplit {
  bool span_mode = false;
  std::vector<int32_t> evictable;    // ascending
  std::vector<int32_t> always_kept;  // ascending: the complement of `evictable` in [0, n)
};
EvictableSplit SplitEvictable(const PromptLayout& layout, WindowRange window,
                              bool window_evictable);
// Every token before the window is evictable, text included (VL-Cache's one top-k over text and
// visual keys); span_mode still says whether the layout has spans.
EvictableSplit SplitBeforeWindow(const PromptLayout& layout, WindowRange window);

// What a modality-aware policy's `budget` is a fraction of, in span mode (param `budget_of`).
// kPrompt (default): the whole prompt's KV, as for every other policy, so that one budget means
// one memory footprint whichever policy a request names; the always-kept text is paid first and
// the span tokens get the rest. kSpans: the span tokens alone, the text kept on top (AirCache's
// ρ, "keep 10% of the visual tokens").
enum class BudgetBase { kPrompt, kSpans };
absl::Status ReadBudgetBase(const PolicyConfig& config, BudgetBase* field);

// Span-mode evictable slots kept, summed over layers, for `budget` on `base`; within
// [0, layers * split.evictable.size()].
int64_t SpanModeCap(double budget, BudgetBase base, int32_t layers, int32_t num_tokens,
                    const EvictableSplit& split);

// Splits `total` over the layers in proportion to `weights` (negative weights count as 0), each
// share clamped to [lo, hi]; what the clamping frees or absorbs is spread over the unclamped
// layers (water-filling), so the shares sum to clamp(total, n*lo, n*hi). All-zero weights split
// equally.
std::vector<double> WaterFill(std::span<const double> weights, double total, double lo,
                              double hi);

// Integer counts from real-valued targets: floor(target) clamped to [lo, hi]; then the units
// lost to flooring go to the largest fractional parts (ties to the lower layer) up to
// min(cap, floor(sum of clamped targets)); then, while the sum exceeds `cap`, a unit is taken
// from the largest count above `lo` (ties to the higher layer). The result sums to at most
// max(cap, n*lo): a per-layer floor the caller asks for wins over a cap it cannot meet.
std::vector<int32_t> RoundBudgets(std::span<const double> targets, int64_t cap, int32_t lo,
                                  int32_t hi);

// Per-layer shares of one ranking: `candidates[l]` are layer l's scores, the best `picks` of all
// of them are kept, and layer l's share is its kept candidates divided by `per_slot` (how many
// candidates one slot of the layer stands for). Candidates strictly above the picks-th best
// count in full; the ties at it share what is left in proportion, so the shares sum to exactly
// picks / per_slot.
std::vector<double> RankedShares(const std::vector<std::vector<float>>& candidates,
                                 int64_t picks, double per_slot);

// AdaKV's head-adaptive budget where the heads of a layer hold equal counts (the paged cache):
// `head_scores[l]` is layer l's num_heads x m candidate scores; a layer's c-th slot is worth
// the largest c-th best score among its heads, and one ranking of those over every layer
// decides the counts (RankedShares), so a layer keeps as many slots as its neediest head's
// share and the other heads fill them with their own next best.
std::vector<double> NeediestHeadShares(const std::vector<std::vector<float>>& head_scores,
                                       int32_t num_heads, int64_t picks);

// Slots per layer (and KV head) out of n, with sliding-window layers compressed at their own
// scale: a sliding layer's next token reads at most window - 1 slots (KeepSlidingWindows), so
// of a count c out of n it keeps c / n of those, ceil(c x (window - 1) / n), never fewer than
// `floor` (the slots its policy always keeps) nor more than window - 1. The rest goes to the
// full-attention layers below n, in proportion to their counts (water-filling, none above n);
// the sum never grows. The answer to a question about the document's start is read by the
// full-attention layers only, and a sliding layer's budget is better spent there: on Gemma 3
// 270M winnowkv at 0.1 of ~4k tokens answers 98 of 100, 58 before (docs/compression.md). A
// prompt inside the window, or a model without sliding layers, gets `counts` back.
std::vector<int32_t> SpillPastWindows(std::vector<int32_t> counts, const ModelDims& dims,
                                      int32_t n, int32_t floor);

// The skeleton of the policies that rank a split prompt under per-layer budgets (aircache,
// vl_cache): the observation window, the split, the cap on evictable tokens kept summed over
// layers, and per layer whether it was observed, its selection scores and its budget. A
// subclass sets window_, split_ and cap_ in its constructor, starts ObserveLayer with
// BeginObservation and fills scores_, and sets budgets_ in Plan. What the papers differ in (the
// scores, the layer weights, the recent window) stays in the subclass.
class SplitBudgetPolicy : public CompressionPolicy {
 public:
  ObservationRequest Observation() const override {
    return ObservationRequest{window_.begin, false};
  }
  // Every layer keeps the prompt's tokens outside split_.evictable (at least min_text of
  // them), plus cap_ evictable tokens summed over layers, plus everything generated.
  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override;

 protected:
  SplitBudgetPolicy(const PolicyConfig& config, const PolicyContext& context, int64_t min_text)
      : CompressionPolicy(config, context),
        observed_(context.dims.num_layers, 0),
        scores_(context.dims.num_layers),
        min_text_(min_text) {}

  // CheckObservation with `rows` observed rows (< 0: any number), then marks the layer observed.
  absl::Status BeginObservation(const ObservationAttention& attention, int32_t rows);

  WindowRange window_;
  EvictableSplit split_;
  int64_t cap_ = 0;                         // evictable tokens kept, summed over layers
  std::vector<char> observed_;              // [layer]
  std::vector<std::vector<float>> scores_;  // [layer][kv_head or 1][slot]
  std::vector<int32_t> budgets_;            // [layer] evictable tokens kept

 private:
  int64_t min_text_;
};

}  // namespace winnow::cache::policies
