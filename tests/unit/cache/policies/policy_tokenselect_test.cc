// TokenSelect on constructed keys and queries: the per-head soft vote (eq. 7) against a reference
// computation, the always-attended initial and local tokens, the Selection Cache (hits against
// the last miss's query), the dense fallback; then on the real model (WINNOW_TEST_MODEL): a budget
// that covers every token changes no logit, a small one visits fewer keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "cache/block_pool.h"
#include "cache/compression.h"
#include "cache/host_scoring.h"
#include "cache/policies/policy.h"
#include "cache/policies/tokenselect.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"
#include "model/model.h"
#include "tests/unit/model/model_session_test_util.h"

namespace winnow::cache::policies {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 4;
constexpr int32_t kBlock = 4;

TokenSelectOptions Options(int32_t n_init, int32_t k, int32_t n_local) {
  TokenSelectOptions o;
  o.num_heads = kHeads;
  o.num_kv_heads = kKvHeads;
  o.head_dim = kDim;
  o.n_init = n_init;
  o.k = k;
  o.n_local = n_local;
  return o;
}

// A sequence whose keys are set per (layer, KV head, slot); values are irrelevant to selection.
struct Cache {
  std::unique_ptr<BlockPool> pool;
  SequenceKv kv{kLayers, kBlock};
  kernels::ThreadPool threads{1};
  HostScoring scoring{*pool, threads};

  explicit Cache(int32_t slots)
      : pool(*BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock},
                                kLayers * (slots / kBlock + 1))) {
    EXPECT_TRUE(kv.Reserve(*pool, slots));
    for (int32_t l = 0; l < kLayers; ++l) {
      kv.AppendSlots(l, slots);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t s = 0; s < slots; ++s) std::fill_n(Key(l, h, s), kDim, 0.0f);
      }
    }
  }
  ~Cache() { kv.Release(*pool); }
  float* Key(int32_t l, int32_t h, int32_t s) {
    return pool->Keys(kv.block_table(l)[s / kBlock], h) + (s % kBlock) * kDim;
  }
  int32_t slots() const { return kv.num_slots(0); }
};

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> out(end - begin);
  std::iota(out.begin(), out.end(), begin);
  return out;
}

std::vector<int32_t> Union(std::initializer_list<std::vector<int32_t>> parts) {
  std::set<int32_t> s;
  for (const auto& p : parts) s.insert(p.begin(), p.end());
  return {s.begin(), s.end()};
}

// The decode step of the token in the last slot: past = slots - 1, voting through `scoring`
// (the cache's single-threaded host scoring when null).
std::vector<int32_t> SelectLast(TokenSelectSelector& sel, Cache& c, int32_t layer,
                                const std::vector<float>& q, bool* sparse = nullptr,
                                ScoringBackend* scoring = nullptr) {
  std::vector<int32_t> slots;
  sel.set_scoring(scoring != nullptr ? scoring : &c.scoring);
  const bool used = sel.Select(layer, q, 1, c.slots() - 1, c.kv, &slots);
  if (sparse != nullptr) *sparse = used;
  return slots;
}

TEST(TokenSelectTest, SplitFollowsThePaperOrTheBudget) {
  TokenSelectSelector fixed(Options(128, 2048, 512));
  EXPECT_EQ(fixed.Split(100000).total(), 2688);
  TokenSelectOptions o = Options(128, 0, 512);
  o.budget = 0.1;
  TokenSelectSelector relative(o);
  const TokenSelectSplit small = relative.Split(1000);  // 100 tokens attended
  EXPECT_EQ(small.total(), 100);
  EXPECT_EQ(small.n_init, 100 * 128 / 2688);
  EXPECT_EQ(small.n_local, 100 * 512 / 2688);
  const TokenSelectSplit big = relative.Split(100000);  // the windows saturate at their params
  EXPECT_EQ(big.n_init, 128);
  EXPECT_EQ(big.n_local, 512);
  EXPECT_EQ(big.total(), 10000);
}

// Head 0 has enormous logits on token 10; heads 2 and 3 both moderately prefer token 20. Raw
// top-1 over logits would take 10; the soft vote counts each head's distribution once, so two
// heads agreeing on 20 outweigh one confident head.
TEST(TokenSelectTest, SoftVoteCountsEveryHeadOnceAndPairsHeadsLikeTheModel) {
  Cache c(40);
  for (int32_t l = 0; l < kLayers; ++l) {
    c.Key(l, 0, 10)[0] = 1.0f;  // KV head 0 (query heads 0, 1)
    c.Key(l, 1, 20)[2] = 1.0f;  // KV head 1 (query heads 2, 3)
  }
  std::vector<float> q(kHeads * kDim, 0.0f);
  q[0 * kDim + 0] = 1000.0f;
  q[2 * kDim + 2] = 5.0f;
  q[3 * kDim + 2] = 5.0f;
  // n_init 2, k 1, local 4 (3 past + the new token): candidates are [2, 36).
  TokenSelectSelector sel(Options(2, 1, 4));
  bool sparse = false;
  EXPECT_EQ(SelectLast(sel, c, 0, q, &sparse), (std::vector<int32_t>{0, 1, 20, 36, 37, 38}));
  EXPECT_TRUE(sparse);
  // The reference code's h % num_kv pairing sends query head 2 to KV head 0: only head 3 still
  // votes for 20 (0.84 < head 0's 1.0).
  TokenSelectOptions mod = Options(2, 1, 4);
  mod.gqa_mod = true;
  TokenSelectSelector sel_mod(mod);
  EXPECT_EQ(SelectLast(sel_mod, c, 0, q), (std::vector<int32_t>{0, 1, 10, 36, 37, 38}));
}

// A straightforward re-derivation of eq. 7 over candidates [begin, end).
std::vector<int32_t> ReferenceTopK(Cache& c, int32_t layer, const std::vector<float>& q,
                                   int32_t begin, int32_t end, int32_t k) {
  std::vector<double> vote(end - begin, 0.0);
  for (int32_t h = 0; h < kHeads; ++h) {
    const int32_t g = h / (kHeads / kKvHeads);
    std::vector<double> logit(end - begin);
    for (int32_t t = begin; t < end; ++t) {
      double dot = 0.0;
      for (int32_t d = 0; d < kDim; ++d) dot += double{q[h * kDim + d]} * c.Key(layer, g, t)[d];
      logit[t - begin] = dot;
    }
    const double m = *std::max_element(logit.begin(), logit.end());
    double z = 0.0;
    for (double x : logit) z += std::exp(x - m);
    for (size_t t = 0; t < logit.size(); ++t) vote[t] += std::exp(logit[t] - m) / z;
  }
  std::vector<int32_t> order = Range(begin, end);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return vote[a - begin] > vote[b - begin];
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TokenSelectTest, SelectionIsInitPlusSoftVoteTopKPlusLocalOnRandomKeys) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int32_t n = 120;
  Cache c(n);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t s = 0; s < n; ++s) {
        for (int32_t d = 0; d < kDim; ++d) c.Key(l, h, s)[d] = normal(rng);
      }
    }
  }
  TokenSelectOptions o = Options(4, 16, 8);
  o.selection_cache = false;
  TokenSelectSelector sel(o);
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<float> q(kHeads * kDim);
    for (float& x : q) x = normal(rng);
    const int32_t layer = trial % kLayers;
    const int32_t past = n - 1;
    const std::vector<int32_t> got = SelectLast(sel, c, layer, q);
    const std::vector<int32_t> expected = Union(
        {Range(0, 4), ReferenceTopK(c, layer, q, 4, past - 7, 16), Range(past - 7, past)});
    EXPECT_EQ(got, expected) << "trial " << trial;
    EXPECT_EQ(got.size(), 4u + 16u + 7u);  // + the new token = n_init + k + n_local
  }
  EXPECT_EQ(sel.stats().misses, 10);
  EXPECT_EQ(sel.stats().hits, 0);
  EXPECT_EQ(sel.stats().keys_attended, 10 * 27);
  EXPECT_EQ(sel.stats().keys_total, 10 * (n - 1));
}

TEST(TokenSelectTest, ThreadedScoringGivesTheSameVoteAndSelection) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int32_t n = 2100;  // candidates span several 512-token scoring chunks
  Cache c(n);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int32_t s = 0; s < n; ++s) {
      for (int32_t d = 0; d < kDim; ++d) c.Key(1, h, s)[d] = normal(rng);
    }
  }
  std::vector<float> q(kHeads * kDim);
  for (float& x : q) x = normal(rng);
  TokenSelectSelector alone(Options(16, 64, 32));
  TokenSelectSelector pooled(Options(16, 64, 32));
  kernels::ThreadPool threads(3);
  HostScoring three_threads(*c.pool, threads);
  alone.set_scoring(&c.scoring);
  pooled.set_scoring(&three_threads);
  EXPECT_EQ(alone.Vote(1, q, 16, n - 32, c.kv), pooled.Vote(1, q, 16, n - 32, c.kv));
  const std::vector<int32_t> expected =
      Union({Range(0, 16), ReferenceTopK(c, 1, q, 16, n - 32, 64), Range(n - 32, n - 1)});
  EXPECT_EQ(SelectLast(alone, c, 1, q), expected);
  EXPECT_EQ(SelectLast(pooled, c, 1, q, nullptr, &three_threads), expected);
}

std::vector<float> Rotated(double angle) {
  // A query in the plane of two directions, per head: cos(angle) e0 + sin(angle) e1.
  std::vector<float> q(kHeads * kDim, 0.0f);
  for (int32_t h = 0; h < kHeads; ++h) {
    q[h * kDim + 0] = static_cast<float>(3.0 * std::cos(angle));
    q[h * kDim + 1] = static_cast<float>(3.0 * std::sin(angle));
  }
  return q;
}

TEST(TokenSelectTest, SelectionCacheReusesWhileTheQueryStaysNearTheLastMiss) {
  Cache c(64);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t s = 0; s < 64; ++s) {
        for (int32_t d = 0; d < kDim; ++d) c.Key(l, h, s)[d] = normal(rng);
      }
    }
  }
  TokenSelectSelector sel(Options(2, 8, 4));  // theta 0.9
  const double step = std::acos(0.95);        // consecutive queries at cosine 0.95
  const std::vector<int32_t> first = SelectLast(sel, c, 0, Rotated(0.0));
  EXPECT_EQ(sel.stats().misses, 1);
  // Similar: reused as is, even though its own top-k may differ.
  EXPECT_EQ(SelectLast(sel, c, 0, Rotated(step)), first);
  EXPECT_EQ(sel.stats().hits, 1);
  // Close to the previous query but at cosine 0.805 from the last miss's: a miss (Algorithm 1
  // compares with the anchor, so drift cannot accumulate unchecked).
  const std::vector<int32_t> third = SelectLast(sel, c, 0, Rotated(2 * step));
  EXPECT_EQ(sel.stats().misses, 2);
  EXPECT_EQ(third, Union({Range(0, 2),
                          ReferenceTopK(c, 0, Rotated(2 * step), 2, 60, 8), Range(60, 63)}));
  // State is per layer: layer 1 has never selected.
  SelectLast(sel, c, 1, Rotated(2 * step));
  EXPECT_EQ(sel.stats().misses, 3);
  // An orthogonal query misses.
  SelectLast(sel, c, 0, Rotated(std::acos(0.0) + 2 * step));
  EXPECT_EQ(sel.stats().misses, 4);
  EXPECT_EQ(sel.stats().hits, 1);

  TokenSelectOptions off = Options(2, 8, 4);
  off.selection_cache = false;
  TokenSelectSelector no_cache(off);
  SelectLast(no_cache, c, 0, Rotated(0.0));
  SelectLast(no_cache, c, 0, Rotated(0.0));
  EXPECT_EQ(no_cache.stats().misses, 2);
}

TEST(TokenSelectTest, DenseWhileTheCacheFitsTheBudget) {
  Cache c(30);
  TokenSelectSelector sel(Options(4, 16, 10));  // B = 30
  bool sparse = true;
  EXPECT_TRUE(SelectLast(sel, c, 0, Rotated(0.3), &sparse).empty());
  EXPECT_FALSE(sparse);
  TokenSelectOptions all = Options(128, 0, 512);
  all.budget = 1.0;
  TokenSelectSelector full(all);
  EXPECT_FALSE(full.Select(0, Rotated(0.3), 1, 29, c.kv, nullptr));
  EXPECT_EQ(full.stats().keys_attended, full.stats().keys_total);
}

TEST(TokenSelectTest, PolicyFreesNothingAndReservesTheWholeCache) {
  PolicyContext context;
  context.dims = ModelDims{kLayers, kHeads, kKvHeads, kDim, kBlock};
  context.layout.num_tokens = 50;
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> p =
      CreatePolicy("tokenselect", PolicyConfig(0.1, {{"k", 8.0}, {"theta", 0.8}}), context);
  ASSERT_TRUE(p.ok()) << p.status();
  CompressionPolicy& policy = **p;
  EXPECT_NE(policy.selector(), nullptr);
  EXPECT_FALSE(policy.EvictsDuringDecode());
  EXPECT_FALSE(policy.Observation().accumulate_all_rows);
  absl::StatusOr<KeepPlan> plan = policy.Plan();
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
  EXPECT_EQ(policy.SteadyStateSlots(50, 10), int64_t{kLayers} * 60);
  for (const auto& [k, v] : std::vector<std::pair<std::string, PolicyParam>>{
           {"theta", 2.0}, {"gqa_map", "mean"}, {"n_local", 0.0}, {"budget_tokens", 5.0}}) {
    absl::StatusOr<std::unique_ptr<CompressionPolicy>> bad =
        CreatePolicy("tokenselect", PolicyConfig(0.5, {{k, v}}), context);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << k;
  }
}

// ---------------------------------------------------------------------------------------------
// The real model.

// Records the selector's lists per layer for the last forward.
class Recording : public AttentionSelector {
 public:
  explicit Recording(AttentionSelector* inner) : inner_(inner) {}
  bool Select(int32_t layer, std::span<const float> q, int32_t num_new, int32_t past,
              const SequenceKv& kv, std::vector<int32_t>* slots) override {
    const bool used = inner_->Select(layer, q, num_new, past, kv, slots);
    if (static_cast<int32_t>(lists.size()) <= layer) lists.resize(layer + 1);
    lists[layer] = used ? *slots : Range(0, past);
    return used;
  }
  std::vector<std::vector<int32_t>> lists;

 private:
  AttentionSelector* inner_;
};

// The first `sinks` and the last `recent` past slots.
class SinksAndRecent : public AttentionSelector {
 public:
  SinksAndRecent(int32_t sinks, int32_t recent) : sinks_(sinks), recent_(recent) {}
  bool Select(int32_t, std::span<const float>, int32_t, int32_t past, const SequenceKv&,
              std::vector<int32_t>* slots) override {
    for (int32_t j = 0; j < past; ++j) {
      if (j < sinks_ || j >= past - recent_) slots->push_back(j);
    }
    return true;
  }

 private:
  int32_t sinks_, recent_;
};

class TokenSelectModelTest : public testing_util::ModelSessionTest {
 protected:
  static std::vector<int32_t> Prompt() {
    return CountingPrompt("Remember: the secret word is 'marmalade'. Now count with me:");
  }

  struct Run {
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> tokens;  // fed at each decode step
    int64_t keys_visited = 0;  // past keys with a nonzero probability, summed over layers/heads
    int64_t keys_past = 0;     // past keys, summed over layers/heads
  };

  // Prefill (one chunk), compress (a no-op for tokenselect), then `steps` decode steps with the
  // session's selector (or `other`), greedy or teacher-forced with `forced`; checks that
  // attention touched only the listed slots.
  Run Generate(const std::vector<int32_t>& prompt, int steps, CompressionSession* session,
               AttentionSelector* other = nullptr, const std::vector<int32_t>* forced = nullptr) {
    Run run;
    SequenceKv kv(L(), kModelBlock);
    const int32_t n = static_cast<int32_t>(prompt.size());
    CompactionStats stats;
    run.logits.push_back(PrefillAndCompress(prompt, n, session, kv, &stats));
    EXPECT_EQ(stats.blocks_freed, 0);  // nothing is freed: every prompt block is still held
    EXPECT_EQ(pool_->num_used(), L() * ((n + kModelBlock - 1) / kModelBlock));
    std::unique_ptr<Recording> recording;
    AttentionSelector* inner = other != nullptr ? other
                               : session != nullptr ? session->selector()
                                                    : nullptr;
    if (inner != nullptr) recording = std::make_unique<Recording>(inner);
    std::vector<std::vector<float>> probs;
    for (int s = 0; s < steps; ++s) {
      const std::vector<float>& last = run.logits.back();
      const int32_t token = forced != nullptr ? (*forced)[s] : Argmax(last);
      run.tokens.push_back(token);
      run.logits.push_back(DecodeStep(kv, token, n + s, session, recording.get(), &probs));
      const int32_t past = n + s;
      for (int32_t l = 0; l < L(); ++l) {
        std::vector<char> listed(past, recording == nullptr ? 1 : 0);
        if (recording != nullptr) {
          for (int32_t j : recording->lists[l]) listed[j] = 1;
        }
        for (int32_t h = 0; h < H(); ++h) {
          for (int32_t j = 0; j < past; ++j) {
            const float p = probs[l][static_cast<size_t>(h) * (past + 1) + j];
            if (p != 0.0f) {
              ++run.keys_visited;
              EXPECT_TRUE(listed[j]) << "layer " << l << " head " << h << " slot " << j;
            }
          }
          run.keys_past += past;
        }
      }
    }
    EXPECT_EQ(pool_->num_used(), kv.num_blocks_held());
    kv.Release(*pool_);
    EXPECT_EQ(pool_->num_used(), 0);
    return run;
  }

  std::unique_ptr<CompressionSession> Session(double budget, int32_t tokens, Params p = {}) {
    return ModelSessionTest::Session("tokenselect", budget, tokens, std::move(p));
  }

  static TokenSelectSelector& SelectorOf(CompressionSession& s) {
    return *dynamic_cast<TokenSelectSelector*>(s.selector());
  }

  static double Kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
    auto log_softmax = [](const std::vector<float>& x) {
      const double m = *std::max_element(x.begin(), x.end());
      double z = 0.0;
      for (float v : x) z += std::exp(v - m);
      std::vector<double> out(x.size());
      for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(z);
      return out;
    };
    const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
    double kl = 0.0;
    for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    return kl;
  }
};

TEST_F(TokenSelectModelTest, BudgetCoveringEveryTokenGivesIdenticalLogits) {
  const std::vector<int32_t> prompt = Prompt();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const Run full = Generate(prompt, 5, nullptr);
  for (const auto& params : std::vector<PolicyParams>{
           {}, {{"k", static_cast<double>(n + 10)}, {"n_init", 4.0}, {"n_local", 8.0}}}) {
    std::unique_ptr<CompressionSession> session = Session(1.0, n, params);
    const Run run = Generate(prompt, 5, session.get());
    ASSERT_EQ(run.logits.size(), full.logits.size());
    for (size_t i = 0; i < full.logits.size(); ++i) EXPECT_EQ(run.logits[i], full.logits[i]);
    const TokenSelectStats& st = SelectorOf(*session).stats();
    EXPECT_EQ(st.dense, st.calls);
    EXPECT_EQ(run.keys_visited, run.keys_past);
  }
}

TEST_F(TokenSelectModelTest, SmallBudgetVisitsFewerKeysAndStaysCloseToTheFullCache) {
  const std::vector<int32_t> prompt = Prompt();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int steps = 6;
  const Run full = Generate(prompt, steps, nullptr);
  // 4 initial + 24 selected + 8 local (the new token included) = 36 of ~n keys per step.
  std::unique_ptr<CompressionSession> session =
      Session(0.5, n, {{"k", 24.0}, {"n_init", 4.0}, {"n_local", 8.0}});
  const Run run = Generate(prompt, steps, session.get());
  const TokenSelectStats& st = SelectorOf(*session).stats();
  EXPECT_EQ(st.calls, int64_t{L()} * steps);
  EXPECT_EQ(st.dense, 0);
  EXPECT_EQ(st.keys_attended, int64_t{L()} * steps * 35);
  EXPECT_LE(run.keys_visited, int64_t{L()} * H() * steps * 35);
  EXPECT_LT(run.keys_visited * 2, run.keys_past);
  // Quality: teacher-forced on the full cache's tokens, against a StreamingLLM-like control
  // that attends to the same number of keys (the first 4 and the most recent 31).
  std::unique_ptr<CompressionSession> forced_session =
      Session(0.5, n, {{"k", 24.0}, {"n_init", 4.0}, {"n_local", 8.0}});
  const Run selected = Generate(prompt, steps, forced_session.get(), nullptr, &full.tokens);
  SinksAndRecent control(4, 31);
  const Run local = Generate(prompt, steps, nullptr, &control, &full.tokens);
  double kl_selected = 0.0, kl_local = 0.0;
  for (int s = 1; s <= steps; ++s) {
    kl_selected += Kl(full.logits[s], selected.logits[s]);
    kl_local += Kl(full.logits[s], local.logits[s]);
  }
  std::printf("tokenselect k=24 (prompt %d tokens): past keys attended %lld of %lld (%.1f%%), "
              "hits %lld, misses %lld; mean KL to full %.4f vs sinks+recent %.4f\n",
              n, static_cast<long long>(st.keys_attended),
              static_cast<long long>(st.keys_total), 100.0 * st.keys_attended / st.keys_total,
              static_cast<long long>(st.hits), static_cast<long long>(st.misses),
              kl_selected / steps, kl_local / steps);
  EXPECT_LT(kl_selected, kl_local);
  EXPECT_EQ(Argmax(run.logits[1]), Argmax(full.logits[1]));
}

}  // namespace
}  // namespace winnow::cache::policies
