#include "cache/compression.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention_scores.h"

namespace winnow::cache {
namespace {

// Adds the time from its construction to its destruction (an early return too) into `into`.
class PhaseClock {
 public:
  explicit PhaseClock(absl::Duration& into) : into_(into), start_(absl::Now()) {}
  ~PhaseClock() { into_ += absl::Now() - start_; }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

 private:
  absl::Duration& into_;
  absl::Time start_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionSession>> CompressionSession::Create(
    const std::string& policy, const policies::PolicyConfig& config,
    const policies::PolicyContext& context, int32_t first_position) {
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<policies::CompressionPolicy> created,
                          policies::CreatePolicy(policy, config, context));
  if (created == nullptr) return std::unique_ptr<CompressionSession>();
  return std::unique_ptr<CompressionSession>(
      new CompressionSession(policy, std::move(created), context, first_position));
}

CompressionSession::CompressionSession(std::string name,
                                       std::unique_ptr<policies::CompressionPolicy> policy,
                                       const policies::PolicyContext& context,
                                       int32_t first_position)
    : name_(std::move(name)),
      policy_(std::move(policy)),
      dims_(context.dims),
      num_tokens_(context.layout.num_tokens),
      base_position_(first_position),
      slots_(context.dims.num_layers, context.dims.num_kv_heads) {
  observe_ = policy_->Observation();
  observe_.window_begin = std::clamp(observe_.window_begin, 0, num_tokens_);
  window_rows_.resize(dims_.num_layers);
  if (!observe_.accumulate_all_rows && policy_->LookaheadSteps() == 0) {
    device_spec_ = policy_->window_top_k();
    if (device_spec_ != nullptr &&
        static_cast<int32_t>(device_spec_->keep.size()) != dims_.num_layers) {
      device_spec_ = nullptr;  // not this model's: plan on the host
    }
  }
  // Rows read one by one (row_probabilities) come to the host; sums and norms need not.
  device_scores_ = device_spec_ == nullptr && !observe_.row_probabilities &&
                   (observe_.window_begin < num_tokens_ || observe_.value_norms);
  if (observe_.accumulate_all_rows) {
    column_sums_.assign(dims_.num_layers,
                        std::vector<float>(static_cast<size_t>(dims_.num_heads) * num_tokens_));
  }
}

QueryCapture* CompressionSession::PrefillCapture(int32_t start, int32_t count) {
  // With a probe, the context's own rows are not observed: the probe's are.
  if (compressed_ || !probe_.empty()) return nullptr;
  const int32_t window_begin = base_position_ + observe_.window_begin;
  const int32_t first = observe_.accumulate_all_rows ? start : std::max(start, window_begin);
  if (first >= start + count || first >= num_tokens()) return nullptr;
  capture_.Clear();
  capture_.first_position = first;
  capture_.host_from = std::max(first, window_begin);
  if (observe_.accumulate_all_rows) {
    // Fold each layer's rows into the column sums as soon as the forward has them, so a long
    // chunk never holds every layer's query rows at once; only window rows stay.
    capture_.layer_done = [this](int32_t layer, const SequenceKv& kv, ScoringBackend& scoring) {
      AccumulateLayer(layer, kv, scoring);
    };
    capture_.fold = kernels::ColumnReduce::kSum;
  } else {
    capture_.layer_done = nullptr;
    capture_.fold.reset();
  }
  // The device can plan while the forward runs when this chunk holds the whole window and
  // completes the prompt (every layer then holds every key when its attention is done).
  capture_.device_plan = nullptr;
  device_layers_ = 0;
  if (start <= window_begin && start + count == num_tokens()) {
    if (device_spec_ != nullptr) {
      device_kept_.assign(dims_.num_layers, {});
      capture_.device_plan = [this](int32_t layer, const SequenceKv& kv,
                                    ScoringBackend& scoring) {
        PlanLayerOnDevice(layer, kv, scoring);
      };
    } else if (device_scores_) {
      device_window_sums_.assign(dims_.num_layers, {});
      device_value_norms_.assign(dims_.num_layers, {});
      capture_.device_plan = [this](int32_t layer, const SequenceKv& kv,
                                    ScoringBackend& scoring) {
        ScoreLayerOnDevice(layer, kv, scoring);
      };
    }
  }
  return &capture_;
}

void CompressionSession::PlanLayerOnDevice(int32_t layer, const SequenceKv& kv,
                                           ScoringBackend& scoring) {
  ++device_layers_;
  const int32_t keep = device_spec_->keep[layer];
  if (keep >= num_tokens_) return;  // the layer stays whole
  const int32_t rows = capture_.device_rows.count;
  if (kv.num_slots(layer) != num_tokens_ || rows == 0 || capture_.device_rows.q == nullptr) {
    capture_status_.Update(absl::InternalError(absl::StrCat(
        "compression: device plan of layer ", layer, " without the whole prompt or its rows")));
    return;
  }
  std::vector<int32_t> visible(rows);
  const std::span<const int32_t> positions =
      std::span<const int32_t>(capture_.positions).last(rows);
  for (int32_t r = 0; r < rows; ++r) visible[r] = positions[r] + 1;
  device_kept_[layer].assign(static_cast<size_t>(dims_.num_kv_heads) * keep, 0);
  WindowTopKRequest request;
  request.block_table = kv.block_table(layer);
  request.num_slots = num_tokens_;
  request.device_rows = capture_.device_rows;
  request.visible = visible;
  request.num_heads = dims_.num_heads;
  request.scale = dims_.AttentionScale();
  request.window = device_spec_->window;
  request.kernel = device_spec_->kernel;
  request.pooling = device_spec_->pooling;
  request.folding = device_spec_->aggregation;
  request.keep = keep;
  request.kept_slots = device_kept_[layer].data();
  PhaseClock clock(stats_.time.scoring);
  capture_status_.Update(scoring.CompactToWindowTopK(request));
}

kernels::ScoreInput CompressionSession::LayerScoreInput(const SequenceKv& kv, int32_t layer,
                                                       std::span<const int32_t> visible,
                                                       const float* q) const {
  kernels::ScoreInput in;
  in.block_table = kv.block_table(layer).data();
  in.num_slots = kv.num_slots(layer);
  in.q = q;
  in.num_rows = static_cast<int32_t>(visible.size());
  in.visible = visible.data();
  in.num_heads = dims_.num_heads;
  in.scale = dims_.AttentionScale();
  return in;
}

void CompressionSession::ScoreLayerOnDevice(int32_t layer, const SequenceKv& kv,
                                            ScoringBackend& scoring) {
  ++device_layers_;
  const int32_t window = num_tokens_ - observe_.window_begin;
  const DeviceRows& rows = capture_.device_rows;
  if (kv.num_slots(layer) != num_tokens_ || rows.count < window ||
      (window > 0 && rows.q == nullptr)) {
    capture_status_.Update(absl::InternalError(absl::StrCat(
        "compression: device scores of layer ", layer, " without the whole prompt or its rows")));
    return;
  }
  PhaseClock clock(stats_.time.scoring);
  if (window > 0) {  // (device_scores_: the policy reads the window rows only as their sum)
    std::vector<int32_t> visible(window);
    for (int32_t r = 0; r < window; ++r) visible[r] = observe_.window_begin + r + 1;
    kernels::ScoreInput in = LayerScoreInput(kv, layer, visible, /*q=*/nullptr);
    in.reduce = observe_.window_reduce;
    std::vector<float>& sums = device_window_sums_[layer];
    sums.resize(static_cast<size_t>(dims_.num_heads) * num_tokens_);
    capture_status_.Update(scoring.ColumnSumsDeferred(in, sums.data(), rows.Last(window)));
  }
  if (observe_.value_norms) {
    std::vector<float>& norms = device_value_norms_[layer];
    norms.resize(static_cast<size_t>(dims_.num_kv_heads) * num_tokens_);
    capture_status_.Update(
        scoring.ValueNormsDeferred(kv.block_table(layer), num_tokens_, norms.data()));
  }
}

void CompressionSession::AccumulateLayer(int32_t layer, const SequenceKv& kv,
                                         ScoringBackend& scoring) {
  std::vector<float>& rows_q = capture_.per_layer[layer];
  const int64_t row_floats = int64_t{dims_.num_heads} * dims_.head_dim;
  // A device forward leaves the chunk's rows on the device and gives the host only the window's.
  const bool on_device = capture_.device_rows.q != nullptr;
  const int32_t rows = on_device ? capture_.device_rows.count
                                 : static_cast<int32_t>(rows_q.size() / row_floats);
  if (rows == 0) return;
  // Rows are appended at layer 0 first, so positions already lists this chunk's rows.
  const std::span<const int32_t> positions =
      std::span<const int32_t>(capture_.positions).last(rows);
  std::vector<int32_t> visible(rows);
  for (int32_t r = 0; r < rows; ++r) visible[r] = VisibleSlots(layer, positions[r]);
  kernels::ScoreInput in =
      LayerScoreInput(kv, layer, visible, on_device ? nullptr : rows_q.data());
  // Every prompt row's attention is summed (accumulate_all_rows); a probe's rows stand for the
  // window's and fold as the policy asked.
  if (probing_) in.reduce = observe_.window_reduce;
  // Complete once the forward returns (a device backend waits once for every layer's), and
  // folded into the sums by AfterPrefillChunk. Called from inside the forward, which has no way
  // to take an error: the first one is kept for AfterPrefillChunk to return.
  const size_t sums_size = static_cast<size_t>(dims_.num_heads) * in.num_slots;
  if (capture_.folded_layer == layer) {  // the forward's attention folded them already
    if (capture_.folded.size() != sums_size || in.reduce != capture_.fold) {
      capture_status_.Update(absl::InternalError(
          absl::StrCat("compression: layer ", layer, "'s folded rows do not fit its slots")));
      return;
    }
    chunk_sums_.push_back(
        {layer, in.num_slots, BaseSlots(layer), in.reduce, std::move(capture_.folded)});
    capture_.folded = {};
    capture_.folded_layer = -1;
  } else {
    chunk_sums_.push_back(
        {layer, in.num_slots, BaseSlots(layer), in.reduce, std::vector<float>(sums_size)});
    capture_status_.Update(
        scoring.ColumnSumsDeferred(in, chunk_sums_.back().sums.data(), capture_.device_rows));
  }
  if (on_device) return;  // the host got the window rows only
  // Keep only the observation-window rows of this layer.
  int32_t before_window = 0;
  while (before_window < rows &&
         positions[before_window] < base_position_ + observe_.window_begin) {
    ++before_window;
  }
  rows_q.erase(rows_q.begin(), rows_q.begin() + before_window * row_floats);
  if (probing_) rows_q.clear();  // a probe's rows are only ever summed
}

void CompressionSession::FoldChunkSums() {
  // The sums are laid out over the whole prompt; keys beyond this chunk stay untouched, and a
  // probe segment's rows score only its range.
  int32_t begin = 0, end = num_tokens_;
  if (probing_) {
    begin = probe_[probe_segments_done_].scored_begin;
    end = probe_[probe_segments_done_].scored_end;
  }
  for (const ChunkSums& chunk : chunk_sums_) {
    std::vector<float>& sums = column_sums_[chunk.layer];
    const int32_t n = std::min(chunk.num_slots - chunk.first_slot, end);
    for (int32_t h = 0; h < dims_.num_heads; ++h) {
      const float* from = chunk.sums.data() + int64_t{h} * chunk.num_slots + chunk.first_slot;
      float* to = sums.data() + int64_t{h} * num_tokens_;
      if (chunk.reduce == kernels::ColumnReduce::kMax) {
        for (int32_t j = begin; j < n; ++j) to[j] = std::max(to[j], from[j]);
      } else {
        for (int32_t j = begin; j < n; ++j) to[j] += from[j];
      }
    }
  }
  chunk_sums_.clear();
}

absl::Status CompressionSession::AfterPrefillChunk() {
  if (!capture_status_.ok()) {
    chunk_sums_.clear();
    return capture_status_;
  }
  FoldChunkSums();
  const int32_t rows = capture_.num_rows();
  if (rows == 0) return absl::OkStatus();
  if (device_layers_ > 0) {
    // The device planned, or scored the window, from its own rows; only their positions came to
    // the host.
    if (device_layers_ != dims_.num_layers) {
      return absl::InternalError("compression: the device saw some layers, not all");
    }
    for (int32_t position : capture_.positions) {
      // (Only unstaged sessions plan on the device: positions are the session's own.)
      if (position >= observe_.window_begin) window_positions_.push_back(position);
    }
    capture_.Clear();
    return absl::OkStatus();
  }
  if (static_cast<int32_t>(capture_.per_layer.size()) != dims_.num_layers) {
    return absl::InternalError("compression: query capture has the wrong number of layers");
  }
  const int64_t row_floats = int64_t{dims_.num_heads} * dims_.head_dim;
  int32_t first_window_row = 0;
  while (first_window_row < rows &&
         capture_.positions[first_window_row] < base_position_ + observe_.window_begin) {
    ++first_window_row;
  }
  for (int32_t r = first_window_row; r < rows; ++r) {
    window_positions_.push_back(capture_.positions[r] - base_position_);
  }
  // Accumulating captures already dropped the rows before the window, layer by layer.
  const int64_t skip = observe_.accumulate_all_rows ? 0 : first_window_row * row_floats;
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    const std::vector<float>& src = capture_.per_layer[l];
    if (static_cast<int64_t>(src.size()) != (rows - first_window_row) * row_floats + skip) {
      return absl::InternalError("compression: captured rows out of step across layers");
    }
    window_rows_[l].insert(window_rows_[l].end(), src.begin() + skip, src.end());
  }
  capture_.Clear();
  return absl::OkStatus();
}

absl::Status CheckProbeSupported(const std::string& name,
                                 const policies::CompressionPolicy& policy, int32_t num_tokens) {
  const policies::ObservationRequest observe = policy.Observation();
  if (observe.row_probabilities || observe.accumulate_all_rows ||
      observe.window_begin >= num_tokens || policy.LookaheadSteps() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression.probe: policy ", name,
        " does not score the context by its observation window's folded attention, so it "
        "cannot score it with a probe (kvzip, snapkv, pyramidkv, xkv and winnowkv can)"));
  }
  return absl::OkStatus();
}

std::span<const float> CompressionSession::StageColumns(std::vector<float>& scores,
                                                        int32_t rows, int32_t layer) const {
  const int64_t base = BaseSlots(layer);
  if (base == 0) return scores;
  const int64_t slots = base + num_tokens_;
  for (int64_t r = 0; r < rows; ++r) {  // each row moves down, never over one not yet moved
    std::copy_n(scores.begin() + r * slots + base, num_tokens_, scores.begin() + r * num_tokens_);
  }
  scores.resize(static_cast<size_t>(rows) * num_tokens_);
  return scores;
}

absl::Status CompressionSession::CheckStaged() const {
  if (observe_.row_probabilities || observe_.accumulate_all_rows ||
      policy_->LookaheadSteps() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression.scope: policy ", name_,
        " cannot compress a context in stages (kvzip, snapkv, pyramidkv, xkv and winnowkv can)"));
  }
  return absl::OkStatus();
}

absl::Status CompressionSession::StartAfter(const policies::SlotPositions& history,
                                            const SequenceKv& kv) {
  if (compressed_ || probing_ || staged() || base_position_ <= 0 ||
      history.num_layers() != dims_.num_layers) {
    return absl::InternalError(
        "compression: a stage started after the prefill, twice, or at the prompt's start");
  }
  WINNOW_RETURN_IF_ERROR(CheckStaged());
  base_slots_.resize(dims_.num_layers);
  for (int32_t l = 0; l < dims_.num_layers; ++l) base_slots_[l] = history.num_slots(l);
  slots_ = history;
  // The device paths plan and score a whole prompt's slots; a stage's are scored on the host.
  device_spec_ = nullptr;
  device_scores_ = false;
  return CheckTrackedSlots(kv);
}

absl::Status CompressionSession::SetProbe(std::vector<ProbeSegment> segments) {
  const bool bad_segment =
      std::any_of(segments.begin(), segments.end(), [this](const ProbeSegment& s) {
        return s.tokens.empty() || s.scored_begin < 0 || s.scored_begin > s.scored_end ||
               s.scored_end > num_tokens_;
      });
  if (compressed_ || probing_ || segments.empty() || bad_segment) {
    return absl::InternalError(
        "compression: a probe set after the prefill, empty, or scoring outside the context");
  }
  WINNOW_RETURN_IF_ERROR(CheckProbeSupported(name_, *policy_, num_tokens_));
  probe_ = std::move(segments);
  // The probe runs as its own forwards after the context: nothing is planned or scored while
  // the context's last chunk runs.
  device_spec_ = nullptr;
  device_scores_ = false;
  column_sums_.assign(dims_.num_layers,
                      std::vector<float>(static_cast<size_t>(dims_.num_heads) * num_tokens_));
  return absl::OkStatus();
}

int32_t CompressionSession::ProbeFootprint() const {
  size_t longest = 0;
  for (const ProbeSegment& segment : probe_) longest = std::max(longest, segment.tokens.size());
  return static_cast<int32_t>(longest);
}

QueryCapture* CompressionSession::ProbeCapture(int32_t start, int32_t count) {
  capture_.Clear();
  capture_.first_position = start;
  capture_.host_from = start + count;  // every row is consumed by layer_done
  capture_.device_plan = nullptr;
  device_layers_ = 0;
  probing_ = true;
  capture_.layer_done = [this](int32_t layer, const SequenceKv& kv, ScoringBackend& scoring) {
    AccumulateLayer(layer, kv, scoring);
  };
  capture_.fold = observe_.window_reduce;
  return &capture_;
}

absl::Status CompressionSession::AfterProbeChunk() {
  capture_.Clear();
  if (!capture_status_.ok()) {
    chunk_sums_.clear();
    return capture_status_;
  }
  // The sums span the context and the probe so far; the context's slots are folded.
  FoldChunkSums();
  return absl::OkStatus();
}

absl::Status CompressionSession::EndProbeSegment(SequenceKv& kv, BlockPool& pool) {
  if (!probe_pending()) return absl::InternalError("compression: no probe segment to end");
  const int32_t segment = static_cast<int32_t>(probe_[probe_segments_done_].tokens.size());
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    const int32_t context = BaseSlots(l) + num_tokens_;
    if (kv.num_slots(l) != context + segment) {
      return absl::InternalError(absl::StrCat("compression: layer ", l, " holds ",
                                              kv.num_slots(l), " slots after a probe segment, not ",
                                              context + segment));
    }
    kv.Truncate(pool, l, context);
  }
  probing_ = false;
  if (++probe_segments_done_ < probe_.size()) return absl::OkStatus();
  probed_ = true;
  // The probe's scores stand for the window's: the policy sees the window's rows as observed.
  window_positions_.clear();
  for (int32_t p = observe_.window_begin; p < num_tokens_; ++p) window_positions_.push_back(p);
  return absl::OkStatus();
}

absl::StatusOr<CompactionStats> CompressionSession::Compress(SequenceKv& kv, BlockPool& pool,
                                                             ScoringBackend& scoring) {
  if (compressed_) return absl::InternalError("compression: Compress called twice");
  if (probe_pending()) return absl::InternalError("compression: Compress before the probe");
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    if (kv.num_slots(l) != BaseSlots(l) + num_tokens_) {
      return absl::InternalError(absl::StrCat("compression: layer ", l, " holds ",
                                              kv.num_slots(l), " slots, not ", BaseSlots(l),
                                              " before the context and its ", num_tokens_,
                                              " tokens"));
    }
  }
  compressed_ = true;
  if (!staged()) slots_.Clear();  // (a stage's holds the earlier stages' kept slots)
  slots_.AppendRange(base_position_, num_tokens_);
  if (device_layers_ > 0 && device_spec_ != nullptr) return FinishDevicePlan(kv, pool, scoring);

  LayerScores scores;
  policy_->UseScoring(&scoring);
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    WINNOW_RETURN_IF_ERROR(ObserveLayer(l, kv, scoring, scores));
  }

  stats_.prefill_tokens = num_tokens_;
  if (policy_->LookaheadSteps() > 0) {
    // The plan waits for the reply's first tokens (AfterDecodeStep).
    lookahead_left_ = policy_->LookaheadSteps();
    return CompactionStats{};
  }
  return ApplyPromptPlan(kv, pool);
}

absl::Status CompressionSession::ObserveLayer(int32_t l, const SequenceKv& kv,
                                              ScoringBackend& scoring, LayerScores& scores) {
  const int32_t rows = static_cast<int32_t>(window_positions_.size());
  std::vector<int32_t> visible(rows);
  for (int32_t r = 0; r < rows; ++r) {
    visible[r] = VisibleSlots(l, base_position_ + window_positions_[r]);
  }
  policies::ObservationAttention attention;
  attention.layer = l;
  attention.num_heads = dims_.num_heads;
  attention.num_kv_heads = dims_.num_kv_heads;
  attention.num_rows = rows;
  attention.num_slots = num_tokens_;
  attention.row_positions = window_positions_;
  const bool scored_on_device = device_layers_ > 0;  // every layer (AfterPrefillChunk checked)
  // The window rows folded on each key, as the policy asked (window_sums or window_max).
  std::span<const float>& window_scores =
      observe_.window_reduce == kernels::ColumnReduce::kMax ? attention.window_max
                                                            : attention.window_sums;
  if (!probe_.empty()) {
    window_scores = column_sums_[l];
  } else if (rows > 0 && scored_on_device) {
    window_scores = device_window_sums_[l];
  } else if (rows > 0) {
    kernels::ScoreInput in = LayerScoreInput(kv, l, visible, window_rows_[l].data());
    in.reduce = observe_.window_reduce;
    PhaseClock clock(stats_.time.scoring);
    if (observe_.row_probabilities) {
      // One layer at a time: the transient is num_heads x rows x num_tokens floats.
      scores.probs.assign(static_cast<size_t>(dims_.num_heads) * rows * num_tokens_, 0.0f);
      scores.log_normalizer.assign(static_cast<size_t>(dims_.num_heads) * rows, 0.0f);
      WINNOW_RETURN_IF_ERROR(scoring.AttentionProbabilities(in, scores.probs.data(),
                                                            scores.log_normalizer.data()));
      attention.probs = scores.probs;
      attention.log_normalizer = scores.log_normalizer;
    } else {
      // Only the rows' sum (or maximum): num_heads x slots floats, never the rows; a stage's
      // policy sees its own tokens' columns.
      scores.window_sums.assign(static_cast<size_t>(dims_.num_heads) * in.num_slots, 0.0f);
      WINNOW_RETURN_IF_ERROR(scoring.AccumulateAttentionColumns(in, scores.window_sums.data(),
                                                                DeviceRows{}));
      window_scores = StageColumns(scores.window_sums, dims_.num_heads, l);
    }
  }
  if (observe_.accumulate_all_rows) attention.column_sums = column_sums_[l];
  std::vector<float> value_norms;
  if (observe_.value_norms && scored_on_device) {
    attention.value_norms = device_value_norms_[l];
  } else if (observe_.value_norms) {
    const int32_t slots = BaseSlots(l) + num_tokens_;
    value_norms.resize(static_cast<size_t>(dims_.num_kv_heads) * slots);
    PhaseClock clock(stats_.time.scoring);
    WINNOW_RETURN_IF_ERROR(scoring.ValueNorms(kv.block_table(l), slots, value_norms.data()));
    attention.value_norms = StageColumns(value_norms, dims_.num_kv_heads, l);
  }
  {
    PhaseClock clock(stats_.time.planning);
    WINNOW_RETURN_IF_ERROR(policy_->ObserveLayer(attention));
  }
  // The window rows of this layer and its scores are no longer needed.
  std::vector<float>().swap(window_rows_[l]);
  if (scored_on_device) {
    std::vector<float>().swap(device_window_sums_[l]);
    std::vector<float>().swap(device_value_norms_[l]);
  }
  if (!column_sums_.empty()) std::vector<float>().swap(column_sums_[l]);
  return absl::OkStatus();
}

absl::StatusOr<CompactionStats> CompressionSession::FinishDevicePlan(SequenceKv& kv,
                                                                     BlockPool& pool,
                                                                     ScoringBackend& scoring) {
  {
    PhaseClock clock(stats_.time.scoring);
    WINNOW_RETURN_IF_ERROR(scoring.Flush());
  }
  stats_.prefill_tokens = num_tokens_;
  policies::KeepPlan plan;
  plan.layers.resize(dims_.num_layers);
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    const std::vector<int32_t>& kept = device_kept_[l];
    if (kept.empty()) continue;  // kept whole
    const int64_t keep = static_cast<int64_t>(kept.size()) / dims_.num_kv_heads;
    policies::LayerKeep& layer = plan.layers[l];
    layer.heads.resize(dims_.num_kv_heads);
    for (int32_t g = 0; g < dims_.num_kv_heads; ++g) {
      layer.heads[g].assign(kept.begin() + g * keep, kept.begin() + (g + 1) * keep);
    }
  }
  std::vector<std::vector<int32_t>>().swap(device_kept_);
  return ApplyPlan(plan, kv, pool, /*data_moved=*/true);
}

absl::StatusOr<CompactionStats> CompressionSession::ApplyPromptPlan(SequenceKv& kv,
                                                                    BlockPool& pool) {
  absl::StatusOr<policies::KeepPlan> planned;
  {
    PhaseClock clock(stats_.time.planning);
    planned = policy_->Plan();
  }
  WINNOW_RETURN_IF_ERROR(planned.status());
  if (staged()) {
    // The policy planned the stage's own slots: shift them past the earlier stages', all kept.
    for (int32_t l = 0; l < static_cast<int32_t>(planned->layers.size()); ++l) {
      for (std::vector<int32_t>& kept : planned->layers[l].heads) {
        for (int32_t& slot : kept) slot += base_slots_[l];
        std::vector<int32_t> earlier(base_slots_[l]);
        std::iota(earlier.begin(), earlier.end(), 0);
        kept.insert(kept.begin(), earlier.begin(), earlier.end());
      }
    }
  }
  policies::KeepSlidingWindows(*planned, dims_, [&](int32_t l) { return kv.num_slots(l); });
  return ApplyPlan(*planned, kv, pool, /*data_moved=*/false);
}

absl::StatusOr<CompactionStats> CompressionSession::ApplyPlan(const policies::KeepPlan& plan,
                                                              SequenceKv& kv, BlockPool& pool,
                                                              bool data_moved) {
  stats_.slots_before = 0;
  for (int32_t l = 0; l < dims_.num_layers; ++l) stats_.slots_before += kv.num_slots(l);
  absl::StatusOr<CompactionStats> applied;
  {
    PhaseClock clock(stats_.time.compaction);
    applied = ApplyKeepPlan(plan, kv, pool, data_moved);
  }
  if (!applied.ok()) {
    return absl::InternalError(absl::StrCat("compression: policy ", name_,
                                            "'s plan could not be applied: ",
                                            applied.status().message()));
  }
  slots_.Apply(plan);
  stats_.kept_per_layer.resize(dims_.num_layers);
  stats_.slots_after = 0;
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    stats_.kept_per_layer[l] = kv.num_slots(l);
    stats_.slots_after += kv.num_slots(l);
  }
  stats_.slots_evicted += applied->slots_removed;
  stats_.blocks_freed += applied->blocks_freed;
  return *applied;
}

std::vector<std::vector<float>>* CompressionSession::DecodeAttentionBuffer() {
  if (!compressed_ || !policy_->WantsDecodeAttention()) return nullptr;
  return &decode_attention_;
}

absl::Status CompressionSession::AdoptCompressed(const policies::SlotPositions& positions,
                                                 const SequenceKv& kv) {
  if (compressed_ || lookahead_left_ > 0 || positions.num_layers() != dims_.num_layers) {
    return absl::InternalError("compression: a compressed context adopted by the wrong session");
  }
  slots_ = positions;
  WINNOW_RETURN_IF_ERROR(CheckTrackedSlots(kv));
  compressed_ = true;
  stats_.prefill_tokens = num_tokens();
  stats_.slots_before = int64_t{num_tokens()} * dims_.num_layers;
  stats_.kept_per_layer.resize(dims_.num_layers);
  stats_.slots_after = 0;
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    stats_.kept_per_layer[l] = kv.num_slots(l);
    stats_.slots_after += kv.num_slots(l);
  }
  return absl::OkStatus();
}

absl::Status CompressionSession::AfterUncompressedTokens(int32_t start, int32_t count,
                                                         const SequenceKv& kv) {
  if (!compressed_) return absl::InternalError("compression: tokens after the context before it");
  slots_.AppendRange(start, count);
  return CheckTrackedSlots(kv);
}

absl::Status CompressionSession::CheckTrackedSlots(const SequenceKv& kv) const {
  for (int32_t l = 0; l < dims_.num_layers; ++l) {
    if (slots_.num_slots(l) != kv.num_slots(l)) {
      return absl::InternalError(absl::StrCat("compression: layer ", l, " holds ",
                                              kv.num_slots(l), " slots but ",
                                              slots_.num_slots(l), " are tracked"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CompactionStats> CompressionSession::AfterDecodeStep(int32_t position,
                                                                    SequenceKv& kv,
                                                                    BlockPool& pool) {
  if (!compressed_) return absl::InternalError("compression: decode step before Compress");
  slots_.AppendRange(position, 1);
  WINNOW_RETURN_IF_ERROR(CheckTrackedSlots(kv));
  policies::DecodeStep step;
  step.position = position;
  step.tokens_seen = position + 1;
  step.slots = &slots_;
  if (policy_->WantsDecodeAttention()) step.attention = decode_attention_;
  absl::StatusOr<policies::KeepPlan> planned;
  {
    PhaseClock clock(stats_.time.planning);
    planned = policy_->OnDecodeStep(step);
  }
  WINNOW_RETURN_IF_ERROR(planned.status());
  policies::KeepPlan& plan = *planned;
  if (lookahead_left_ > 0) {
    if (!plan.empty()) {
      return absl::InternalError(
          absl::StrCat("compression: policy ", name_, " evicted during its lookahead"));
    }
    if (--lookahead_left_ > 0) return CompactionStats{};
    return ApplyPromptPlan(kv, pool);
  }
  if (plan.empty()) return CompactionStats{};
  policies::KeepSlidingWindows(plan, dims_, [&](int32_t l) { return kv.num_slots(l); });
  absl::StatusOr<CompactionStats> applied;
  {
    PhaseClock clock(stats_.time.compaction);
    applied = ApplyKeepPlan(plan, kv, pool);
  }
  if (!applied.ok()) {
    return absl::InternalError(absl::StrCat("compression: policy ", name_,
                                            "'s decode plan could not be applied: ",
                                            applied.status().message()));
  }
  slots_.Apply(plan);
  stats_.slots_evicted += applied->slots_removed;
  stats_.blocks_freed += applied->blocks_freed;
  ++stats_.decode_compactions;
  return *applied;
}

}  // namespace winnow::cache
