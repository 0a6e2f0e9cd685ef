// The composite policy on constructed attention patterns: its presets reproduce snapkv and xkv
// plan for plan, every allocation keeps the budget and the forced slots, evict_text keeps the
// text, merging forms valid groups, and bad options are refused naming the field.
#include "cache/policies/composite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"
#include "tests/unit/cache/policies/policy_test_util.h"

namespace winnow::cache::policies {
namespace {

using policy_testing::Contains;
using policy_testing::Context;
using policy_testing::RandomLayers;
using policy_testing::RunPolicy;

std::unique_ptr<CompressionPolicy> Make(const std::string& name, double budget,
                                        const PolicyContext& c, PolicyParams p = {}) {
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy(name, PolicyConfig(budget, std::move(p)), c);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(*policy);
}

void ExpectSamePlans(const std::string& other, const PolicyParams& other_params,
                     const PolicyParams& composite_params) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 10; ++trial) {
    const int32_t n = 80 + static_cast<int32_t>(rng() % 80);
    const PolicyContext c = Context(4, 4, 2, n, {});
    const double budget = 0.3 + 0.4 * (rng() % 100) / 100.0;
    auto a = Make("composite", budget, c, composite_params);
    auto b = Make(other, budget, c, other_params);
    ASSERT_EQ(a->Observation().window_begin, b->Observation().window_begin);
    const std::vector<policy_testing::LogitFn> layers = RandomLayers(rng, 4);
    const KeepPlan pa = RunPolicy(*a, c, layers);
    const KeepPlan pb = RunPolicy(*b, c, layers);
    ASSERT_EQ(pa.layers.size(), pb.layers.size());
    for (size_t l = 0; l < pa.layers.size(); ++l) {
      EXPECT_EQ(pa.layers[l].heads, pb.layers[l].heads) << other << " layer " << l;
    }
    EXPECT_EQ(a->SteadyStateSlots(n, 5), b->SteadyStateSlots(n, 5));
  }
}

TEST(CompositePolicy, UniformPresetIsSnapKv) {
  ExpectSamePlans("snapkv", {},
                  {{"allocation", "uniform"}, {"sinks", 0.0}, {"window", 32.0},
                   {"kernel", 5.0}, {"pooling", "avg"}, {"gqa", "mean"}});
}

TEST(CompositePolicy, GlobalPresetIsXkv) {
  ExpectSamePlans("xkv", {},
                  {{"allocation", "global"}, {"sinks", 0.0}, {"window", 8.0},
                   {"kernel", 7.0}, {"pooling", "avg"}, {"gqa", "mean"}});
}

TEST(CompositePolicy, EveryAllocationKeepsTheBudgetSinksAndWindow) {
  std::mt19937 rng(3);
  for (const char* allocation :
       {"uniform", "pyramid", "global", "neediest", "sparsity", "strength_skew"}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int32_t n = 60 + static_cast<int32_t>(rng() % 100);
      const PolicyContext c = Context(5, 4, 2, n, {});
      const double budget = 0.02 + 0.9 * (rng() % 1000) / 1000.0;
      const bool merge = trial % 2 == 1;
      auto policy = Make("composite", budget, c,
                         {{"allocation", allocation}, {"window", 12.0}, {"sinks", 3.0},
                          {"merge", merge ? "true" : "false"},
                          {"full_layers", static_cast<double>(trial % 3)},
                          {"neighbours", static_cast<double>(trial % 4)}});
      const KeepPlan plan = RunPolicy(*policy, c, RandomLayers(rng, 5));
      const int32_t per_layer = KeepCount(budget, n);
      int64_t total = 0;
      for (int32_t l = 0; l < 5; ++l) {
        if (plan.layers.empty() || plan.layers[l].untouched()) {
          total += n;
          continue;
        }
        total += plan.layers[l].kept();
        const int32_t full = trial % 3;  // when the budget pays for them
        if (5 * per_layer >= full * n + (5 - full) * std::min(15, per_layer)) {
          EXPECT_GE(l, full) << "a full layer was compressed";
        }
        if (per_layer < 15) continue;  // the budget cannot hold every sink and window slot
        for (const std::vector<int32_t>& head : plan.layers[l].heads) {
          for (int32_t p : {0, 1, 2, n - 12, n - 1}) {
            EXPECT_TRUE(Contains(head, p)) << allocation << " layer " << l << " pos " << p;
          }
        }
      }
      EXPECT_LE(total, int64_t{5} * per_layer) << allocation << " budget " << budget;
      EXPECT_LE(total, policy->SteadyStateSlots(n, 0)) << allocation;
    }
  }
}

TEST(CompositePolicy, EvictTextFalseKeepsEveryTextToken) {
  policy_testing::ExpectPromptBudgetCountsKeptText("composite", {{"evict_text", "false"}});
}

TEST(CompositePolicy, MergeGroupsJoinTheNearestKeptScoredToken) {
  const int32_t n = 100;
  const PolicyContext c = Context(2, 2, 1, n, {});
  auto policy = Make("composite", 0.2, c,
                     {{"merge", "true"}, {"window", 8.0}, {"sinks", 2.0}, {"kernel", 1.0}});
  // Two peaks the window attends to: 30 and 60 (and nothing else stands out).
  policy_testing::LogitFn peaks = [](int32_t, int32_t, int32_t j) {
    return (j == 30 || j == 60) ? 8.0 : 0.0;
  };
  const KeepPlan plan = RunPolicy(*policy, c, {peaks, peaks});
  ASSERT_EQ(plan.layers.size(), 2u);
  for (const LayerKeep& layer : plan.layers) {
    ASSERT_FALSE(layer.untouched());
    ASSERT_EQ(layer.merge.size(), 1u);
    const std::vector<int32_t>& kept = layer.heads[0];
    const std::vector<std::vector<int32_t>>& groups = layer.merge[0];
    ASSERT_EQ(groups.size(), kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_TRUE(Contains(groups[i], kept[i]));
      // Sinks and window entries absorb nothing.
      if (kept[i] < 2 || kept[i] >= n - 8) {
        EXPECT_EQ(groups[i].size(), 1u) << kept[i];
      }
    }
    EXPECT_TRUE(Contains(kept, 30));
    EXPECT_TRUE(Contains(kept, 60));
  }
}

// mass_merge hands the compaction the window's attention on every slot (its query heads'
// mean, summed over the rows) and the scored range as the one that absorbs; it needs a cache
// with logit biases and refuses to be combined with the mean merge.
TEST(CompositePolicy, MassMergeCarriesTheWindowsAttentionToTheCompaction) {
  const int32_t n = 100;
  PolicyContext c = Context(2, 4, 2, n, {});
  const PolicyParams params = {{"mass_merge", "true"}, {"window", 8.0}, {"sinks", 2.0}};
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> refused =
      CreatePolicy("composite", PolicyConfig(0.2, params), c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("mass_merge"), std::string::npos);
  c.dims.logit_bias = true;
  auto policy = Make("composite", 0.2, c, params);
  policy_testing::LogitFn peaks = [](int32_t h, int32_t, int32_t j) {
    return (j == 30 || j == 60) ? 4.0 + h : 0.0;
  };
  const KeepPlan plan = RunPolicy(*policy, c, {peaks, peaks});
  policy_testing::FakeLayer window =
      policy_testing::MakeLayer(0, 4, 2, n, policy->Observation().window_begin, peaks);
  for (const LayerKeep& layer : plan.layers) {
    ASSERT_EQ(layer.mass.size(), 2u);
    EXPECT_EQ(layer.absorb_begin, 2);
    EXPECT_EQ(layer.absorb_end, n - 8);
    EXPECT_FLOAT_EQ(layer.min_similarity, 0.8f);
    for (int32_t g = 0; g < 2; ++g) {
      for (int32_t j : {0, 30, 45, 99}) {
        double want = 0.0;
        for (int32_t h = 2 * g; h < 2 * g + 2; ++h) {
          for (int32_t r = 0; r < 8; ++r) want += window.probs[(h * 8 + r) * n + j] / 2.0;
        }
        EXPECT_NEAR(layer.mass[g][j], want, 1e-5) << g << " " << j;
      }
    }
  }
  EXPECT_FALSE(
      CreatePolicy("composite", PolicyConfig(0.2, {{"mass_merge", "true"}, {"merge", "true"}}), c)
          .ok());
}

class AllRowsScorer : public testing::TestWithParam<const char*> {};

// The window rows attend uniformly, so the heavy columns of every prompt row decide, for the
// accumulated scorer alone and for the hybrid one.
TEST_P(AllRowsScorer, KeepsTheHeaviestColumns) {
  const int32_t n = 64;
  const PolicyContext c = Context(1, 2, 1, n, {});
  auto policy = Make("composite", 0.25, c,
                     {{"scorer", GetParam()}, {"window", 4.0}, {"sinks", 0.0},
                      {"kernel", 1.0}, {"allocation", "uniform"}});
  ASSERT_EQ(policy->Observation().window_begin, n - 4);
  ASSERT_TRUE(policy->Observation().accumulate_all_rows);
  policy_testing::FakeLayer f = policy_testing::MakeLayer(
      0, 2, 1, n, n - 4, [](int32_t, int32_t, int32_t) { return 0.0; });
  std::vector<float> columns(2 * n, 1.0f);
  const std::vector<int32_t> heavy = {3, 9, 17, 20, 33, 40, 41, 50, 51, 52, 55, 59};
  for (int32_t j : heavy) columns[j] = columns[n + j] = 9.0f;
  ObservationAttention view = f.View();
  view.column_sums = columns;
  ASSERT_TRUE(policy->ObserveLayer(view).ok());
  absl::StatusOr<KeepPlan> plan = policy->Plan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->layers[0].kept(), 16);  // 4 window + 12 scored
  for (int32_t j : heavy) EXPECT_TRUE(Contains(plan->layers[0].heads[0], j)) << j;

  // Without column sums the observation is refused, not misread.
  auto again = Make("composite", 0.25, c, {{"scorer", GetParam()}, {"window", 4.0}});
  EXPECT_FALSE(again->ObserveLayer(f.View()).ok());
}

INSTANTIATE_TEST_SUITE_P(CompositePolicy, AllRowsScorer,
                         testing::Values("accumulated", "hybrid"));

// Uniform window attention: the value norms alone decide, per KV head (query heads 0-1 read KV
// head 0, 2-3 KV head 1).
TEST(CompositePolicy, ValueNormWeightsEachKvHeadsScores) {
  const int32_t n = 64;
  const PolicyContext c = Context(1, 4, 2, n, {});
  auto policy = Make("composite", 0.25, c,
                     {{"value_norm", "true"}, {"window", 4.0}, {"sinks", 0.0},
                      {"kernel", 1.0}, {"allocation", "uniform"}});
  ASSERT_TRUE(policy->Observation().value_norms);
  policy_testing::FakeLayer f = policy_testing::MakeLayer(
      0, 4, 2, n, n - 4, [](int32_t, int32_t, int32_t) { return 0.0; });
  std::vector<float> norms(2 * n, 1.0f);
  const std::vector<std::vector<int32_t>> heavy = {{2, 7, 11, 19, 23, 30, 31, 38, 44, 47, 52, 58},
                                                   {1, 5, 13, 17, 26, 29, 35, 40, 41, 49, 53, 57}};
  for (int32_t g = 0; g < 2; ++g) {
    for (int32_t j : heavy[g]) norms[g * n + j] = 4.0f;
  }
  ObservationAttention view = f.View();
  view.value_norms = norms;
  ASSERT_TRUE(policy->ObserveLayer(view).ok());
  absl::StatusOr<KeepPlan> plan = policy->Plan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->layers[0].kept(), 16);  // 4 window + 12 scored
  for (int32_t g = 0; g < 2; ++g) {
    for (int32_t j : heavy[g]) EXPECT_TRUE(Contains(plan->layers[0].heads[g], j)) << g << " " << j;
  }
  // Without value norms the observation is refused, not misread.
  auto again = Make("composite", 0.25, c, {{"value_norm", "true"}, {"window", 4.0}});
  EXPECT_FALSE(again->ObserveLayer(f.View()).ok());
}

// The window rows attend uniformly; the reply's lookahead tokens attend to `heavy`, which the
// plan after them keeps (and the plan without them does not), with the lookahead's slots.
TEST(CompositePolicy, LookaheadScoresWithTheRepliesFirstTokens) {
  const int32_t n = 64;
  const int32_t lookahead = 3;
  const PolicyContext c = Context(1, 2, 1, n, {});
  const std::vector<int32_t> heavy = {3, 9, 17, 20, 33, 40, 41, 50, 51, 52, 55, 59};
  const PolicyParams params = {{"window", 4.0}, {"sinks", 0.0}, {"kernel", 1.0},
                               {"allocation", "uniform"}};
  policy_testing::FakeLayer f = policy_testing::MakeLayer(
      0, 2, 1, n, n - 4, [](int32_t, int32_t, int32_t) { return 0.0; });
  auto keeps_heavy = [&](const std::vector<int32_t>& kept) {
    return std::all_of(heavy.begin(), heavy.end(), [&](int32_t j) { return Contains(kept, j); });
  };

  auto plain = Make("composite", 0.25, c, params);
  ASSERT_TRUE(plain->ObserveLayer(f.View()).ok());
  absl::StatusOr<KeepPlan> plan = plain->Plan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(keeps_heavy(plan->layers[0].heads[0]));

  PolicyParams with = params;
  with["lookahead"] = double{lookahead};
  auto policy = Make("composite", 0.25, c, with);
  EXPECT_EQ(policy->LookaheadSteps(), lookahead);
  ASSERT_TRUE(policy->ObserveLayer(f.View()).ok());
  EXPECT_EQ(policy->Plan().status().code(), absl::StatusCode::kFailedPrecondition);
  SlotPositions slots(1, 1);
  slots.AppendRange(0, n);
  for (int32_t t = 0; t < lookahead; ++t) {
    ASSERT_TRUE(policy->WantsDecodeAttention());
    slots.AppendRange(n + t, 1);
    const int32_t num_slots = n + t + 1;
    std::vector<std::vector<float>> attention(1, std::vector<float>(2 * num_slots, 0.0f));
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t j : heavy) attention[0][h * num_slots + j] = 1.0f / heavy.size();
    }
    DecodeStep step;
    step.position = n + t;
    step.tokens_seen = n + t + 1;
    step.slots = &slots;
    step.attention = attention;
    absl::StatusOr<KeepPlan> during = policy->OnDecodeStep(step);
    ASSERT_TRUE(during.ok()) << during.status();
    EXPECT_TRUE(during->empty());
  }
  EXPECT_FALSE(policy->WantsDecodeAttention());
  plan = policy->Plan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->Validate(c.dims, [&](int32_t) { return n + lookahead; }).ok());
  const std::vector<int32_t>& kept = plan->layers[0].heads[0];
  ASSERT_EQ(kept.size(), 16u + lookahead);  // 4 window + 12 scored + the lookahead's
  EXPECT_TRUE(keeps_heavy(kept));
  for (int32_t j = n - 4; j < n + lookahead; ++j) EXPECT_TRUE(Contains(kept, j)) << j;

  // Budget 1 compresses nothing, so there is nothing to wait for.
  EXPECT_EQ(Make("composite", 1.0, c, with)->LookaheadSteps(), 0);
  // VL-Cache's sparsity reads the rows one by one: not with a lookahead.
  with["allocation"] = "sparsity";
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> bad =
      CreatePolicy("composite", PolicyConfig(0.25, with), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("compression.params.lookahead"), std::string::npos)
      << bad.status();
}

TEST(CompositePolicy, BadOptionsNameTheField) {
  const PolicyContext c = Context(2, 2, 1, 50, {});
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> bad =
      CreatePolicy("composite", PolicyConfig(0.5, {{"allocation", "zigzag"}}), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("compression.options.allocation"), std::string::npos)
      << bad.status();
  bad = CreatePolicy("composite", PolicyConfig(0.5, {{"windw", 8.0}}), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("windw"), std::string::npos) << bad.status();
  bad = CreatePolicy("composite", PolicyConfig(0.5, {{"merge", "maybe"}}), c);
  EXPECT_FALSE(bad.ok());
}


TEST(CompositePolicy, WinnowKvIsItsPresetAndTakesOverrides) {
  ExpectSamePlans("winnowkv", {}, WinnowKvPreset());
  const PolicyContext c = Context(2, 2, 1, 80, {});
  auto preset = Make("winnowkv", 0.5, c, {{"window", 8.0}});
  EXPECT_EQ(preset->name(), "winnowkv");
  EXPECT_EQ(preset->Observation().window_begin, 72);  // the client's window wins
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> bad =
      CreatePolicy("winnowkv", PolicyConfig(0.5, {{"windw", 8.0}}), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("winnowkv"), std::string::npos) << bad.status();
}

TEST(CompositePolicy, WinnowKvDocsAsksForEveryRowAndTheValueNorms) {
  const PolicyContext c = Context(2, 2, 1, 200, {});
  auto docs = Make("winnowkv_docs", 0.5, c);
  EXPECT_EQ(docs->name(), "winnowkv_docs");
  EXPECT_EQ(docs->Observation().window_begin, 168);  // 32 rows (30 sinks fit beside them)
  EXPECT_TRUE(docs->Observation().accumulate_all_rows);
  EXPECT_TRUE(docs->Observation().value_norms);
  auto without = Make("winnowkv_docs", 0.5, c, {{"value_norm", "false"}, {"scorer", "window"}});
  EXPECT_FALSE(without->Observation().value_norms);
  EXPECT_FALSE(without->Observation().accumulate_all_rows);
}

}  // namespace
}  // namespace winnow::cache::policies
