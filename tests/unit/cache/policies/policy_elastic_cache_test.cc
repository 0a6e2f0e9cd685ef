// Elastic Cache on constructed importance patterns: anchors by importance, nearest-anchor buckets
// (ties to the left), merged K/V equal to the bucket means, decode-time fixed-point eviction that
// holds the cache at floor(budget x tokens seen); then on the real model (WINNOW_TEST_MODEL).
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/compression.h"
#include "cache/policies/elastic_cache.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"
#include "cache/sequence_kv.h"
#include "model/model.h"
#include "tests/unit/model/model_session_test_util.h"

namespace winnow::cache::policies {
namespace {

constexpr int32_t kLayers = 3;
constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 4;
constexpr int32_t kBlock = 4;

PolicyContext Context(int32_t tokens) {
  PolicyContext c;
  c.dims = ModelDims{kLayers, kHeads, kKvHeads, kDim, kBlock};
  c.layout.num_tokens = tokens;
  return c;
}

std::unique_ptr<CompressionPolicy> Make(double budget, int32_t tokens,
                                        PolicyParams params = {}) {
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> p =
      CreatePolicy("elastic_cache", PolicyConfig(budget, std::move(params)), Context(tokens));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> out;
  for (int32_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

// Column sums per (query head, slot) with a small background and, per layer, heavy keys.
struct Sums {
  int32_t n;
  std::vector<std::vector<float>> per_layer;  // [layer][h * n + j]

  explicit Sums(int32_t tokens) : n(tokens), per_layer(kLayers) {
    for (auto& s : per_layer) s.assign(static_cast<size_t>(kHeads) * n, 0.01f);
  }
  void Set(int32_t layer, int32_t head, int32_t slot, float v) {
    per_layer[layer][static_cast<size_t>(head) * n + slot] = v;
  }
  void SetAllHeads(int32_t layer, int32_t slot, float v) {
    for (int32_t h = 0; h < kHeads; ++h) Set(layer, h, slot, v);
  }
  ObservationAttention For(int32_t layer) const {
    ObservationAttention a;
    a.layer = layer;
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.num_rows = 0;
    a.num_slots = n;
    a.column_sums = per_layer[layer];
    return a;
  }
};

KeepPlan Prefill(CompressionPolicy& policy, const Sums& sums) {
  EXPECT_TRUE(policy.Observation().accumulate_all_rows);
  for (int32_t l = 0; l < kLayers; ++l) EXPECT_TRUE(policy.ObserveLayer(sums.For(l)).ok());
  absl::StatusOr<KeepPlan> plan = policy.Plan();
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->Validate(Context(sums.n).dims, [&](int32_t) { return sums.n; }).ok());
  return *std::move(plan);
}

TEST(ElasticCacheTest, AnchorsByImportanceBucketsByNearestAnchorTiesLeft) {
  std::vector<float> scores(12, 0.1f);
  scores[3] = 5.0f;
  scores[7] = 4.0f;
  scores[9] = 3.0f;
  scores[0] = 100.0f;  // the sink is protected, not an anchor candidate
  const ElasticLayerPlan plan = PlanElasticLayer(scores, 5, 1, 1);
  EXPECT_EQ(plan.kept, (std::vector<int32_t>{0, 3, 7, 9, 11}));
  // 5 is equidistant from 3 and 7 and 8 from 7 and 9: both join the left anchor.
  const std::vector<std::vector<int32_t>> expected = {
      {0}, {1, 2, 3, 4, 5}, {6, 7, 8}, {9, 10}, {11}};
  EXPECT_EQ(plan.groups, expected);
}

TEST(ElasticCacheTest, ScoreTiesGoToTheLowerPositionAndTinyBudgetsDropProtection) {
  const std::vector<float> flat(10, 1.0f);
  EXPECT_EQ(PlanElasticLayer(flat, 4, 1, 1).kept, (std::vector<int32_t>{0, 1, 2, 9}));
  // Two entries cannot hold sink + anchor + last: every entry becomes an anchor.
  std::vector<float> scores(10, 0.0f);
  scores[0] = 9.0f;
  scores[6] = 3.0f;
  const ElasticLayerPlan small = PlanElasticLayer(scores, 2, 1, 1);
  EXPECT_EQ(small.kept, (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(small.groups, (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, Range(4, 10)}));
  // keep >= n: everything, unmerged.
  EXPECT_EQ(PlanElasticLayer(flat, 10, 1, 1).kept, Range(0, 10));
}

TEST(ElasticCacheTest, ImportanceIsTheHeadMeanOfColumnSumsPerLayer) {
  const int32_t n = 20;
  Sums sums(n);
  // Layer 0: slot 5 is heavy in one head only (mean 1.0), slot 9 moderately in all (mean 0.9),
  // slot 13 in two heads (mean 0.75). Budget 0.2 keeps 4: sink, 2 anchors, last.
  sums.Set(0, 0, 5, 4.0f);
  sums.SetAllHeads(0, 9, 0.9f);
  sums.Set(0, 1, 13, 1.5f);
  sums.Set(0, 2, 13, 1.5f);
  // Layer 1: other anchors; layer 2: anchors at the edges of the candidate range.
  sums.SetAllHeads(1, 2, 2.0f);
  sums.SetAllHeads(1, 17, 1.0f);
  sums.SetAllHeads(2, 1, 2.0f);
  sums.SetAllHeads(2, 18, 2.0f);
  std::unique_ptr<CompressionPolicy> policy = Make(0.2, n);
  const KeepPlan plan = Prefill(*policy, sums);
  ASSERT_EQ(plan.layers.size(), kLayers);
  const std::vector<std::vector<int32_t>> kept = {{0, 5, 9, 19}, {0, 2, 17, 19}, {0, 1, 18, 19}};
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(plan.layers[l].kept(), KeepCount(0.2, n)) << l;
    for (int32_t h = 0; h < kKvHeads; ++h) {
      EXPECT_EQ(plan.layers[l].heads[h], kept[l]) << "layer " << l << " head " << h;
      ASSERT_EQ(plan.layers[l].merge.size(), kKvHeads);
      EXPECT_EQ(plan.layers[l].merge[h], plan.layers[l].merge[0]);  // positions shared by heads
    }
  }
  // Layer 0 buckets: 1..7 -> 5 (7 is equidistant from 5 and 9), 8..18 -> 9.
  EXPECT_EQ(plan.layers[0].merge[0],
            (std::vector<std::vector<int32_t>>{{0}, Range(1, 8), Range(8, 19), {19}}));
  // The eviction ablation keeps the same anchors without merging.
  std::unique_ptr<CompressionPolicy> evict = Make(0.2, n, {{"merge", "false"}});
  const KeepPlan plain = Prefill(*evict, sums);
  EXPECT_EQ(plain.layers[0].heads[0], kept[0]);
  EXPECT_TRUE(plain.layers[0].merge.empty());
}

// A recognisable value for every (layer, head, slot, dim, K/V).
float Tag(int32_t l, int32_t h, int32_t s, int32_t d, bool v) {
  return l * 1000.0f + h * 100.0f + s * 1.25f + d * 0.5f + (v ? 7.0f : 0.0f);
}

float* RowOf(BlockPool& pool, const SequenceKv& kv, int32_t l, int32_t h, int32_t s, bool v) {
  const int32_t block = kv.block_table(l)[s / kBlock];
  return (v ? pool.Values(block, h) : pool.Keys(block, h)) + (s % kBlock) * kDim;
}

TEST(ElasticCacheTest, MergedEntriesAreBucketMeansOfKeysAndValuesPerHead) {
  const int32_t n = 22;
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 64);
  SequenceKv kv(kLayers, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool, n));
  for (int32_t l = 0; l < kLayers; ++l) {
    kv.AppendSlots(l, n);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t s = 0; s < n; ++s) {
        for (bool v : {false, true}) {
          for (int32_t d = 0; d < kDim; ++d) RowOf(*pool, kv, l, h, s, v)[d] = Tag(l, h, s, d, v);
        }
      }
    }
  }
  ASSERT_EQ(pool->num_used(), kLayers * 6);
  Sums sums(n);
  for (int32_t l = 0; l < kLayers; ++l) {
    sums.SetAllHeads(l, 4 + l, 3.0f);
    sums.SetAllHeads(l, 12 + l, 2.0f);
    sums.SetAllHeads(l, 17, 1.0f);
  }
  std::unique_ptr<CompressionPolicy> policy = Make(0.25, n);  // keeps 5: sink, 3 anchors, last
  const KeepPlan plan = Prefill(*policy, sums);
  absl::StatusOr<CompactionStats> stats = ApplyKeepPlan(plan, kv, *pool);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->slots_removed, int64_t{kLayers} * (n - 5));
  EXPECT_EQ(stats->blocks_freed, kLayers * (6 - 2));
  EXPECT_EQ(pool->num_used(), kv.num_blocks_held());
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kv.num_slots(l), 5);
    const std::vector<std::vector<int32_t>>& groups = plan.layers[l].merge[0];
    EXPECT_EQ(plan.layers[l].heads[0], (std::vector<int32_t>{0, 4 + l, 12 + l, 17, 21}));
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t i = 0; i < 5; ++i) {
        for (bool v : {false, true}) {
          for (int32_t d = 0; d < kDim; ++d) {
            // Uniform weights, the anchor included (eq. 3): one mean per head, K and V apart.
            double mean = 0.0;
            for (int32_t s : groups[i]) mean += Tag(l, h, s, d, v);
            mean /= static_cast<double>(groups[i].size());
            EXPECT_NEAR(RowOf(*pool, kv, l, h, i, v)[d], mean, 1e-3)
                << "layer " << l << " head " << h << " entry " << i;
          }
        }
      }
    }
  }
  // Sink and protected last token are verbatim.
  EXPECT_EQ(RowOf(*pool, kv, 1, 1, 0, true)[3], Tag(1, 1, 0, 3, true));
  EXPECT_EQ(RowOf(*pool, kv, 2, 0, 4, false)[1], Tag(2, 0, 21, 1, false));
  kv.Release(*pool);
  EXPECT_EQ(pool->num_used(), 0);
}

struct DecodeTrace {
  int32_t max_slots = 0;
  int32_t evictions = 0;
};

// Runs `steps` decode steps through the policy's plans, checking the fixed-point rule.
DecodeTrace Decode(CompressionPolicy& policy, SlotPositions& slots, int32_t first_position,
                   int32_t steps, double budget, int32_t fix, int32_t evict_every) {
  DecodeTrace trace;
  for (int32_t s = 0; s < steps; ++s) {
    const int32_t position = first_position + s;
    const std::vector<int32_t> before(slots.Positions(0, 0).begin(),
                                      slots.Positions(0, 0).end());
    slots.AppendRange(position, 1);
    DecodeStep step;
    step.position = position;
    step.tokens_seen = position + 1;
    step.slots = &slots;
    absl::StatusOr<KeepPlan> plan = policy.OnDecodeStep(step);
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->Validate(Context(1).dims, [&](int32_t l) { return slots.num_slots(l); })
                    .ok());
    slots.Apply(*plan);
    const int32_t cap = KeepCount(budget, position + 1);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_LE(slots.num_slots(l), cap + evict_every - 1) << "step " << s;
      if (evict_every == 1) {
        EXPECT_EQ(slots.num_slots(l), cap) << "step " << s;
      }
      trace.max_slots = std::max(trace.max_slots, slots.num_slots(l));
      for (int32_t h = 0; h < kKvHeads; ++h) {
        const std::span<const int32_t> now = slots.Positions(l, h);
        // The frozen part never changes.
        for (int32_t i = 0; i < fix; ++i) EXPECT_EQ(now[i], before[i]) << "step " << s;
        // The FIFO region drops its oldest entries: what remains is the newest, in order.
        const int32_t removed = static_cast<int32_t>(before.size()) + 1 - static_cast<int32_t>(
                                                                              now.size());
        for (int32_t i = fix; i < static_cast<int32_t>(now.size()); ++i) {
          const int32_t expected = i + removed < static_cast<int32_t>(before.size())
                                       ? before[i + removed]
                                       : position;
          EXPECT_EQ(now[i], expected) << "step " << s << " slot " << i;
        }
        if (l == 0 && h == 0 && removed > 0) ++trace.evictions;
      }
    }
  }
  return trace;
}

TEST(ElasticCacheTest, FixedPointEvictionHoldsTheCacheAtBudgetOneEntryPerStep) {
  const int32_t n = 60;
  const double budget = 0.5;
  Sums sums(n);
  std::unique_ptr<CompressionPolicy> policy = Make(budget, n, {{"fix_offset", -8.0}});
  EXPECT_TRUE(policy->EvictsDuringDecode());
  EXPECT_FALSE(policy->WantsDecodeAttention());
  const KeepPlan plan = Prefill(*policy, sums);
  SlotPositions slots(kLayers, kKvHeads);
  slots.AppendRange(0, n);
  slots.Apply(plan);
  ASSERT_EQ(slots.num_slots(0), 30);
  const int32_t fix = 30 - 8;
  const int32_t steps = 50;
  const DecodeTrace trace = Decode(*policy, slots, n, steps, budget, fix, 1);
  // Half the steps evict (budget 0.5), one entry each: the cache grows by budget per token.
  EXPECT_EQ(trace.evictions, steps - (KeepCount(budget, n + steps) - 30));
  EXPECT_EQ(slots.num_slots(0), KeepCount(budget, n + steps));
  // The admission bound covers what was held.
  EXPECT_GE(policy->SteadyStateSlots(n, steps), int64_t{kLayers} * trace.max_slots);
  EXPECT_LE(policy->SteadyStateSlots(n, steps), int64_t{kLayers} * (trace.max_slots + 1));
}

TEST(ElasticCacheTest, BatchedEvictionAndDefaultsClampTheFixedPoint) {
  const int32_t n = 40;
  const double budget = 0.25;
  Sums sums(n);
  // Default P = -25 with only 10 kept entries: the fixed point clamps to just after the sink.
  std::unique_ptr<CompressionPolicy> policy = Make(budget, n, {{"evict_every", 4.0}});
  SlotPositions slots(kLayers, kKvHeads);
  slots.AppendRange(0, n);
  slots.Apply(Prefill(*policy, sums));
  ASSERT_EQ(slots.num_slots(0), 10);
  const DecodeTrace trace = Decode(*policy, slots, n, 40, budget, 1, 4);
  // Between compactions the cache runs up to 3 entries over the cap of its step.
  EXPECT_LE(trace.max_slots, KeepCount(budget, n + 40) + 3);
  EXPECT_GT(trace.max_slots, KeepCount(budget, n + 40));
  EXPECT_EQ(slots.Positions(0, 0)[0], 0);  // the sink is never evicted
  EXPECT_GE(policy->SteadyStateSlots(n, 40), int64_t{kLayers} * trace.max_slots);

  std::unique_ptr<CompressionPolicy> off = Make(budget, n, {{"decode", "off"}});
  EXPECT_FALSE(off->EvictsDuringDecode());
  EXPECT_EQ(off->SteadyStateSlots(n, 7), int64_t{kLayers} * (10 + 7));
}

TEST(ElasticCacheTest, BudgetOneIsANoOpAndBadParamsAreInvalidArgument) {
  Sums sums(16);
  std::unique_ptr<CompressionPolicy> full = Make(1.0, 16);
  for (int32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(full->ObserveLayer(sums.For(l)).ok());
  absl::StatusOr<KeepPlan> plan = full->Plan();
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
  // Errors name the map the value came from: numbers are params, strings options.
  for (const auto& [k, v] : std::vector<std::pair<std::string, PolicyParam>>{
           {"decode", "lru"}, {"fix_offset", 2.5}, {"evict_every", 0.0}, {"merge", "maybe"},
           {"window", 8.0}, {"sinks", "2"}}) {
    absl::StatusOr<std::unique_ptr<CompressionPolicy>> p =
        CreatePolicy("elastic_cache", PolicyConfig(0.5, {{k, v}}), Context(16));
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << k;
    const std::string field = std::holds_alternative<double>(v) ? "compression.params."
                                                                : "compression.options.";
    EXPECT_NE(p.status().message().find(field + k), std::string::npos) << p.status();
  }
}

// ---------------------------------------------------------------------------------------------
// The real model.

class ElasticCacheModelTest : public testing_util::ModelSessionTest {
 protected:
  struct Run {
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> tokens;
    int32_t blocks_freed = 0;
    std::vector<int32_t> slots_after_step;  // layer 0's slots after each decode step
  };

  // The engine protocol of cache/compression.h, prefill in chunks of 24.
  Run Generate(const std::vector<int32_t>& prompt, int steps, CompressionSession* session) {
    Run run;
    SequenceKv kv(L(), kModelBlock);
    const int32_t n = static_cast<int32_t>(prompt.size());
    CompactionStats stats;
    run.logits.push_back(PrefillAndCompress(prompt, 24, session, kv, &stats));
    run.blocks_freed = stats.blocks_freed;
    for (int s = 0; s < steps; ++s) {
      run.tokens.push_back(Argmax(run.logits.back()));
      run.logits.push_back(DecodeStep(kv, run.tokens.back(), n + s, session));
      run.slots_after_step.push_back(kv.num_slots(0));
      for (int32_t l = 1; l < L(); ++l) EXPECT_EQ(kv.num_slots(l), kv.num_slots(0));
      EXPECT_EQ(pool_->num_used(), kv.num_blocks_held());
    }
    kv.Release(*pool_);
    EXPECT_EQ(pool_->num_used(), 0);
    return run;
  }

  std::unique_ptr<CompressionSession> Session(double budget, int32_t tokens, Params p = {}) {
    return ModelSessionTest::Session("elastic_cache", budget, tokens, std::move(p));
  }
};

TEST_F(ElasticCacheModelTest, BudgetOneGivesIdenticalLogits) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const Run full = Generate(prompt, 6, nullptr);
  std::unique_ptr<CompressionSession> session = Session(1.0, prompt.size());
  const Run run = Generate(prompt, 6, session.get());
  EXPECT_EQ(run.blocks_freed, 0);
  ASSERT_EQ(run.logits.size(), full.logits.size());
  for (size_t i = 0; i < full.logits.size(); ++i) EXPECT_EQ(run.logits[i], full.logits[i]) << i;
}

TEST_F(ElasticCacheModelTest, MergesAtPrefillThenHoldsTheBudgetWhileDecoding) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int steps = 12;
  const Run full = Generate(prompt, steps, nullptr);
  std::unique_ptr<CompressionSession> session = Session(0.5, n);
  const Run run = Generate(prompt, steps, session.get());
  EXPECT_GT(run.blocks_freed, 0);
  for (int32_t k : session->stats().kept_per_layer) EXPECT_EQ(k, KeepCount(0.5, n));
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(run.slots_after_step[s], KeepCount(0.5, n + s + 1)) << s;
  }
  // The first token comes from the full cache.
  EXPECT_EQ(run.logits[0], full.logits[0]);
  auto agreement = [&](const Run& r) {
    int agree = 0;
    for (int s = 0; s < steps; ++s) agree += r.tokens[s] == full.tokens[s];
    return agree;
  };
  // The paper protects only the last prompt token, and its sum importance favours early tokens
  // (each key is summed over the rows after it), so on this text-only prompt the recent numbers
  // merge into a few anchors and the count restarts from the middle: a faithful failure, noted
  // in docs/compression.md. A protected recent window (protect_last) restores the continuation.
  std::unique_ptr<CompressionSession> windowed = Session(0.5, n, {{"protect_last", 16.0}});
  const Run recent = Generate(prompt, steps, windowed.get());
  for (int s = 0; s < steps; ++s) EXPECT_EQ(recent.slots_after_step[s], KeepCount(0.5, n + s + 1));
  const std::string full_text = model_->tokenizer().Decode(full.tokens, false);
  std::printf("elastic_cache 0.5, counting prompt (%d tokens), %d greedy steps: full \"%s\"; "
              "paper defaults agree on %d (\"%s\"); protect_last=16 on %d\n",
              n, steps, full_text.c_str(), agreement(run),
              model_->tokenizer().Decode(run.tokens, false).c_str(), agreement(recent));
  EXPECT_GE(agreement(recent), steps - 2);
}

}  // namespace
}  // namespace winnow::cache::policies
