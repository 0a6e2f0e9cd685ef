// The per-request compression machinery the engine drives: it owns the request's policy,
// captures observation query rows during prefill, runs the scoring kernel per layer after the
// last prefill chunk, applies the policy's plans by compaction (blocks freed at once) and
// forwards decode steps to the policy. One session per prefill: after a preemption the engine
// creates a new one, so the re-prefilled sequence is compressed again.
//
// Engine protocol, per sequence:
//   prefill chunk:  entry.capture = PrefillCapture(start, count); Forward; AfterPrefillChunk();
//   after the chunk that completes the prefill: Compress(scoring);
//   decode step:    entry.attention_probs = DecodeAttentionBuffer();
//                   entry.selector = selector(); Forward; AfterDecodeStep(position).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/attention_selector.h"
#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/compression_times.h"
#include "cache/policies/policy.h"
#include "cache/probe_segment.h"
#include "cache/query_capture.h"
#include "cache/sequence_kv.h"
#include "cache/scoring_backend.h"
#include "kernels/cpu/attention_scores.h"

namespace winnow::cache {

struct CompressionStats {
  int32_t prefill_tokens = 0;          // tokens the prefill compression ran on
  int64_t slots_before = 0;            // summed over layers, just before it
  int64_t slots_after = 0;             // summed over layers, just after it
  std::vector<int32_t> kept_per_layer;  // slots per layer just after it
  int64_t slots_evicted = 0;           // summed over layers, prefill + decode evictions
  int32_t blocks_freed = 0;            // prefill + decode compactions
  int32_t decode_compactions = 0;
  CompressionPhaseTimes time;          // summed over the session's hooks
};

// OK when `policy` (named `name`) can score a context of `num_tokens` with a probe
// (CompressionSession::SetProbe): it reads its observation window only as the window rows'
// folded attention (summed or maximum), plans without a lookahead and needs no other rows.
// InvalidArgument naming compression.probe otherwise.
absl::Status CheckProbeSupported(const std::string& name,
                                 const policies::CompressionPolicy& policy, int32_t num_tokens);

class CompressionSession {
 public:
  // Not copyable or movable: the capture's hook points back at the session.
  CompressionSession(const CompressionSession&) = delete;
  CompressionSession& operator=(const CompressionSession&) = delete;

  // Null (and OK) for "" / "none". InvalidArgument naming the field for an unknown policy, a
  // budget outside (0, 1] or bad params. `first_position`: where the tokens it compresses start
  // in the prompt (a later stage of a context; its policy's context counts only those tokens).
  static absl::StatusOr<std::unique_ptr<CompressionSession>> Create(
      const std::string& policy, const policies::PolicyConfig& config,
      const policies::PolicyContext& context, int32_t first_position = 0);

  const std::string& policy_name() const { return name_; }
  // The prefill's hooks are done (Compress ran): from here on the sequence decodes. The prompt
  // plan may still be pending (a lookahead policy).
  bool compressed() const { return compressed_; }
  // A lookahead policy's prompt plan is not applied yet (decode steps left to observe).
  bool prompt_plan_pending() const { return lookahead_left_ > 0; }
  // The first prompt position whose query row the policy observes: the prefill of positions
  // before it may be skipped (prefix cache) without changing the policy's decisions.
  int32_t FirstObservedPosition() const {
    return base_position_ + (observe_.accumulate_all_rows ? 0 : observe_.window_begin);
  }
  // The first position of the observation window when a device forward may plan this prompt or
  // score its window while it runs (QueryCapture::device_plan: a chunk that completes the prompt
  // and holds the whole window), else -1. The scheduler keeps the window in one chunk for it.
  int32_t DeviceWindowBegin() const {
    return device_spec_ != nullptr || device_scores_ ? base_position_ + observe_.window_begin
                                                     : -1;
  }
  // The prompt position where what this session compresses ends (the prompt's length, the
  // context's, or this stage's end), and where it starts (0, or this stage's start).
  int32_t num_tokens() const { return base_position_ + num_tokens_; }
  int32_t first_position() const { return base_position_; }
  policies::CompressionPolicy& policy() { return *policy_; }
  const policies::SlotPositions& slot_positions() const { return slots_; }
  const CompressionStats& stats() const { return stats_; }

  // --- Prefill. ---
  // The capture to attach to the chunk of prompt positions [start, start + count), or null
  // when the chunk has no row to observe.
  QueryCapture* PrefillCapture(int32_t start, int32_t count);
  // After that chunk's forward: accumulates column sums (if the policy wants them) and keeps the
  // observation-window rows for Compress.
  absl::Status AfterPrefillChunk();
  // After the chunk that completed the prefill (every layer holds the whole prompt): scores each
  // layer, asks the policy for its plan and compacts. Returns what was freed. With a lookahead
  // (CompressionPolicy::LookaheadSteps) the plan is asked for and applied by the AfterDecodeStep
  // of the lookahead's last step instead, and this frees nothing.
  // `scoring` is the forward backend's (where the K/V are); the policy keeps it for its
  // decode-time work (CompressionPolicy::UseScoring).
  absl::StatusOr<CompactionStats> Compress(SequenceKv& kv, BlockPool& pool,
                                           ScoringBackend& scoring);

  // Instead of the prefill: the context this session compresses was attached already compressed
  // (cache/compressed_prefix.h) with these kept slots (of every stage up to this session's);
  // the session goes on as if it had compressed it itself (its stats say so; nothing was
  // freed). Internal unless `positions` matches the cache and the session has not started.
  absl::Status AdoptCompressed(const policies::SlotPositions& positions, const SequenceKv& kv);

  // --- A stage (a context compressed in parts, each after the ones before). ---
  // Before the prefill of a session created with a first_position: the earlier stages are in
  // `kv`, compressed to `history`. They stay as they are: the stage's tokens are prefilled after
  // them and attend to them, its rows' (or probe's) attention is computed over every slot, and
  // the policy plans from the columns of the stage's own tokens, its plan shifted past the
  // earlier slots. Fails as CheckStaged does.
  absl::Status StartAfter(const policies::SlotPositions& history, const SequenceKv& kv);
  // OK when the policy can compress a stage: InvalidArgument naming compression.scope for one
  // that reads rows one by one, every row, or after a lookahead (only a window's folded scores
  // are cut to a stage's columns).
  absl::Status CheckStaged() const;
  // Each layer's first slot a compaction of this session may rewrite: a stage's earlier slots
  // stay where they are (empty: every slot).
  std::span<const int32_t> FirstRewrittenSlots() const { return base_slots_; }

  // --- A probe (a context scored with other rows than its own). ---
  // Scores the context with `segments` of tokens run after it instead of with its own last rows:
  // each segment alone, at the positions right after the context (it attends to the context and
  // to itself), its K/V dropped before the next. Each key's score is its segment's rows'
  // attention to it (the segment whose scored range holds it), folded over those rows as the
  // policy's window_reduce asks; it stands for the observation window's (the policy sees it as
  // its window_sums or window_max). InvalidArgument naming compression.probe for a policy that
  // reads its window otherwise (row by row, every row, or on the device); Internal for an empty
  // segment or a scored range outside the context. Before the prefill.
  absl::Status SetProbe(std::vector<ProbeSegment> segments);
  // The probe is still to run: after the context's prefill, before Compress.
  bool probe_pending() const { return !probe_.empty() && !probed_; }
  const std::vector<ProbeSegment>& probe_segments() const { return probe_; }
  // The most slots the probe adds to the context at once: its longest segment.
  int32_t ProbeFootprint() const;
  // The capture for a segment's tokens [start, start + count) (positions after the context).
  QueryCapture* ProbeCapture(int32_t start, int32_t count);
  // After a forward of probe tokens with ProbeCapture: folds their attention to the context.
  absl::Status AfterProbeChunk();
  // After a segment's last forward: drops its K/V (the cache holds the context again); after
  // the last segment the probe is done.
  absl::Status EndProbeSegment(SequenceKv& kv, BlockPool& pool);

  // --- Decode. ---
  // Where the forward writes the decode token's attention probabilities; null unless the policy
  // wants them.
  std::vector<std::vector<float>>* DecodeAttentionBuffer();
  AttentionSelector* selector() { return policy_->selector(); }
  // After a decode forward wrote the K/V of the token at `position`: lets the policy evict.
  absl::StatusOr<CompactionStats> AfterDecodeStep(int32_t position, SequenceKv& kv,
                                                  BlockPool& pool);
  // After a forward wrote the K/V of `count` tokens from `start` that follow a compressed
  // context (the rest of the prompt, with context_tokens): they are tracked, kept whole, and
  // not shown to the policy, which cannot act on them (the engine refuses such policies).
  absl::Status AfterUncompressedTokens(int32_t start, int32_t count, const SequenceKv& kv);

  // Admission: slots (summed over layers) held after compression once `generated` tokens were
  // appended.
  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const {
    return policy_->SteadyStateSlots(prompt_tokens, generated);
  }
  bool EvictsDuringDecode() const { return policy_->EvictsDuringDecode(); }
  int32_t LookaheadSteps() const { return policy_->LookaheadSteps(); }

 private:
  CompressionSession(std::string name, std::unique_ptr<policies::CompressionPolicy> policy,
                     const policies::PolicyContext& context, int32_t first_position);
  // Asks the policy for its prompt plan, compacts, and records the compression's stats.
  absl::StatusOr<CompactionStats> ApplyPromptPlan(SequenceKv& kv, BlockPool& pool);
  // Applies a prompt plan (compacting unless the device already has: `data_moved`) and records
  // the compression's stats.
  absl::StatusOr<CompactionStats> ApplyPlan(const policies::KeepPlan& plan, SequenceKv& kv,
                                            BlockPool& pool, bool data_moved);
  // The capture's device_plan hook: `layer`'s plan decided and applied on the device.
  void PlanLayerOnDevice(int32_t layer, const SequenceKv& kv, ScoringBackend& scoring);
  // The capture's device_plan hook for a policy that plans on the host from summed window
  // scores: `layer`'s window sums and value norms asked for on the device, without a wait.
  void ScoreLayerOnDevice(int32_t layer, const SequenceKv& kv, ScoringBackend& scoring);
  // Layer l's scores for the policy (window rows' scores, column sums, value norms) and its
  // ObserveLayer; `scores` is reused across layers (the window's transients).
  struct LayerScores {
    std::vector<float> probs, log_normalizer, window_sums;
  };
  absl::Status ObserveLayer(int32_t l, const SequenceKv& kv, ScoringBackend& scoring,
                            LayerScores& scores);
  // A stage's earlier slots in `layer` (0 unstaged), and how many slots a row at prompt
  // `position` of this session's tokens (or of the probe after them) sees there.
  bool staged() const { return !base_slots_.empty(); }
  int32_t BaseSlots(int32_t layer) const { return staged() ? base_slots_[layer] : 0; }
  int32_t VisibleSlots(int32_t layer, int32_t position) const {
    return BaseSlots(layer) + (position - base_position_) + 1;
  }
  // `scores` (`rows` rows over every slot of `layer`) cut down, in place, to the columns of this
  // session's tokens.
  std::span<const float> StageColumns(std::vector<float>& scores, int32_t rows,
                                      int32_t layer) const;
  // Compress after the device planned every layer: the kept slots come back, the tables shrink.
  absl::StatusOr<CompactionStats> FinishDevicePlan(SequenceKv& kv, BlockPool& pool,
                                                   ScoringBackend& scoring);
  // The capture's per-layer hook: asks for the column sums of `layer`'s captured rows.
  void AccumulateLayer(int32_t layer, const SequenceKv& kv, ScoringBackend& scoring);
  // Adds chunk_sums_ into column_sums_, or takes the maximum (after the forward that asked for
  // them); a probe chunk's only over its segment's scored range.
  void FoldChunkSums();
  // The scoring kernels' input for `visible.size()` rows (`q`: host float rows, or null when
  // the backend has them) over every slot of `layer`.
  kernels::ScoreInput LayerScoreInput(const SequenceKv& kv, int32_t layer,
                                      std::span<const int32_t> visible, const float* q) const;
  // Internal unless every layer's tracked slot positions match the cache's slot count.
  absl::Status CheckTrackedSlots(const SequenceKv& kv) const;

  std::string name_;
  std::unique_ptr<policies::CompressionPolicy> policy_;
  policies::ModelDims dims_;
  int32_t num_tokens_ = 0;     // the tokens it compresses
  int32_t base_position_ = 0;  // a stage's first position (StartAfter)
  std::vector<int32_t> base_slots_;  // a stage's earlier slots per layer; empty unstaged
  policies::ObservationRequest observe_;
  bool compressed_ = false;
  int32_t lookahead_left_ = 0;  // decode steps before the prompt plan

  // The probe (SetProbe): its segments, how many have run, whether it is done, and whether its
  // chunks are running. Its attention to the context is folded into column_sums_ as the
  // window's scores.
  std::vector<ProbeSegment> probe_;
  size_t probe_segments_done_ = 0;
  bool probed_ = false;
  bool probing_ = false;

  QueryCapture capture_;
  absl::Status capture_status_;  // the first error of a layer_done hook
  std::vector<std::vector<float>> window_rows_;  // [layer] rows x num_heads x head_dim
  std::vector<int32_t> window_positions_;  // relative to base_position_
  std::vector<std::vector<float>> column_sums_;  // [layer] num_heads x num_tokens
  // This chunk's column sums per layer, asked for during the forward and complete after it
  // (ScoringBackend::ColumnSumsDeferred); folded into column_sums_ by AfterPrefillChunk.
  struct ChunkSums {
    int32_t layer = 0;
    int32_t num_slots = 0;
    int32_t first_slot = 0;  // the first of the session's tokens' columns
    kernels::ColumnReduce reduce = kernels::ColumnReduce::kSum;  // how it folds in
    std::vector<float> sums;  // num_heads x num_slots
  };
  std::vector<ChunkSums> chunk_sums_;
  std::vector<std::vector<float>> decode_attention_;
  // The policy's WindowTopKSpec when it has one (and no lookahead), the layers the device has
  // planned during the last prefill chunk, and each one's kept slots (num_kv_heads x keep,
  // written by ScoringBackend::Flush; empty for a layer kept whole).
  const policies::WindowTopKSpec* device_spec_ = nullptr;
  int32_t device_layers_ = 0;
  std::vector<std::vector<int32_t>> device_kept_;
  // Without a device plan, whether a device forward may score the window while it runs (the
  // policy sums window rows, or reads value norms), and each layer's results (written by
  // ScoringBackend::Flush; Compress reads them when every layer was scored there).
  bool device_scores_ = false;
  std::vector<std::vector<float>> device_window_sums_;  // [layer] num_heads x num_tokens
  std::vector<std::vector<float>> device_value_norms_;  // [layer] num_kv_heads x num_tokens
  policies::SlotPositions slots_;
  CompressionStats stats_;
};

}  // namespace winnow::cache
