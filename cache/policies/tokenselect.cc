#include "cache/policies/tokenselect.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "base/status_macros.h"
#include "cache/kv_device.h"
#include "cache/policies/scoring_helpers.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/thread_pool.h"

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
                                             int32_t begin, int32_t end, const SequenceKv& kv,
                                             const BlockPool& pool) {
  const int32_t num_heads = options_.num_heads;
  const int32_t num_kv = options_.num_kv_heads;
  const int32_t d = options_.head_dim;
  const int32_t group = num_heads / num_kv;
  const int32_t block_size = pool.layout().block_size;
  const int32_t n = end - begin;
  const float scale = options_.scaled_vote ? 1.0f / std::sqrt(static_cast<float>(d)) : 1.0f;
  const std::span<const int32_t> table = kv.block_table(layer);
  if (KvDevice* device = pool.device()) {
    // The keys are on the device (the CUDA worker): vote there, only the vote comes back.
    std::vector<float> vote(n, 0.0f);
    error_.Update(device->TokenSelectVote(table, query, num_heads, begin, end, scale,
                                          options_.gqa_mod, vote.data()));
    return vote;
  }
  logits_.resize(static_cast<size_t>(num_heads) * n);
  // Query heads scored against each KV head. The model's attention pairs h with h / group; the
  // reference code's h % num_kv mis-pairs them under GQA (brief §1.7), kept only as an option.
  std::vector<std::vector<int32_t>> heads_of_kv(num_kv);
  for (int32_t h = 0; h < num_heads; ++h) {
    heads_of_kv[options_.gqa_mod ? h % num_kv : h / group].push_back(h);
  }
  // Fixed-size chunks of candidates, spread over the pool: the result does not depend on the
  // number of threads (every reduction runs in chunk order).
  constexpr int32_t kChunk = 512;
  const int32_t num_chunks = (n + kChunk - 1) / kChunk;
  auto parallel = [&](const std::function<void(int64_t, int64_t)>& fn) {
    if (threads_ != nullptr && num_chunks > 1) {
      threads_->ParallelFor(num_chunks, 1, fn);
    } else {
      fn(0, num_chunks);
    }
  };
  std::vector<float> chunk_max(static_cast<size_t>(num_chunks) * num_heads);
  std::vector<double> chunk_sum(static_cast<size_t>(num_chunks) * num_heads);
  // Pass 1: logits, each key row read once for every query head of its group; chunk maxima.
  const kernels::PagedKvView view = pool.View();
  parallel([&](int64_t c_begin, int64_t c_end) {
    std::vector<float> key_row(d);  // a key converted to float32 (unused for f32 pools)
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int32_t t0 = static_cast<int32_t>(c) * kChunk;
      const int32_t t1 = std::min(n, t0 + kChunk);
      for (int32_t g = 0; g < num_kv; ++g) {
        for (int32_t t = t0; t < t1; ++t) {
          const int32_t slot = begin + t;
          const float* key = view.Row(view.Keys(table[slot / block_size], g), slot % block_size,
                                      key_row.data());
          for (int32_t h : heads_of_kv[g]) {
            logits_[static_cast<int64_t>(h) * n + t] =
                kernels::Dot(query.data() + static_cast<int64_t>(h) * d, key, d) * scale;
          }
        }
      }
      for (int32_t h = 0; h < num_heads; ++h) {
        const float* row = logits_.data() + static_cast<int64_t>(h) * n;
        chunk_max[c * num_heads + h] = *std::max_element(row + t0, row + t1);
      }
    }
  });
  std::vector<float> max_logit(num_heads, -std::numeric_limits<float>::infinity());
  for (int32_t c = 0; c < num_chunks; ++c) {
    for (int32_t h = 0; h < num_heads; ++h) {
      max_logit[h] = std::max(max_logit[h], chunk_max[c * num_heads + h]);
    }
  }
  // Pass 2: exponentials in place (fp32), partial sums in double: at long contexts single
  // probabilities are tiny and a float sum of ~1e5 of them drops the small ones (the release's
  // bf16 drops more).
  parallel([&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int32_t t0 = static_cast<int32_t>(c) * kChunk;
      const int32_t t1 = std::min(n, t0 + kChunk);
      for (int32_t h = 0; h < num_heads; ++h) {
        float* row = logits_.data() + static_cast<int64_t>(h) * n;
        double sum = 0.0;
        for (int32_t t = t0; t < t1; ++t) {
          row[t] = std::exp(row[t] - max_logit[h]);
          sum += row[t];
        }
        chunk_sum[c * num_heads + h] = sum;
      }
    }
  });
  std::vector<float> inv_sum(num_heads);
  for (int32_t h = 0; h < num_heads; ++h) {
    double sum = 0.0;
    for (int32_t c = 0; c < num_chunks; ++c) sum += chunk_sum[c * num_heads + h];
    inv_sum[h] = static_cast<float>(1.0 / sum);
  }
  // Pass 3, eq. 7: each head's softmax over the candidates, summed over heads.
  std::vector<float> vote(n, 0.0f);
  parallel([&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int32_t t0 = static_cast<int32_t>(c) * kChunk;
      const int32_t t1 = std::min(n, t0 + kChunk);
      for (int32_t h = 0; h < num_heads; ++h) {
        const float* row = logits_.data() + static_cast<int64_t>(h) * n;
        for (int32_t t = t0; t < t1; ++t) vote[t] += row[t] * inv_sum[h];
      }
    }
  });
  return vote;
}

bool TokenSelectSelector::Select(int32_t layer, std::span<const float> q, int32_t num_new,
                                 int32_t past_slots, const SequenceKv& kv, const BlockPool& pool,
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
    std::vector<float> vote = Vote(layer, query, init_end, local_begin, kv, pool);
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
  void UseThreads(kernels::ThreadPool* threads) override {
    CompressionPolicy::UseThreads(threads);
    selector_.set_threads(threads);
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
