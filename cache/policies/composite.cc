#include "cache/policies/composite.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/policies/aircache.h"
#include "cache/policies/layer_budget_split.h"
#include "cache/policies/vl_cache.h"
#include "cache/policies/xkv.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace winnow::cache::policies {
namespace {

using Allocation = CompositeOptions::Allocation;
using Scorer = CompositeOptions::Scorer;

// The observed rows: post-span text with spans (unless post_span is off), else the last
// `window` tokens.
WindowRange CompositeWindow(const PromptLayout& layout, const CompositeOptions& o) {
  if (!o.post_span) {
    const int32_t size = std::clamp(o.window, 1, std::max(1, layout.num_tokens));
    return WindowRange{layout.num_tokens - size, layout.num_tokens};
  }
  return ObservationWindow(layout, o.window, o.min_window, o.max_window);
}

// Each evicted slot joins the nearest kept slot (the left one on a tie) when that slot is a
// scored candidate; next to a forced slot (sink, window, kept text) it is simply dropped, so
// the groups stay ascending and disjoint.
std::vector<std::vector<int32_t>> MergeGroups(std::span<const int32_t> kept, int32_t n,
                                              const std::vector<char>& forced) {
  std::vector<std::vector<int32_t>> groups(kept.size());
  size_t next = 0;  // first kept slot > s
  for (int32_t s = 0; s < n; ++s) {
    while (next < kept.size() && kept[next] <= s) ++next;
    if (next > 0 && kept[next - 1] == s) {
      groups[next - 1].push_back(s);
      continue;
    }
    const bool has_left = next > 0;
    const bool has_right = next < kept.size();
    if (!has_left && !has_right) continue;
    size_t nearest = has_left ? next - 1 : next;
    if (has_left && has_right && kept[next] - s < s - kept[next - 1]) nearest = next;
    if (!forced[kept[nearest]]) groups[nearest].push_back(s);
  }
  return groups;
}

class CompositePolicy : public CompressionPolicy {
 public:
  CompositePolicy(std::string name, const PolicyConfig& config, const PolicyContext& context,
                  const CompositeOptions& options)
      : CompressionPolicy(config, context), name_(std::move(name)), options_(options) {
    const int32_t n = context.layout.num_tokens;
    const int32_t layers = context.dims.num_layers;
    // Kept text is paid first, whatever the budget (AirCache's rule).
    const bool keep_text = context.layout.HasCompressibleSpans() && !options.evict_text;
    int32_t per_layer = KeepCount(config.budget(), n);
    window_ = CompositeWindow(context.layout, options);
    int32_t sinks = std::min(
        std::max(options.sinks, static_cast<int32_t>(std::lround(options.sink_frac * per_layer))),
        n);
    if (!keep_text && sinks + window_.size() > per_layer) {
      // A budget smaller than the sinks and window: the first sinks (at least one, the
      // attention sink) and a shorter window, observed and kept.
      sinks = std::clamp(sinks, 0, per_layer - 1);
      window_.begin = std::max(window_.begin, n - (per_layer - sinks));
    }
    sinks_ = sinks;
    forced_.assign(n, 0);
    for (int32_t j = 0; j < sinks; ++j) forced_[j] = 1;
    for (int32_t j = window_.begin; j < n; ++j) forced_[j] = 1;
    if (keep_text) {
      for (int32_t j = 0; j < n; ++j) forced_[j] |= !context.layout.IsCompressible(j);
    }
    for (int32_t j = 0; j < n; ++j) {
      (forced_[j] ? forced_list_ : candidates_).push_back(j);
    }
    // The trim above leaves sinks + window within the budget; kept text may exceed it.
    const int32_t forced = forced_count();
    if (keep_text) per_layer = std::max(forced, per_layer);
    // Uncompressed first layers take n slots each out of the request's total.
    // Fewer of them when the budget cannot pay for them.
    const auto scored_total = [&](int32_t full) {
      return int64_t{layers} * per_layer - int64_t{full} * n -
             int64_t{layers - full} * forced;
    };
    full_layers_ = std::clamp(options.full_layers, 0, layers - 1);
    while (full_layers_ > 0 && scored_total(full_layers_) < 0) --full_layers_;
    candidate_budget_ = std::max<int64_t>(0, scored_total(full_layers_));
    compresses_ = per_layer < n;
    scores_.resize(layers);
    if (options.mass_merge) masses_.resize(layers);
    normalised_.assign(static_cast<size_t>(layers) * candidates_.size(), 0.0f);
    sparsity_.assign(layers, 0.0);
    strength_.assign(layers, 0.0);
    skewness_.assign(layers, 0.0);
    observed_.assign(layers, 0);
    deferred_.resize(layers);
  }

  std::string name() const override { return name_; }

  ObservationRequest Observation() const override {
    ObservationRequest request{window_.begin, options_.scorer != Scorer::kWindow};
    request.value_norms = options_.value_norm;
    // Every scorer sums all window rows; only VL-Cache's sparsity allocation reads them one by
    // one.
    request.row_probabilities = options_.allocation == Allocation::kSparsity;
    return request;
  }

  absl::Status ObserveLayer(const ObservationAttention& attention) override {
    WINNOW_RETURN_IF_ERROR(
        CheckObservation(name_, attention, dims(), layout().num_tokens, window_.size()));
    const int32_t n = attention.num_slots;
    if (options_.scorer != Scorer::kWindow &&
        attention.column_sums.size() != static_cast<size_t>(attention.num_heads) * n) {
      return absl::InternalError(
          absl::StrCat("composite: layer ", attention.layer, " has no column sums"));
    }
    if (options_.value_norm &&
        attention.value_norms.size() != static_cast<size_t>(attention.num_kv_heads) * n) {
      return absl::InternalError(
          absl::StrCat("composite: layer ", attention.layer, " has no value norms"));
    }
    observed_[attention.layer] = 1;
    if (!compresses_) return absl::OkStatus();
    if (LookaheadSteps() > 0) {
      Defer(attention);
      return absl::OkStatus();
    }
    ScoreLayer(attention);
    return absl::OkStatus();
  }

  int32_t LookaheadSteps() const override { return compresses_ ? options_.lookahead : 0; }
  bool WantsDecodeAttention() const override { return lookahead_seen_ < LookaheadSteps(); }

  // During the lookahead: the reply token's attention joins the observed rows' sums.
  absl::StatusOr<KeepPlan> OnDecodeStep(const DecodeStep& step) override {
    if (lookahead_seen_ >= LookaheadSteps()) return KeepPlan{};
    const int32_t n = layout().num_tokens;
    const int32_t heads = dims().num_heads;
    if (static_cast<int32_t>(step.attention.size()) != dims().num_layers) {
      return absl::InternalError("composite: a lookahead step came without its attention");
    }
    for (int32_t l = 0; l < dims().num_layers; ++l) {
      const int32_t slots = step.slots->num_slots(l);
      const std::vector<float>& probs = step.attention[l];
      if (static_cast<int64_t>(probs.size()) != int64_t{heads} * slots || slots < n) {
        return absl::InternalError(
            absl::StrCat("composite: lookahead attention of layer ", l, " has the wrong size"));
      }
      std::vector<float>& sums = deferred_[l].window_sums;
      for (int32_t h = 0; h < heads; ++h) {
        const float* row = probs.data() + int64_t{h} * slots;
        float* dst = sums.data() + int64_t{h} * n;
        for (int32_t j = 0; j < n; ++j) dst[j] += row[j];
      }
    }
    ++lookahead_seen_;
    return KeepPlan{};
  }

  absl::StatusOr<KeepPlan> Plan() override {
    const int32_t n = layout().num_tokens;
    if (!compresses_) return KeepPlan{};
    WINNOW_RETURN_IF_ERROR(CheckEveryLayerObserved(name_, observed_));
    if (lookahead_seen_ < LookaheadSteps()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "composite: plan asked after ", lookahead_seen_, " of ", LookaheadSteps(),
          " lookahead steps"));
    }
    if (LookaheadSteps() > 0) ScoreDeferredLayers();
    const std::vector<int32_t> counts = Allocate();
    spdlog::debug("composite: {} scored tokens kept per layer [{}] of {}", candidate_budget_,
                  fmt::join(counts, ", "), candidates_.size());
    return PlanPerLayer(scores_, [&](int32_t l, std::span<const float> scores)
                                     -> std::optional<LayerKeep> {
      const int32_t keep_count = forced_count() + counts[l];
      if (keep_count >= n) return std::nullopt;
      return KeepLayer(l, scores, keep_count);
    });
  }

  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    const int64_t layers = dims().num_layers;
    if (!compresses_) return KeepAllSlots(dims().num_layers, prompt_tokens, generated);
    return int64_t{full_layers_} * prompt_tokens + (layers - full_layers_) * forced_count() +
           candidate_budget_ + layers * generated;
  }

 private:
  int32_t forced_count() const { return static_cast<int32_t>(forced_list_.size()); }

  // One layer's keep set: the forced slots and the best candidates, keep_count per KV head;
  // with `merge`, the evicted slots' groups, with `mass_merge` the observed masses; after a
  // lookahead, the reply's tokens too.
  LayerKeep KeepLayer(int32_t layer, std::span<const float> scores, int32_t keep_count) const {
    const int32_t n = layout().num_tokens;
    LayerKeep keep = PerHeadTopK(scores, dims().num_kv_heads, n, forced_list_, keep_count,
                                 threads(), options_.neighbours, options_.neighbour_share);
    if (options_.merge) {
      for (const std::vector<int32_t>& kept : keep.heads) {
        keep.merge.push_back(MergeGroups(kept, n, forced_));
      }
    }
    // The lookahead's tokens (slots n.. of an uncompressed layer) are the reply: kept.
    for (size_t h = 0; h < keep.heads.size(); ++h) {
      for (int32_t j = n; j < n + lookahead_seen_; ++j) {
        keep.heads[h].push_back(j);
        if (options_.merge) keep.merge[h].push_back({j});
      }
    }
    if (options_.mass_merge) AddMasses(layer, keep);
    return keep;
  }

  // The observed rows' attention on every slot of the layer (the reply's slots after a
  // lookahead: 0, they are kept), and the scored slots as the ones that absorb the evicted:
  // the sinks and the window keep their own values.
  void AddMasses(int32_t layer, LayerKeep& keep) const {
    const int32_t n = layout().num_tokens;
    for (int32_t h = 0; h < dims().num_kv_heads; ++h) {
      const auto row = masses_[layer].begin() + int64_t{h} * n;
      std::vector<float>& mass = keep.mass.emplace_back(row, row + n);
      mass.resize(n + lookahead_seen_, 0.0f);
    }
    keep.absorb_begin = sinks_;
    keep.absorb_end = window_.begin;
    keep.min_similarity = static_cast<float>(options_.mass_merge_similarity);
  }

  // A layer's observation kept for the plan after the lookahead (the window rows only as their
  // sum, to which the reply's rows are added).
  struct DeferredLayer {
    std::vector<float> window_sums;  // [h][slot]
    std::vector<float> column_sums;  // [h][slot], scorer accumulated/hybrid
    std::vector<float> value_norms;  // [kv_head][slot], value_norm
  };

  void Defer(const ObservationAttention& attention) {
    DeferredLayer& d = deferred_[attention.layer];
    d.window_sums = SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false, threads());
    d.column_sums.assign(attention.column_sums.begin(), attention.column_sums.end());
    d.value_norms.assign(attention.value_norms.begin(), attention.value_norms.end());
  }

  // The deferred layers scored with the reply's rows added to the window's.
  void ScoreDeferredLayers() {
    for (int32_t l = 0; l < dims().num_layers; ++l) {
      DeferredLayer& d = deferred_[l];
      ObservationAttention attention;
      attention.layer = l;
      attention.num_heads = dims().num_heads;
      attention.num_kv_heads = dims().num_kv_heads;
      attention.num_rows = window_.size() + lookahead_seen_;
      attention.num_slots = layout().num_tokens;
      attention.window_sums = d.window_sums;
      attention.column_sums = d.column_sums;
      attention.value_norms = d.value_norms;
      ScoreLayer(attention);
      d = DeferredLayer{};
    }
  }

  // One layer's per-KV-head scores for the plan, and its inputs to the layer allocation.
  void ScoreLayer(const ObservationAttention& attention) {
    const int32_t n = attention.num_slots;
    const std::vector<float> pooled = PooledScores(attention);
    const std::vector<float> layer_scores = CandidateLayerScores(pooled, attention.num_heads);
    RecordAllocationInputs(attention, layer_scores);
    if (options_.mass_merge) {
      masses_[attention.layer] = AggregateGroups(
          SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false, threads()),
          attention.num_heads, attention.num_kv_heads, n, GroupAggregation::kMean);
    }
    scores_[attention.layer] = AggregateGroups(pooled, attention.num_heads,
                                               attention.num_kv_heads, n, options_.aggregation);
  }

  // Per query head, the scorer's row over every slot, pooled over the keys before the window
  // (the window is kept anyway; pooling across its edge would lend it mass): [h][n].
  std::vector<float> PooledScores(const ObservationAttention& attention) const {
    const int32_t n = attention.num_slots;
    const int32_t heads = attention.num_heads;
    const int32_t prefix = window_.begin;
    std::vector<float> raw;
    switch (options_.scorer) {
      case Scorer::kWindow:
        raw = SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false, threads());
        break;
      case Scorer::kAccumulated:
        raw = AllRowSums(attention);
        break;
      case Scorer::kHybrid: {
        raw = AllRowSums(attention);
        const std::vector<float> window =
            SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false, threads());
        for (int32_t h = 0; h < heads; ++h) {
          std::span<float> all_rows = std::span<float>(raw).subspan(int64_t{h} * n, prefix);
          std::vector<float> observed(window.begin() + int64_t{h} * n,
                                      window.begin() + int64_t{h} * n + prefix);
          NormalizeSum(all_rows);
          NormalizeSum(observed);
          for (int32_t j = 0; j < prefix; ++j) all_rows[j] += observed[j];
        }
        break;
      }
    }
    if (options_.value_norm) WeightByValueNorms(attention, raw);
    ForEachHead(threads(), heads, [&](int32_t h) {
      std::span<float> row = std::span<float>(raw).subspan(int64_t{h} * n, prefix);
      const std::vector<float> pooled = Pool1d(row, options_.kernel, options_.pooling);
      std::copy(pooled.begin(), pooled.end(), row.begin());
    });
    return raw;
  }

  // scores[h][j] *= ||v_j|| of query head h's KV head.
  static void WeightByValueNorms(const ObservationAttention& attention,
                                 std::vector<float>& scores) {
    const int32_t n = attention.num_slots;
    const int32_t group = attention.num_heads / attention.num_kv_heads;
    for (int32_t h = 0; h < attention.num_heads; ++h) {
      const float* norms = attention.value_norms.data() + int64_t{h / group} * n;
      float* row = scores.data() + int64_t{h} * n;
      for (int32_t j = 0; j < n; ++j) row[j] *= norms[j];
    }
  }

  // Every prompt row's summed attention per (query head, key); with `normalize`, divided by the
  // rows that saw the key.
  std::vector<float> AllRowSums(const ObservationAttention& attention) const {
    const int32_t n = attention.num_slots;
    std::vector<float> sums(attention.column_sums.begin(), attention.column_sums.end());
    if (options_.normalize) {
      for (int32_t h = 0; h < attention.num_heads; ++h) {
        for (int32_t j = 0; j < n; ++j) sums[int64_t{h} * n + j] /= static_cast<float>(n - j);
      }
    }
    return sums;
  }

  // The layer's score of each candidate: the mean over query heads, normalised to sum 1.
  std::vector<float> CandidateLayerScores(std::span<const float> pooled, int32_t heads) const {
    const int32_t n = layout().num_tokens;
    const std::vector<float> mean = MeanOverHeads(pooled, heads, n);
    std::vector<float> out(candidates_.size());
    for (size_t i = 0; i < candidates_.size(); ++i) out[i] = mean[candidates_[i]];
    NormalizeSum(out);
    return out;
  }

  void RecordAllocationInputs(const ObservationAttention& attention,
                              std::span<const float> layer_scores) {
    const int32_t l = attention.layer;
    std::copy(layer_scores.begin(), layer_scores.end(),
              normalised_.begin() + int64_t{l} * candidates_.size());
    if (options_.allocation == Allocation::kSparsity) {
      sparsity_[l] = VlCacheLayerSparsity(attention, options_.p);
    } else if (options_.allocation == Allocation::kStrengthSkew) {
      // Strength: the observed rows' attention mass on the candidates, per row and head.
      const std::vector<float> summed =
          SumObservedRows(attention, 0, attention.num_rows, /*mean=*/false);
      const std::vector<float> mean = MeanOverHeads(summed, attention.num_heads,
                                                    attention.num_slots);
      double mass = 0.0;
      for (int32_t j : candidates_) mass += mean[j];
      strength_[l] = mass / std::max(1, attention.num_rows);
      skewness_[l] = AirCacheSkewness(layer_scores);
    }
  }

  // Candidate tokens kept per layer, summing to at most candidate_budget_ over the compressed
  // layers; the full layers keep every candidate. A sliding layer keeps its share of what it
  // reads, the rest goes to the full-attention ones (SpillPastWindows, on the counts with the
  // forced slots).
  std::vector<int32_t> Allocate() const {
    const int32_t full = full_layers_;
    std::vector<int32_t> counts(full, static_cast<int32_t>(candidates_.size()));
    const std::vector<int32_t> rest = AllocateCompressed(full);
    counts.insert(counts.end(), rest.begin(), rest.end());
    for (int32_t& c : counts) c += forced_count();
    counts = SpillPastWindows(std::move(counts), dims(), layout().num_tokens, forced_count());
    for (int32_t& c : counts) c = std::max(0, c - forced_count());
    return counts;
  }

  // The allocation over layers [first, L).
  std::vector<int32_t> AllocateCompressed(int32_t first) const {
    const int32_t layers = dims().num_layers - first;
    const int32_t candidates = static_cast<int32_t>(candidates_.size());
    const double total = static_cast<double>(candidate_budget_);
    std::vector<double> targets(layers, total / layers);
    switch (options_.allocation) {
      case Allocation::kUniform:
        break;
      case Allocation::kGlobal:
        return XkvAllocate(std::span<const float>(normalised_).subspan(
                               static_cast<size_t>(first) * candidates),
                           layers, candidates, candidate_budget_, 0, 0.0)
            .counts;
      case Allocation::kNeediest:
        targets = NeediestHeadShares(NormalisedHeadCandidates(first), dims().num_kv_heads,
                                     candidate_budget_);
        break;
      case Allocation::kPyramid: {
        const int32_t forced = forced_count();
        const std::vector<int32_t> with_forced = PyramidBudgets(
            layers, layout().num_tokens, forced + static_cast<int32_t>(candidate_budget_ / layers),
            forced, options_.beta);
        for (int32_t l = 0; l < layers; ++l) targets[l] = std::max(0, with_forced[l] - forced);
        break;
      }
      case Allocation::kSparsity: {
        std::vector<double> density(layers);
        for (int32_t l = 0; l < layers; ++l) density[l] = 1.0 - sparsity_[first + l];
        targets = WaterFill(density, total, 0.0, candidates);
        break;
      }
      case Allocation::kStrengthSkew:
        targets = WaterFill(
            AirCacheLayerWeights(std::span<const double>(strength_).subspan(first),
                                 std::span<const double>(skewness_).subspan(first),
                                 AirCacheOptions::Allocation::kStrengthSkew),
            total, 0.0, candidates);
        break;
    }
    return RoundBudgets(targets, candidate_budget_, 0, candidates);
  }

  // Layers [first, L)'s candidate scores per KV head, each head's normalised to sum 1 (its
  // share of its own importance, comparable across heads and layers as `global`'s layer shares
  // are): [layer] kv_heads x candidates.
  std::vector<std::vector<float>> NormalisedHeadCandidates(int32_t first) const {
    const int32_t n = layout().num_tokens;
    const int32_t heads = dims().num_kv_heads;
    std::vector<std::vector<float>> out;
    for (int32_t l = first; l < dims().num_layers; ++l) {
      std::vector<float>& layer = out.emplace_back();
      for (int32_t g = 0; g < heads; ++g) {
        std::vector<float> head(candidates_.size());
        for (size_t i = 0; i < candidates_.size(); ++i) {
          head[i] = scores_[l][int64_t{g} * n + candidates_[i]];
        }
        NormalizeSum(head);
        layer.insert(layer.end(), head.begin(), head.end());
      }
    }
    return out;
  }

  std::string name_;
  CompositeOptions options_;
  WindowRange window_;
  std::vector<char> forced_;           // [slot] always kept
  std::vector<int32_t> forced_list_;   // ascending
  std::vector<int32_t> candidates_;    // ascending: the scored, evictable slots
  int32_t full_layers_ = 0;            // uncompressed first layers
  int64_t candidate_budget_ = 0;       // candidates kept, summed over the compressed layers
  bool compresses_ = false;
  std::vector<std::vector<float>> scores_;  // [layer][kv_head][slot]
  std::vector<std::vector<float>> masses_;  // [layer][kv_head][slot] (mass_merge)
  int32_t sinks_ = 0;                       // forced leading slots
  std::vector<float> normalised_;           // [layer][candidate], each layer summing to 1
  std::vector<double> sparsity_;            // [layer] (allocation=sparsity)
  std::vector<double> strength_;            // [layer] (allocation=strength_skew)
  std::vector<double> skewness_;            // [layer] (allocation=strength_skew)
  std::vector<char> observed_;              // [layer]
  std::vector<DeferredLayer> deferred_;     // [layer] (lookahead)
  int32_t lookahead_seen_ = 0;              // lookahead steps observed so far
};

}  // namespace

absl::StatusOr<CompositeOptions> ParseCompositeOptions(const PolicyConfig& config) {
  CompositeOptions o;
  WINNOW_RETURN_IF_ERROR(config.ReadChoice<Allocation>(
      "allocation", &o.allocation,
      {{"uniform", Allocation::kUniform}, {"pyramid", Allocation::kPyramid},
       {"global", Allocation::kGlobal}, {"neediest", Allocation::kNeediest},
       {"sparsity", Allocation::kSparsity},
       {"strength_skew", Allocation::kStrengthSkew}}));
  WINNOW_RETURN_IF_ERROR(config.ReadChoice<Scorer>(
      "scorer", &o.scorer,
      {{"window", Scorer::kWindow}, {"accumulated", Scorer::kAccumulated},
       {"hybrid", Scorer::kHybrid}}));
  WINNOW_RETURN_IF_ERROR(ReadWindowParams(config, &o.window, &o.min_window, &o.max_window));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("post_span", &o.post_span));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("sinks", &o.sinks, 0, 1 << 16));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("sink_frac", &o.sink_frac, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("full_layers", &o.full_layers, 0, 1 << 10));
  WINNOW_RETURN_IF_ERROR(ReadPoolingParams(config, &o.kernel, &o.pooling, &o.aggregation));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("normalize", &o.normalize));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("evict_text", &o.evict_text));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("merge", &o.merge));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("mass_merge", &o.mass_merge));
  WINNOW_RETURN_IF_ERROR(
      config.ReadDouble("mass_merge_similarity", &o.mass_merge_similarity, -1.0, 1.0));
  if (o.merge && o.mass_merge) {
    return absl::InvalidArgumentError(
        "compression.params.mass_merge: not with merge (an evicted token joins one group)");
  }
  WINNOW_RETURN_IF_ERROR(config.ReadBool("value_norm", &o.value_norm));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("neighbours", &o.neighbours, 0, 64));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("neighbour_share", &o.neighbour_share, 0.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("lookahead", &o.lookahead, 0, 1024));
  if (o.lookahead > 0 && o.allocation == Allocation::kSparsity) {
    return absl::InvalidArgumentError(
        "compression.params.lookahead: not with allocation 'sparsity', which reads the "
        "observed rows one by one");
  }
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("beta", &o.beta, 1.0, 1e6));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("p", &o.p, 0.0, 1.0));
  return o;
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateNamedComposite(
    const std::string& name, const PolicyConfig& config, const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const CompositeOptions options, ParseCompositeOptions(config));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed(name));
  if (options.mass_merge && !context.dims.logit_bias) {
    return absl::InvalidArgumentError(
        "compression.params.mass_merge: this worker's KV cache has no per-slot logit bias "
        "(the CUDA attention does not read one yet; the CPU worker's does)");
  }
  return std::make_unique<CompositePolicy>(name, config, context, options);
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateCompositePolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  return CreateNamedComposite("composite", config, context);
}

const PolicyParams& WinnowKvPreset() {
  static const PolicyParams* preset = new PolicyParams{
      {"allocation", std::string("global")}, {"scorer", std::string("window")},
      {"window", 32.0}, {"sinks", 4.0}, {"kernel", 7.0}, {"pooling", std::string("avg")},
      {"gqa", std::string("mean")}, {"neighbours", 8.0}, {"neighbour_share", 0.5}};
  return *preset;
}

const PolicyParams& WinnowKvDocsPreset() {
  static const PolicyParams* preset = new PolicyParams{
      {"allocation", std::string("global")}, {"scorer", std::string("hybrid")},
      {"window", 32.0}, {"sinks", 4.0}, {"sink_frac", 0.3}, {"pooling", std::string("none")},
      {"gqa", std::string("mean")}, {"value_norm", std::string("true")}};
  return *preset;
}

namespace {

// The preset's params, then the request's on top.
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePreset(const std::string& name,
                                                                const PolicyParams& preset,
                                                                const PolicyConfig& config,
                                                                const PolicyContext& context) {
  PolicyParams params = preset;
  for (const auto& [key, value] : config.params()) params[key] = value;
  return CreateNamedComposite(name, PolicyConfig(config.budget(), std::move(params)), context);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateWinnowKvPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  return CreatePreset("winnowkv", WinnowKvPreset(), config, context);
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateWinnowKvDocsPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  return CreatePreset("winnowkv_docs", WinnowKvDocsPreset(), config, context);
}

}  // namespace winnow::cache::policies
