// AirCache on constructed attention patterns: the elite window decides which visual tokens
// matter, Eq. 10/11 by hand, a strong skewed layer funded over a weak flat one, the restricted
// softmax against a brute-force reference, and the budget / modality invariants.
#include "cache/policies/aircache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "cache/policies/policy.h"
#include "tests/unit/cache/policies/policy_test_util.h"

namespace winnow::cache::policies {
namespace {

using policy_testing::Contains;
using policy_testing::Context;
using policy_testing::ExpectTextKept;
using policy_testing::FakeLayer;
using policy_testing::LogitFn;
using policy_testing::MakeLayer;
using policy_testing::PlanTotals;
using policy_testing::RandomLogits;
using policy_testing::RunPolicy;

constexpr char kPolicy[] = "aircache";

// The constructed patterns check the paper's per-layer split of the span tokens, so the budget
// is a fraction of the spans (`budget_of=spans`) unless a test says otherwise.
std::unique_ptr<CompressionPolicy> Make(double budget, const PolicyContext& c,
                                        PolicyParams p = {}) {
  p.try_emplace("budget_of", "spans");
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy(kPolicy, PolicyConfig(budget, std::move(p)), c);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(*policy);
}

// Prompt: text [0, 4), image [4, 44), text [44, 60). Text set (observed rows): [44, 60).
constexpr int32_t kN = 60;
const std::vector<PromptSpan> kSpans = {{SpanKind::kImage, 4, 44}};

TEST(AirCacheSkewness, MatchesAdjustedFisherPearson) {
  const std::vector<float> x = {1, 2, 3, 10};
  EXPECT_NEAR(AirCacheSkewness(x), 1.7636326148038877, 1e-6);
  const std::vector<float> flat = {2, 2, 2, 2};
  EXPECT_EQ(AirCacheSkewness(flat), 0.0);
  const std::vector<float> two = {1, 5};
  EXPECT_EQ(AirCacheSkewness(two), 0.0);
  const std::vector<float> left = {10, 9, 8, 1};
  EXPECT_LT(AirCacheSkewness(left), 0.0);
}

TEST(AirCacheLayerWeights, HalfNormalisedStrengthHalfPositiveSkew) {
  const std::vector<double> strength = {1.0, 3.0};
  const std::vector<double> skew = {2.0, -1.0};
  std::vector<double> w =
      AirCacheLayerWeights(strength, skew, AirCacheOptions::Allocation::kStrengthSkew);
  // S' = [0.5, 1.5]; K+ = [2, 0] -> K' = [2, 0]; weights = [1.25, 0.75] (mean 1).
  EXPECT_NEAR(w[0], 1.25, 1e-12);
  EXPECT_NEAR(w[1], 0.75, 1e-12);
  w = AirCacheLayerWeights(strength, skew, AirCacheOptions::Allocation::kStrength);
  EXPECT_NEAR(w[0], 0.5, 1e-12);
  w = AirCacheLayerWeights(strength, std::vector<double>{-1.0, -2.0},
                           AirCacheOptions::Allocation::kSkew);
  EXPECT_NEAR(w[0], 1.0, 1e-12);  // no positive skew anywhere: uniform
  EXPECT_NEAR(w[1], 1.0, 1e-12);
}

TEST(AirCacheImportance, EqualsRestrictedSoftmaxFromLogits) {
  std::mt19937 rng(3);
  std::vector<double> logits(2 * kN * kN);
  for (double& z : logits) z = std::uniform_real_distribution<double>(-3.0, 3.0)(rng);
  // Make a few text keys clearly elite for the last row.
  for (int32_t h = 0; h < 2; ++h) {
    logits[(h * kN + 59) * kN + 50] = 6.0;
    logits[(h * kN + 59) * kN + 53] = 5.95;
  }
  auto z = [&](int32_t h, int32_t pos, int32_t j) { return logits[(h * kN + pos) * kN + j]; };
  FakeLayer f = MakeLayer(0, 2, 1, kN, 44, z);
  std::vector<int32_t> visual;
  for (int32_t p = 4; p < 44; ++p) visual.push_back(p);
  const double alpha = 0.9;
  const std::vector<float> got = AirCacheImportance(f.View(), visual, alpha);
  for (int32_t h = 0; h < 2; ++h) {
    double zmax = -1e9;
    for (int32_t j = 44; j < kN; ++j) zmax = std::max(zmax, z(h, 59, j));
    std::vector<int32_t> elite;
    for (int32_t j = 44; j < kN; ++j) {
      if (z(h, 59, j) >= zmax + std::log(alpha)) elite.push_back(j);
    }
    ASSERT_GE(elite.size(), 2u);
    std::vector<double> want(visual.size(), 0.0);
    for (int32_t e : elite) {
      double denom = 0.0;
      for (int32_t v : visual) denom += std::exp(z(h, e, v));
      for (int32_t e2 : elite) {
        if (e2 <= e) denom += std::exp(z(h, e, e2));  // causal among elite keys
      }
      for (size_t i = 0; i < visual.size(); ++i) {
        want[i] += std::exp(z(h, e, visual[i])) / denom / elite.size();
      }
    }
    for (size_t i = 0; i < visual.size(); ++i) {
      EXPECT_NEAR(got[h * visual.size() + i], want[i], 1e-5) << h << " " << i;
    }
  }
}

TEST(AirCachePolicy, EliteRowsNotTheWholeWindowChooseTheVisualTokens) {
  const PolicyContext c = Context(1, 1, 1, kN, kSpans);
  // 1 visual token of 40 per layer.
  auto policy = Make(0.025, c);
  ASSERT_EQ(policy->Observation().window_begin, 44);
  // The last token attends to text token 50 (elite); row 50 looks at visual 7. Every other
  // text row looks at visual 30 harder: a whole-window score (SnapKV) would keep 30.
  LogitFn fn = [](int32_t, int32_t pos, int32_t j) {
    if (pos == 59) return j == 50 ? 12.0 : 0.0;
    if (pos == 50) return j == 7 ? 8.0 : 0.0;
    return j == 30 ? 9.0 : 0.0;
  };
  const KeepPlan plan = RunPolicy(*policy, c, {fn});
  ASSERT_EQ(plan.layers.size(), 1u);
  ASSERT_EQ(plan.layers[0].kept(), 20 + 1);
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 7));
  EXPECT_FALSE(Contains(plan.layers[0].heads[0], 30));
}

TEST(AirCachePolicy, StrongSkewedLayerGetsMoreThanWeakFlatLayer) {
  const PolicyContext c = Context(2, 2, 1, kN, kSpans);
  auto policy = Make(0.2, c);
  // Layer 0: text rows put nearly all their visual+elite mass on visual 10, 11, 12.
  LogitFn strong = [](int32_t, int32_t, int32_t j) {
    return (j == 10 || j == 11 || j == 12) ? 8.0 : 0.0;
  };
  // Layer 1: text rows look at text; visual attention is weak and flat.
  LogitFn weak = [](int32_t, int32_t, int32_t j) { return (j >= 4 && j < 44) ? 0.0 : 5.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {strong, weak});
  ASSERT_EQ(plan.layers.size(), 2u);
  const int32_t v0 = plan.layers[0].kept() - 20;
  const int32_t v1 = plan.layers[1].kept() - 20;
  EXPECT_GT(v0, v1);
  EXPECT_GE(v1, 1);  // min_keep
  EXPECT_LE(v0 + v1, 16);  // floor(0.2 * 2 layers * 40)
  for (int32_t t : {10, 11, 12}) EXPECT_TRUE(Contains(plan.layers[0].heads[0], t));
}

TEST(AirCachePolicy, UniformAllocationSplitsEvenly) {
  const PolicyContext c = Context(2, 2, 1, kN, kSpans);
  auto policy = Make(0.2, c, {{"allocation", "uniform"}});
  LogitFn strong = [](int32_t, int32_t, int32_t j) { return j == 10 ? 8.0 : 0.0; };
  LogitFn weak = [](int32_t, int32_t, int32_t j) { return (j >= 4 && j < 44) ? 0.0 : 5.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {strong, weak});
  EXPECT_EQ(plan.layers[0].kept(), 28);
  EXPECT_EQ(plan.layers[1].kept(), 28);
}

TEST(AirCachePolicy, GqaGroupsSelectTheirOwnTokens) {
  const PolicyContext c = Context(1, 4, 2, kN, kSpans);
  auto policy = Make(0.05, c);  // 2 visual tokens per head
  LogitFn fn = [](int32_t h, int32_t, int32_t j) {
    const int32_t base = h < 2 ? 5 : 25;  // KV head 0's group vs KV head 1's group
    return (j == base || j == base + 3) ? 7.0 : 0.0;
  };
  const KeepPlan plan = RunPolicy(*policy, c, {fn});
  ASSERT_EQ(plan.layers.size(), 1u);
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 5));
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 8));
  EXPECT_TRUE(Contains(plan.layers[0].heads[1], 25));
  EXPECT_TRUE(Contains(plan.layers[0].heads[1], 28));
}

TEST(AirCachePolicy, RandomPatternsEvictOnlySpanTokensWithinBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 50 + static_cast<int32_t>(rng() % 50);
    // An image and a context span with text between and after.
    const int32_t a = 2, b = 2 + 10 + static_cast<int32_t>(rng() % 10);
    const int32_t c0 = b + 3, c1 = c0 + 10 + static_cast<int32_t>(rng() % 10);
    ASSERT_LT(c1, n - 3);
    const PolicyContext c =
        Context(3, 4, 2, n, {{SpanKind::kImage, a, b}, {SpanKind::kContext, c0, c1}});
    const double budget = 0.02 + 0.9 * (rng() % 1000) / 1000.0;
    auto policy = Make(budget, c);
    EXPECT_EQ(policy->Observation().window_begin, c1);
    std::vector<LogitFn> fns;
    for (int32_t l = 0; l < 3; ++l) fns.push_back(RandomLogits(rng(), 1.0 + 3.0 * l));
    const KeepPlan plan = RunPolicy(*policy, c, fns);
    const int32_t base = (b - a) + (c1 - c0);
    const PlanTotals kept = ExpectTextKept(
        plan, 3, n, [&](int32_t p) { return (p >= a && p < b) || (p >= c0 && p < c1); });
    EXPECT_LE(kept.span, static_cast<int64_t>(std::floor(budget * 3 * base + 1e-6)));
    EXPECT_LE(kept.slots, policy->SteadyStateSlots(n, 0));
  }
}

TEST(AirCachePolicy, TextOnlyFallbackUsesTheLastTokensAsTextSet) {
  const int32_t n = 200;
  const PolicyContext c = Context(2, 2, 1, n, {});
  auto policy = Make(0.3, c);
  EXPECT_EQ(policy->Observation().window_begin, n - 32);
  LogitFn fn = [](int32_t, int32_t, int32_t j) { return j < 20 ? 4.0 : 0.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {fn, fn});
  ASSERT_EQ(plan.layers.size(), 2u);
  int64_t total = 0;
  for (const LayerKeep& keep : plan.layers) {
    total += keep.kept();
    for (int32_t p = n - 32; p < n; ++p) EXPECT_TRUE(Contains(keep.heads[0], p));
    for (int32_t p = 0; p < 20; ++p) EXPECT_TRUE(Contains(keep.heads[0], p));
  }
  EXPECT_LE(total, 2 * 60);  // the budget counts the window: floor(0.3 * 200) per layer
  // A tiny prompt shrinks the window to the budget.
  const PolicyContext tiny = Context(1, 1, 1, 40, {});
  EXPECT_EQ(Make(0.1, tiny)->Observation().window_begin, 36);
}

TEST(AirCachePolicy, ParamsAreValidated) {
  const PolicyContext c = Context(2, 2, 1, kN, kSpans);
  EXPECT_FALSE(CreatePolicy("aircache", PolicyConfig(0.1, {{"alpha", 1.5}}), c).ok());
  EXPECT_FALSE(CreatePolicy("aircache", PolicyConfig(0.1, {{"allocation", "pyramid"}}), c).ok());
  EXPECT_FALSE(CreatePolicy("aircache", PolicyConfig(0.1, {{"tau", 3.0}}), c).ok());
  EXPECT_TRUE(CreatePolicy("aircache",
                           PolicyConfig(0.1, {{"alpha", 0.95}, {"gqa", "max"},
                                              {"selection", "shared"}, {"min_keep", 0.0}}),
                           c)
                  .ok());
}

// The default budget base: `budget` is a fraction of the whole prompt, the kept text included,
// so a request's footprint is the same as under snapkv or h2o at that budget.
TEST(AirCachePolicy, PromptBudgetCountsTheKeptText) {
  policy_testing::ExpectPromptBudgetCountsKeptText("aircache", {{"budget_of", "prompt"}});
}

}  // namespace
}  // namespace winnow::cache::policies
