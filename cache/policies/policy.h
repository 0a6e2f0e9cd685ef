// The KV-compression policy interface: what a policy sees (the prompt's layout, observation
// attention per layer, decode steps) and what it returns (which slots each (layer, KV head)
// keeps). The machinery around it (cache/compression.h) captures queries, runs the scoring
// kernel, applies plans by compaction and frees blocks; a policy never touches the pool.
//
// Lifetime of one policy object (one per request, created again after a preemption):
//   1. CreatePolicy(name, config, context) validates the parameters;
//   2. Observation() says which prompt rows to observe;
//   3. the prompt is prefilled (chunked); then, once per layer in layer order,
//      ObserveLayer(attention of the observed rows against every cached key of that layer);
//   4. Plan() -> KeepPlan, applied at once: blocks no longer needed return to the pool (with a
//      lookahead, after the first LookaheadSteps() decode steps instead);
//   5. per decode step, OnDecodeStep() may return a further plan (decode-time eviction), and
//      selector() may restrict attention without evicting (TokenSelect).
//
// Slots vs positions. At prefill time slot j of every (layer, KV head) holds the token at
// absolute position j. After a plan, slot i of head h holds the i-th kept token of that head,
// in ascending position order; heads of a layer keep the same count but may keep different
// tokens. SlotPositions tracks which position every slot holds. Keys are cached after RoPE, so
// kept keys keep their original rotary phase and a new token's RoPE position is its absolute
// position, never a slot index.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "cache/keep_plan.h"
#include "cache/policies/pooling.h"
#include "cache/scoring_backend.h"

namespace winnow::cache {
class AttentionSelector;  // cache/attention_selector.h
}  // namespace winnow::cache

namespace winnow::cache::policies {

// ---------------------------------------------------------------------------------------------
// Inputs known at request creation.

enum class SpanKind {
  kText,     // ordinary prompt text (instruction, template, system prompt)
  kImage,    // image-embedding rows (model::kEmbeddingInput positions from one EmbeddingSpan)
  kContext,  // text the client marked as compressible context (documents, history)
};

struct PromptSpan {
  SpanKind kind = SpanKind::kText;
  int32_t begin = 0;  // absolute positions, [begin, end)
  int32_t end = 0;
};

// The request's prompt as segments. Spans are sorted, disjoint and need not cover the prompt:
// positions outside every span are text. After a preemption the re-prefilled "prompt" also
// contains the tokens generated so far, as text after the last span.
struct PromptLayout {
  int32_t num_tokens = 0;
  std::vector<PromptSpan> spans;

  // True for image and context spans: what modality-aware policies score and evict.
  static bool IsCompressibleKind(SpanKind kind) { return kind != SpanKind::kText; }
  bool HasCompressibleSpans() const;
  // One past the end of the last image/context span; 0 when there is none.
  int32_t LastCompressibleEnd() const;
  bool IsCompressible(int32_t position) const;
  // Ascending positions inside image/context spans.
  std::vector<int32_t> CompressiblePositions() const;
  // InvalidArgument when spans are unsorted, overlapping, empty or outside [0, num_tokens).
  absl::Status Validate() const;
  // The layout of the first n tokens (a context compressed alone): the spans inside the prompt
  // cut at n, those after it dropped; a span past the prompt stays, for Validate to refuse.
  PromptLayout Leading(int32_t n) const;
};

// The observation window every window-based policy uses, so that all of them agree:
//   - with image/context spans: the text after the last such span, [LastCompressibleEnd, n),
//     clamped to at least min_window and at most max_window tokens (taken from the end);
//   - without: the last default_window tokens (the briefs' text-only fallback: SnapKV's w).
// Always non-empty and within [0, num_tokens).
struct WindowRange {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t size() const { return end - begin; }
};
WindowRange ObservationWindow(const PromptLayout& layout, int32_t default_window,
                              int32_t min_window, int32_t max_window);

// One policy parameter as the API carries it: a number (CompressionSpec.params, a
// map<string, double>) or a string (CompressionSpec.options). Numbers stay doubles from the wire
// to the policy, so every double, and every integer up to 2^53, arrives exactly.
using PolicyParam = std::variant<double, std::string>;
using PolicyParams = absl::flat_hash_map<std::string, PolicyParam>;

// The command-line form of a parameter (benchmarks, `name=value` flags): text that parses in full
// as a finite number is a number, anything else a string, which is how a client would split the
// same value between params and options.
PolicyParam ParsePolicyParam(std::string_view text);

// The request's budget and policy parameters (the API's CompressionSpec).
// budget in (0, 1]: the fraction of the prompt's tokens kept, averaged over layers, counting
// sinks and windows (each policy documents the exact base it applies it to).
// Typed getters read params; each records the name as used, so that CheckAllUsed() can reject a
// misspelt parameter instead of silently ignoring it. A getter takes the type of its parameter
// only (numbers for GetInt/GetDouble, strings for GetEnum; GetBool takes either), so a value
// sent in the wrong map is refused with a pointer to the right one. Errors name the field the
// value came from: "compression.params.<name>" for a number, "compression.options.<name>" for a
// string.
class PolicyConfig {
 public:
  PolicyConfig() = default;
  PolicyConfig(double budget, PolicyParams params)
      : budget_(budget), params_(std::move(params)) {}

  double budget() const { return budget_; }
  const PolicyParams& params() const { return params_; }
  bool Has(const std::string& name) const { return params_.contains(name); }

  // An integral number within [min, max] (2.5 and 1e300 are refused, 1048576 is not).
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t default_value, int64_t min,
                                 int64_t max) const;
  // A finite number within [min, max], unchanged.
  absl::StatusOr<double> GetDouble(const std::string& name, double default_value, double min,
                                   double max) const;
  // A string true/false/1/0 (case-insensitive), or the number 0 or 1.
  absl::StatusOr<bool> GetBool(const std::string& name, bool default_value) const;
  // A string, one of `allowed`.
  absl::StatusOr<std::string> GetEnum(const std::string& name, const std::string& default_value,
                                      const std::vector<std::string>& allowed) const;
  // InvalidArgument naming the first parameter no getter asked for, and the known ones.
  absl::Status CheckAllUsed(const std::string& policy_name) const;

  // Read*: a parameter into an options field, the field's current value being its default; the
  // same checks and errors as the getters above. An options parser is then one line per field.
  template <typename Int>
  absl::Status ReadInt(const std::string& name, Int* field, int64_t min, int64_t max) const {
    WINNOW_ASSIGN_OR_RETURN(const int64_t value, GetInt(name, *field, min, max));
    *field = static_cast<Int>(value);
    return absl::OkStatus();
  }
  absl::Status ReadDouble(const std::string& name, double* field, double min, double max) const {
    WINNOW_ASSIGN_OR_RETURN(*field, GetDouble(name, *field, min, max));
    return absl::OkStatus();
  }
  absl::Status ReadBool(const std::string& name, bool* field) const {
    WINNOW_ASSIGN_OR_RETURN(*field, GetBool(name, *field));
    return absl::OkStatus();
  }
  // A string naming one of `choices` (listed in the error in this order); *field must hold one
  // of their values, whose name is the default.
  template <typename T>
  absl::Status ReadChoice(const std::string& name, T* field,
                          const std::vector<std::pair<std::string, T>>& choices) const {
    std::vector<std::string> names;
    std::string default_name;
    for (const auto& [text, value] : choices) {
      names.push_back(text);
      if (value == *field && default_name.empty()) default_name = text;
    }
    WINNOW_ASSIGN_OR_RETURN(const std::string chosen, GetEnum(name, default_name, names));
    for (const auto& [text, value] : choices) {
      if (text == chosen) *field = value;
    }
    return absl::OkStatus();
  }

 private:
  const PolicyParam* Find(const std::string& name) const;

  double budget_ = 1.0;
  PolicyParams params_;
  mutable absl::flat_hash_set<std::string> used_;
};

struct PolicyContext {
  ModelDims dims;
  PromptLayout layout;
};

// ---------------------------------------------------------------------------------------------
// What the policy observes.

// Which prompt rows the machinery observes. Query rows of positions in [window_begin,
// num_tokens) are captured during prefill (across chunks) and, after the last chunk, their
// attention probabilities are computed per layer by the scoring kernel. Cost per layer:
// num_heads x rows x num_tokens floats, transient; keep windows to a few hundred rows.
struct ObservationRequest {
  int32_t window_begin = 0;  // == num_tokens: no row probabilities
  // Also accumulate, for EVERY prompt row, the column sums of its attention probabilities per
  // (layer, query head, slot) (H2O, Elastic Cache). Computed chunk by chunk, never materialised:
  // costs one extra QK pass over the prompt and num_layers x num_heads x num_tokens floats.
  bool accumulate_all_rows = false;
  // Also hand over the L2 norm of every prompt token's value vector per (layer, KV head).
  bool value_norms = false;
  // false: the policy reads the window rows only through their sum (window_sums, or
  // SumObservedRows over every row), so the machinery computes that sum without materialising
  // the rows' probabilities (num_heads x rows x num_tokens floats; on a GPU worker they would
  // cross to the host) and leaves probs and log_normalizer empty.
  bool row_probabilities = true;
  // Without row_probabilities: how the window rows fold on each key, into window_sums (kSum)
  // or window_max (kMax). A probe's rows (CompressionSession::SetProbe) fold the same way.
  kernels::ColumnReduce window_reduce = kernels::ColumnReduce::kSum;
};

// One layer's observation, handed to ObserveLayer after the last prefill chunk. At that point
// slot j is position j for every head (nothing has been compressed yet).
struct ObservationAttention {
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t num_rows = 0;   // observed rows
  int32_t num_slots = 0;  // keys of the layer (= prompt tokens)
  std::span<const int32_t> row_positions;  // absolute position of each observed row, ascending
  // probs[(h * num_rows + r) * num_slots + j] = softmax_j(q_{h,r} . k_j / sqrt(d)) over the keys
  // row r can see (j <= row_positions[r]); 0 for the causally masked j. float32.
  std::span<const float> probs;
  // ln sum_j exp(logit) per (h, r) ([h * num_rows + r]): logit = ln(prob) + log_normalizer, for
  // policies that need raw logits or a softmax restricted to a subset of keys.
  std::span<const float> log_normalizer;
  // With accumulate_all_rows: [h * num_slots + j] = sum over every prompt row of its
  // probability on key j. Empty otherwise.
  std::span<const float> column_sums;
  // Without row_probabilities: [h * num_slots + j] = sum over the observed rows of Prob(h, r,
  // j), computed without the rows (probs is then empty). Empty otherwise.
  std::span<const float> window_sums;
  // Without row_probabilities, with window_reduce kMax: [h * num_slots + j] = the largest
  // Prob(h, r, j) over the observed rows. Empty otherwise.
  std::span<const float> window_max;
  // With value_norms: [kv_head * num_slots + j] = ||v_j||. Empty otherwise.
  std::span<const float> value_norms;

  float Prob(int32_t head, int32_t row, int32_t slot) const {
    return probs[(int64_t{head} * num_rows + row) * num_slots + slot];
  }
  std::span<const float> Row(int32_t head, int32_t row) const {
    return probs.subspan((int64_t{head} * num_rows + row) * num_slots, num_slots);
  }
};

struct KeepPlan;

// Which absolute position each (layer, KV head, slot) holds. Maintained by the machinery
// (prefill, plans, decode appends); read by policies.
class SlotPositions {
 public:
  SlotPositions() = default;
  SlotPositions(int32_t num_layers, int32_t num_kv_heads);

  int32_t num_layers() const { return static_cast<int32_t>(heads_.size()); }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t num_slots(int32_t layer) const {
    return static_cast<int32_t>(heads_[layer][0].size());
  }
  std::span<const int32_t> Positions(int32_t layer, int32_t kv_head) const {
    return heads_[layer][kv_head];
  }
  // Every (layer, head) gains slots for positions [first, first + count).
  void AppendRange(int32_t first, int32_t count);
  // Applies a validated plan (a merged entry keeps its anchor's position).
  void Apply(const KeepPlan& plan);
  void Clear();

 private:
  int32_t num_kv_heads_ = 0;
  std::vector<std::vector<std::vector<int32_t>>> heads_;  // [layer][kv_head][slot]
};

// ---------------------------------------------------------------------------------------------
// What the policy returns: a KeepPlan (cache/keep_plan.h).

// A decode step just ran: the token at `position` has its K/V appended as the last slot of
// every (layer, head) (slot_positions already includes it).
struct DecodeStep {
  int32_t position = 0;     // absolute position of the token whose K/V was just written
  int32_t tokens_seen = 0;  // prompt + tokens whose K/V were written (= position + 1)
  const SlotPositions* slots = nullptr;
  // When WantsDecodeAttention(): per layer, the new token's attention probabilities,
  // [h * num_slots(layer) + j], over the slots as they were when it attended (same as now).
  std::span<const std::vector<float>> attention;
};

// A prompt plan of SnapKV's shape, which a device can decide and apply by itself
// (cache/scoring_backend.h, WindowTopKRequest): per layer, keep[layer] slots per KV head, the
// last `window` prompt slots among them and the rest the best of the window rows' column sums,
// pooled and folded as named.
struct WindowTopKSpec {
  int32_t window = 1;
  int32_t kernel = 1;
  Pooling pooling = Pooling::kAvg;
  GroupAggregation aggregation = GroupAggregation::kMean;
  std::vector<int32_t> keep;  // per layer; >= the prompt's length keeps the layer whole
};

// ---------------------------------------------------------------------------------------------
// The policy.

class CompressionPolicy {
 public:
  virtual ~CompressionPolicy() = default;

  virtual std::string name() const = 0;

  // Which rows to observe during prefill.
  virtual ObservationRequest Observation() const = 0;
  // Once per layer, in layer order, after the whole prompt is in the cache.
  virtual absl::Status ObserveLayer(const ObservationAttention& attention) = 0;
  // After the last ObserveLayer: what every layer keeps. May return an empty plan (keep all).
  virtual absl::StatusOr<KeepPlan> Plan() = 0;

  // Lookahead: how many decode steps the policy observes before its prompt plan. 0 (the
  // default): Plan() is asked right after the last ObserveLayer. N > 0: the machinery runs the
  // first N decode steps on the whole prompt, hands each one's attention to OnDecodeStep (so
  // WantsDecodeAttention must be true until then) and asks Plan() after the N-th; the plan then
  // covers the prompt and those N tokens. Their queries are the reply's own, a better guide to
  // what the rest of the reply reads than the prompt's last rows; the price is holding the
  // uncompressed prompt N steps longer (admission counts prompt + N as the peak).
  virtual int32_t LookaheadSteps() const { return 0; }

  // Decode-time eviction. When true the machinery computes each decode token's attention
  // probabilities per layer (an extra QK pass) and passes them to OnDecodeStep.
  virtual bool WantsDecodeAttention() const { return false; }
  // Whether OnDecodeStep may ever return a non-empty plan (admission counts on it).
  virtual bool EvictsDuringDecode() const { return false; }
  // After every decode step (K/V of the new token appended). A non-empty plan is applied at
  // once; during a lookahead (LookaheadSteps) it must return an empty plan. Policies should
  // evict in batches (e.g. a block's worth) to amortise the compaction.
  virtual absl::StatusOr<KeepPlan> OnDecodeStep(const DecodeStep& step) { return KeepPlan{}; }

  // Decode-time selection without eviction (TokenSelect); null for none. Owned by the policy.
  virtual AttentionSelector* selector() { return nullptr; }
  // The forward backend's scoring (cache/scoring_backend.h), handed over before the first
  // ObserveLayer. Its host threads are idle while the policy observes and plans (the
  // compression hooks run between forwards), so per-head work may be split over them
  // (threads(), ForEachHead in scoring_helpers.h). TokenSelect's selector votes through it
  // inside Select: the forward calls Select on the engine thread between kernels, when the
  // threads are idle. Overrides must call this one.
  virtual void UseScoring(ScoringBackend* scoring) { scoring_ = scoring; }

  // Non-null when the prompt plan is exactly a WindowTopKSpec (no lookahead, nothing else
  // observed): a forward on a device may then decide and compact each layer itself while it
  // runs, and Plan() is not asked. Owned by the policy.
  virtual const WindowTopKSpec* window_top_k() const { return nullptr; }

  // For admission: an upper bound on the slots, summed over layers, that the sequence holds
  // after compression once `generated` tokens have been appended. The default assumes every
  // layer keeps at most max(1, budget * prompt) tokens plus everything generated.
  virtual int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const;

 protected:
  CompressionPolicy(const PolicyConfig& config, const PolicyContext& context)
      : config_(config), context_(context) {}
  const PolicyConfig& config() const { return config_; }
  const PolicyContext& context() const { return context_; }
  const ModelDims& dims() const { return context_.dims; }
  const PromptLayout& layout() const { return context_.layout; }
  // The host threads of the backend UseScoring handed over, or null (then everything runs on
  // the calling thread).
  kernels::ThreadPool* threads() const {
    return scoring_ != nullptr ? &scoring_->host_threads() : nullptr;
  }

 private:
  PolicyConfig config_;
  PolicyContext context_;
  ScoringBackend* scoring_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Registry.

using PolicyFactory = std::function<absl::StatusOr<std::unique_ptr<CompressionPolicy>>(
    const PolicyConfig&, const PolicyContext&)>;

// "" and "none" mean no compression and give a null policy. Unknown names, a budget outside
// (0, 1] and bad parameters are InvalidArgument naming the field (compression.policy,
// compression.budget, compression.params.<name> or compression.options.<name>).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePolicy(const std::string& name,
                                                                 const PolicyConfig& config,
                                                                 const PolicyContext& context);
// Sorted names CreatePolicy accepts, "none" included.
std::vector<std::string> KnownPolicies();

}  // namespace winnow::cache::policies
