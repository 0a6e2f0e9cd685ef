#include "cache/policies/tokenselect.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "base/status_macros.h"
#include "cache/policies/scoring_helpers.h"
#include "kernels/cpu/simd.h"

namespace winnow::cache::policies {
namespace {

// The paper's default attended set, 128 initial + 2048 selected + 512 local tokens: with a
// budget-derived total the windows keep these proportions (capped by their params).
constexpr int64_t kPaperInit = 128;
constexpr int64_t kPaperLocal = 512;
constexpr int64_t kPaperTotal = 128 + 2048 + 512;

double Cosine(std::span<const float> a, std::span<const float> b) {
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += double{a[i]} * b[i];
    na += double{a[i]} * a[i];
    nb += double{b[i]} * b[i];
  }
  if (na == 0.0 || nb == 0.0) return -1.0;  // no direction: never a hit
  return dot / std::sqrt(na * nb);
}

}  // namespace

TokenSelectSplit TokenSelectSelector::Split(int32_t tokens) const {
  TokenSelectSplit split;
  if (options_.k > 0) {
    split.n_init = options_.n_init;
    split.k = options_.k;
    split.n_local = std::max(options_.n_local, 1);
    return split;
  }
  const int32_t total = KeepCount(options_.budget, tokens);
  split.n_init = static_cast<int32_t>(std::min<int64_t>(options_.n_init,
                                                        total * kPaperInit / kPaperTotal));
  split.n_local = static_cast<int32_t>(std::clamp<int64_t>(
      std::min<int64_t>(options_.n_local, total * kPaperLocal / kPaperTotal), 1, total));
  split.n_init = std::min(split.n_init, total - split.n_local);
  split.k = total - split.n_init - split.n_local;
  return split;
}

const std::vector<int32_t>& TokenSelectSelector::cached_selection(int32_t layer) const {
  static const std::vector<int32_t>* empty = new std::vector<int32_t>();
  if (layer < 0 || layer >= static_cast<int32_t>(layers_.size())) return *empty;
  return layers_[layer].selected;
}

std::vector<float> TokenSelectSelector::Vote(int32_t layer, std::span<const float> query,
                                             int32_t begin, int32_t end,
                                             const SequenceKv& kv) {
  const float scale =
      options_.scaled_vote ? 1.0f / std::sqrt(static_cast<float>(options_.head_dim)) : 1.0f;
  const std::span<const int32_t> table = kv.block_table(layer);
  std::vector<float> vote(end - begin, 0.0f);
  if (scoring_ == nullptr) {
    error_.Update(
        absl::FailedPreconditionError("tokenselect: the selector has no scoring backend"));
    return vote;
  }
  error_.Update(scoring_->TokenSelectVote(table, query, options_.num_heads, begin, end, scale,
                                          options_.gqa_mod, vote.data()));
  return vote;
}

bool TokenSelectSelector::Select(int32_t layer, std::span<const float> q, int32_t num_new,
                                 int32_t past_slots, const SequenceKv& kv,
                                 std::vector<int32_t>* slots) {
  ++stats_.calls;
  stats_.keys_total += past_slots;
  const int32_t tokens = past_slots + num_new;
  const TokenSelectSplit split = Split(tokens);
  const int32_t local_past = std::max(split.n_local - num_new, 0);
  const int32_t local_begin = std::max(past_slots - local_past, 0);
  const int32_t init_end = std::min(split.n_init, local_begin);
  if (tokens < options_.min_tokens || tokens <= split.total() ||
      local_begin - init_end <= split.k) {
    // Everything fits in the budget: the dense path is exact and cheaper than any list.
    ++stats_.dense;
    stats_.keys_attended += past_slots;
    return false;
  }
  if (static_cast<int32_t>(layers_.size()) <= layer) layers_.resize(layer + 1);
  LayerState& state = layers_[layer];

  // The selection query: the mean of the new tokens' queries (one row at decode).
  const int64_t row = static_cast<int64_t>(options_.num_heads) * options_.head_dim;
  std::vector<float> query(q.begin(), q.begin() + row);
  for (int32_t i = 1; i < num_new; ++i) {
    for (int64_t j = 0; j < row; ++j) query[j] += q[i * row + j];
  }
  if (num_new > 1) {
    for (float& x : query) x /= static_cast<float>(num_new);
  }

  const int32_t max_past = init_end + split.k + (past_slots - local_begin);
  auto assemble = [&](const std::vector<int32_t>& selected) {
    // Initial tokens, the selection, the local window: ascending and unique (a reused selection
    // may overlap windows that have grown since it was made).
    slots->clear();
    for (int32_t j = 0; j < init_end; ++j) slots->push_back(j);
    for (int32_t j : selected) {
      if (j >= init_end && j < local_begin) slots->push_back(j);
    }
    for (int32_t j = local_begin; j < past_slots; ++j) slots->push_back(j);
  };

  bool hit = options_.selection_cache && state.valid &&
             Cosine(query, state.query) >= options_.theta;
  if (hit) {
    assemble(state.selected);
    // Never exceed the budget: a selection made under a larger split is redone.
    hit = static_cast<int32_t>(slots->size()) <= max_past;
  }
  if (hit) {
    ++stats_.hits;
  } else {
    std::vector<float> vote = Vote(layer, query, init_end, local_begin, kv);
    if (options_.pool > 1) vote = Pool1d(vote, options_.pool, Pooling::kMax);
    std::vector<int32_t> candidates(vote.size());
    std::iota(candidates.begin(), candidates.end(), 0);
    std::vector<int32_t> top = TopK(vote, candidates, split.k);  // ties to the older token
    for (int32_t& j : top) j += init_end;
    // The anchor is updated only on a miss (Algorithm 1): drift accumulates until one.
    state.selected = std::move(top);
    state.query = std::move(query);
    state.valid = true;
    ++stats_.misses;
    stats_.scored_keys += local_begin - init_end;
    assemble(state.selected);
  }
  stats_.keys_attended += static_cast<int64_t>(slots->size());
  return true;
}

namespace {

class TokenSelectPolicy : public CompressionPolicy {
 public:
  TokenSelectPolicy(const PolicyConfig& config, const PolicyContext& context,
                    const TokenSelectOptions& options)
      : CompressionPolicy(config, context), selector_(options) {}

  std::string name() const override { return "tokenselect"; }

  // Nothing is observed at prefill and nothing is evicted: the work happens per decode step.
  ObservationRequest Observation() const override {
    return ObservationRequest{layout().num_tokens, false};
  }
  absl::Status ObserveLayer(const ObservationAttention&) override { return absl::OkStatus(); }
  absl::StatusOr<KeepPlan> Plan() override { return KeepPlan{}; }

  AttentionSelector* selector() override { return &selector_; }
  void UseScoring(ScoringBackend* scoring) override {
    CompressionPolicy::UseScoring(scoring);
    selector_.set_scoring(scoring);
  }

  // Every token stays resident: the default (budget x prompt) would under-reserve.
  int64_t SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const override {
    return int64_t{dims().num_layers} * (int64_t{prompt_tokens} + generated);
  }

 private:
  TokenSelectSelector selector_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateTokenSelectPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  TokenSelectOptions o;
  o.num_heads = context.dims.num_heads;
  o.num_kv_heads = context.dims.num_kv_heads;
  o.head_dim = context.dims.head_dim;
  o.budget = config.budget();
  WINNOW_RETURN_IF_ERROR(config.ReadInt("k", &o.k, 0, 1 << 24));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("n_init", &o.n_init, 0, 1 << 24));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("n_local", &o.n_local, 1, 1 << 24));
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("theta", &o.theta, -1.0, 1.0));
  WINNOW_RETURN_IF_ERROR(config.ReadBool("selection_cache", &o.selection_cache));
  WINNOW_RETURN_IF_ERROR(
      config.ReadChoice<bool>("gqa_map", &o.gqa_mod, {{"div", false}, {"mod", true}}));
  WINNOW_RETURN_IF_ERROR(
      config.ReadChoice<bool>("vote_scale", &o.scaled_vote, {{"none", false}, {"sqrt_d", true}}));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("pool", &o.pool, 0, 4096));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("min_tokens", &o.min_tokens, 0, 1 << 24));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("tokenselect"));
  return std::make_unique<TokenSelectPolicy>(config, context, o);
}

}  // namespace winnow::cache::policies
