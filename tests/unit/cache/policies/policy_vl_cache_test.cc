// VL-Cache on constructed attention patterns: Alg. 1's sparsity and budget split by hand, the
// sharp tokens kept per KV head, the dense layer funded over the sparse one, and the budget /
// modality invariants on random patterns.
#include "cache/policies/vl_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "cache/policies/layer_budget_split.h"
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

// The constructed patterns check the paper's per-layer split of the span tokens, so the budget
// is a fraction of the spans (`budget_of=spans`) and only span tokens are ranked (`rank=spans`)
// unless a test says otherwise.
std::unique_ptr<CompressionPolicy> Make(double budget, const PolicyContext& c,
                                        PolicyParams p = {}) {
  p.try_emplace("budget_of", "spans");
  p.try_emplace("rank", "spans");
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy("vl_cache", PolicyConfig(budget, std::move(p)), c);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(*policy);
}

TEST(VlCacheSparsity, HandExample) {
  // One head, n = 4, rows at positions 2 and 3. Row 2 is flat over its 3 visible keys (nothing
  // sparse); row 3 has one dominant key and three far below 1% of it. Gamma = 3 / (3 + 4).
  FakeLayer f = MakeLayer(0, 1, 1, 4, 2, [](int32_t, int32_t pos, int32_t j) {
    if (pos == 2) return 0.0;
    return j == 1 ? 10.0 : 0.0;
  });
  EXPECT_NEAR(VlCacheLayerSparsity(f.View(), 0.01), 3.0 / 7.0, 1e-9);
  // The test is relative: at p = 1e-6 the e^-10 entries (4.5e-5 of the max) are not sparse.
  EXPECT_NEAR(VlCacheLayerSparsity(f.View(), 1e-6), 0.0, 1e-9);
}

TEST(VlCacheSparsity, AveragesHeads) {
  FakeLayer f = MakeLayer(0, 2, 1, 4, 3, [](int32_t h, int32_t, int32_t j) {
    return h == 0 ? 0.0 : (j == 0 ? 20.0 : 0.0);
  });
  // Head 0 flat: 0; head 1: 3 of 4 sparse.
  EXPECT_NEAR(VlCacheLayerSparsity(f.View(), 0.01), 0.5 * 0.75, 1e-9);
}

TEST(VlCacheFractions, PaperWorkedExamples) {
  const std::vector<double> gamma = {0.70, 0.90, 0.95, 0.99};
  std::vector<double> b = VlCacheLayerFractions(gamma, 0.1, 0.01, 1.0);
  EXPECT_NEAR(b[0], 0.2609, 1e-4);
  EXPECT_NEAR(b[1], 0.0870, 1e-4);
  EXPECT_NEAR(b[2], 0.0435, 1e-4);
  EXPECT_NEAR(b[3], 0.01, 1e-9);  // clipped up from 0.0087
  b = VlCacheLayerFractions(gamma, 0.6, 0.01, 1.0);
  EXPECT_NEAR(b[0], 1.0, 1e-9);  // clipped down from 1.565; the paper drops the excess
  EXPECT_NEAR(b[1], 0.5217, 1e-4);
  EXPECT_NEAR(b[2], 0.2609, 1e-4);
  EXPECT_NEAR(b[3], 0.0522, 1e-4);
}

// Prompt: text [0, 4), image [4, 44), text [44, 60). Post-vision rows: [44, 60).
constexpr int32_t kN = 60;
const std::vector<PromptSpan> kSpans = {{SpanKind::kImage, 4, 44}};

TEST(VlCachePolicy, SharpTokensKeptPerKvHead) {
  const PolicyContext c = Context(2, 4, 2, kN, kSpans);
  auto policy = Make(0.2, c);
  ASSERT_EQ(policy->Observation().window_begin, 44);
  // KV head 0's query heads (0, 1) look at visual tokens 10, 20, 30; KV head 1's (2, 3) at
  // 12, 22, 32. Both layers equally sharp, so both get 0.2 * 40 = 8 visual tokens.
  LogitFn sharp = [](int32_t h, int32_t, int32_t j) {
    const int32_t off = h < 2 ? 0 : 2;
    return (j == 10 + off || j == 20 + off || j == 30 + off) ? 8.0 : 0.0;
  };
  const KeepPlan plan = RunPolicy(*policy, c, {sharp, sharp});
  ASSERT_EQ(plan.layers.size(), 2u);
  for (int32_t l = 0; l < 2; ++l) {
    const LayerKeep& keep = plan.layers[l];
    ASSERT_EQ(keep.kept(), 20 + 8);  // 20 text tokens + 8 visual
    for (int32_t g = 0; g < 2; ++g) {
      const int32_t off = g == 0 ? 0 : 2;
      for (int32_t t : {10, 20, 30}) EXPECT_TRUE(Contains(keep.heads[g], t + off)) << l << g << t;
      for (int32_t p = 0; p < kN; ++p) {
        if (p < 4 || p >= 44) {
          EXPECT_TRUE(Contains(keep.heads[g], p)) << "text " << p;
        }
      }
    }
  }
}

TEST(VlCachePolicy, DenseLayerGetsMoreThanSparseLayer) {
  const PolicyContext c = Context(2, 2, 1, kN, kSpans);
  auto policy = Make(0.25, c);
  LogitFn dense = [](int32_t, int32_t, int32_t j) { return 0.01 * (j % 7); };
  LogitFn sparse = [](int32_t, int32_t, int32_t j) { return j == 17 ? 12.0 : 0.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {dense, sparse});
  ASSERT_EQ(plan.layers.size(), 2u);
  const int32_t text = 20;
  const int32_t kept0 = plan.layers[0].untouched() ? kN : plan.layers[0].kept();
  const int32_t kept1 = plan.layers[1].kept();
  EXPECT_GT(kept0, kept1);
  // Budget: at most floor(0.25 * 2 layers * 40) = 20 visual tokens in all.
  EXPECT_LE((kept0 - text) + (kept1 - text), 20);
  // The sparse layer keeps its one sharp token if it keeps any visual token.
  if (kept1 > text) {
    EXPECT_TRUE(Contains(plan.layers[1].heads[0], 17));
  }
}

TEST(VlCachePolicy, RandomPatternsKeepInvariants) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 40 + static_cast<int32_t>(rng() % 60);
    const int32_t a = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t b = a + 10 + static_cast<int32_t>(rng() % (n - a - 14));
    std::vector<PromptSpan> spans = {{SpanKind::kContext, a, b}};
    const PolicyContext c = Context(3, 4, 2, n, spans);
    const double budget = 0.05 + 0.9 * (rng() % 1000) / 1000.0;
    auto policy = Make(budget, c);
    std::vector<LogitFn> fns;
    for (int32_t l = 0; l < 3; ++l) fns.push_back(RandomLogits(rng(), 2.0 + 4.0 * l));
    const KeepPlan plan = RunPolicy(*policy, c, fns);
    const int32_t base = b - a;
    auto in_span = [&](int32_t p) { return p >= a && p < b; };
    const PlanTotals kept = ExpectTextKept(plan, 3, n, in_span);
    // Every KV head of a layer keeps the same number of span tokens.
    for (int32_t l = 0; l < 3 && !plan.layers.empty(); ++l) {
      if (plan.layers[l].untouched()) continue;
      for (const std::vector<int32_t>& head : plan.layers[l].heads) {
        int32_t visual = 0;
        for (int32_t p = 0; p < n; ++p) visual += in_span(p) && Contains(head, p);
        EXPECT_EQ(visual, plan.layers[l].kept() - (n - base));
      }
    }
    EXPECT_LE(kept.span, static_cast<int64_t>(std::floor(budget * 3 * base + 1e-6)));
    EXPECT_LE(kept.slots, policy->SteadyStateSlots(n, 0));
  }
}

TEST(VlCachePolicy, TextOnlyFallbackKeepsRecentWindowWithinBudget) {
  const int32_t n = 400;
  const PolicyContext c = Context(2, 2, 1, n, {});
  auto policy = Make(0.1, c);
  EXPECT_EQ(policy->Observation().window_begin, n - 50);  // the speed bench's tau = 50
  LogitFn attend_early = [](int32_t, int32_t, int32_t j) { return j < 100 ? 3.0 : 0.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {attend_early, attend_early});
  ASSERT_EQ(plan.layers.size(), 2u);
  int64_t total = 0;
  for (const LayerKeep& keep : plan.layers) {
    const int32_t k = keep.kept();
    total += k;
    const int32_t recent = static_cast<int32_t>(std::ceil(0.1 * k));
    for (int32_t p = n - recent; p < n; ++p) EXPECT_TRUE(Contains(keep.heads[0], p));
    // The rest are the tokens the window attends to.
    int32_t early = 0;
    for (int32_t p : keep.heads[0]) early += p < 100;
    EXPECT_EQ(early, k - recent);
  }
  EXPECT_LE(total, 2 * 40);  // floor(0.1 * 400) per layer on average
}

TEST(VlCachePolicy, ImageEndingThePromptLeavesOneWindowToken) {
  // No text follows the image: the window is its last token (min_window = 1), kept; the rest
  // of the image is evictable.
  const PolicyContext c = Context(1, 1, 1, 10, {{SpanKind::kImage, 0, 10}});
  auto policy = Make(0.5, c);
  EXPECT_EQ(policy->Observation().window_begin, 9);
  const KeepPlan plan = RunPolicy(*policy, c, {[](int32_t, int32_t, int32_t j) { return 0.0; }});
  ASSERT_EQ(plan.layers.size(), 1u);
  EXPECT_EQ(plan.layers[0].kept(), 1 + 4);  // the window token + floor(0.5 * 9)
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 9));
}

// The budget splitter shared by vl_cache, aircache and xkv's profile mode.
TEST(LayerBudgetSplit, WaterFillSpreadsWhatClampingFrees) {
  std::vector<double> w = WaterFill(std::vector<double>{1, 1, 8}, 10.0, 1.0, 5.0);
  EXPECT_NEAR(w[0], 2.5, 1e-12);
  EXPECT_NEAR(w[1], 2.5, 1e-12);
  EXPECT_NEAR(w[2], 5.0, 1e-12);
  w = WaterFill(std::vector<double>{0, 1, 9}, 10.0, 0.5, 10.0);  // floor raises layer 0
  EXPECT_NEAR(w[0], 0.5, 1e-12);
  EXPECT_NEAR(w[1] + w[2], 9.5, 1e-12);
  EXPECT_NEAR(w[2] / w[1], 9.0, 1e-9);
  w = WaterFill(std::vector<double>{0, 0}, 3.0, 0.0, 10.0);  // no weight: equal split
  EXPECT_NEAR(w[0], 1.5, 1e-12);
}

TEST(LayerBudgetSplit, SpanModeCapPaysForTheTextFirst) {
  // 100 tokens, 80 of them in a span, 4 layers.
  const PromptLayout layout{100, {{SpanKind::kContext, 10, 90}}};
  const EvictableSplit split = SplitEvictable(layout, WindowRange{90, 100}, false);
  ASSERT_EQ(split.evictable.size(), 80u);
  // budget 0.5 of the prompt = 50 slots per layer, 20 of them text: 30 span tokens per layer.
  EXPECT_EQ(SpanModeCap(0.5, BudgetBase::kPrompt, 4, 100, split), 4 * 30);
  // The text alone exceeds budget 0.1: no span token is kept (the text still is).
  EXPECT_EQ(SpanModeCap(0.1, BudgetBase::kPrompt, 4, 100, split), 0);
  // budget_of=spans: 0.5 of the 80 span tokens, the text on top.
  EXPECT_EQ(SpanModeCap(0.5, BudgetBase::kSpans, 4, 100, split), 4 * 40);
  EXPECT_EQ(SpanModeCap(1.0, BudgetBase::kPrompt, 4, 100, split), 4 * 80);
}

TEST(LayerBudgetSplit, RoundBudgetsNeverExceedsTheCap) {
  const std::vector<double> t = {2.5, 2.5, 5.0};
  EXPECT_EQ(RoundBudgets(t, 10, 0, 100), (std::vector<int32_t>{3, 2, 5}));  // remainder: lower
  EXPECT_EQ(RoundBudgets(t, 8, 0, 100), (std::vector<int32_t>{2, 2, 4}));   // trim the largest
  // Clamped at hi; spreading the clamp excess is WaterFill's job, not rounding's.
  EXPECT_EQ(RoundBudgets(t, 10, 0, 4), (std::vector<int32_t>{3, 2, 4}));
  // A floor the caller insists on wins over a cap it cannot meet.
  EXPECT_EQ(RoundBudgets(std::vector<double>{0, 0}, 1, 1, 5), (std::vector<int32_t>{1, 1}));
  std::mt19937 rng(1);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<double> targets(1 + rng() % 10);
    for (double& x : targets) x = (rng() % 10000) / 100.0;
    const int64_t cap = rng() % 500;
    const std::vector<int32_t> out = RoundBudgets(targets, cap, 0, 60);
    int64_t sum = 0;
    for (int32_t c : out) {
      EXPECT_GE(c, 0);
      EXPECT_LE(c, 60);
      sum += c;
    }
    EXPECT_LE(sum, cap);
  }
}

TEST(LayerBudgetSplit, SlidingLayersKeepTheirShareOfTheWindowAndSpillTheRest) {
  ModelDims dims{5, 4, 2, 8, 16};
  dims.windows = {0, 9, 9, 0, 9};  // sliding layers read 8 past slots
  // Layers 1 and 2 keep 10 / 40 of their 8 (2) and give 8 each; layer 4 keeps ceil(5 x 8 / 40)
  // = 1 and gives 4; layers 0 and 3 share the 20 as 10 : 20 (16.67 and 33.33, the remainder
  // to the larger fraction). The sum stays 55.
  EXPECT_EQ(SpillPastWindows({10, 10, 10, 20, 5}, dims, 40, 0),
            (std::vector<int32_t>{17, 2, 2, 33, 1}));
  // Never below the floor (the slots a policy always keeps), never above the count.
  EXPECT_EQ(SpillPastWindows({10, 10, 10, 20, 5}, dims, 40, 3),
            (std::vector<int32_t>{15, 3, 3, 31, 3}));
  EXPECT_EQ(SpillPastWindows({10, 2, 10, 20, 5}, dims, 40, 3),
            (std::vector<int32_t>{13, 2, 3, 26, 3}));
  // A layer that keeps the whole prompt keeps its whole window; no full-attention layer keeps
  // more than the prompt: what does not fit is not kept.
  dims.windows = {0, 9};
  dims.num_layers = 2;
  EXPECT_EQ(SpillPastWindows({39, 40}, dims, 40, 0), (std::vector<int32_t>{40, 8}));
  EXPECT_EQ(SpillPastWindows({39, 20}, dims, 40, 0), (std::vector<int32_t>{40, 4}));
  // A prompt inside the window, or no sliding layer: the counts stand.
  EXPECT_EQ(SpillPastWindows({10, 10}, dims, 8, 0), (std::vector<int32_t>{10, 10}));
  dims.windows.clear();
  EXPECT_EQ(SpillPastWindows({10, 30}, dims, 40, 0), (std::vector<int32_t>{10, 30}));
}

TEST(LayerBudgetSplit, RankedSharesCountTheBestPicksAndSplitTies) {
  // Picks 3 of {0.9, 0.5, 0.5 | 0.5, 0.1}: 0.9 is above the 3rd best (0.5), the three 0.5s share
  // the two picks left.
  const std::vector<std::vector<float>> candidates = {{0.9f, 0.5f, 0.5f}, {0.5f, 0.1f}};
  const std::vector<double> shares = RankedShares(candidates, 3, 1.0);
  EXPECT_NEAR(shares[0], 1.0 + 2.0 * 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(shares[1], 2.0 / 3.0, 1e-12);
  // Two candidates per slot: half the shares.
  EXPECT_NEAR(RankedShares(candidates, 3, 2.0)[0], shares[0] / 2, 1e-12);
  EXPECT_EQ(RankedShares(candidates, 0, 1.0), (std::vector<double>{0.0, 0.0}));
}

TEST(LayerBudgetSplit, NeediestHeadSharesCountALayerByItsNeediestHead) {
  // Layer 0: head 0 needs three keys, head 1 none; layer 1: both heads need two. Averaged over
  // heads layer 0's needs look like 1.5 keys; by its neediest head they are 3, so 5 picks give
  // layer 0 three slots and layer 1 two.
  const std::vector<std::vector<float>> heads = {
      {0.3f, 0.3f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},   // 2 heads x 4 candidates
      {0.25f, 0.25f, 0.0f, 0.0f, 0.25f, 0.25f, 0.0f, 0.0f}};
  const std::vector<double> shares = NeediestHeadShares(heads, 2, 5);
  EXPECT_NEAR(shares[0], 3.0, 1e-12);
  EXPECT_NEAR(shares[1], 2.0, 1e-12);
}

TEST(VlCachePolicy, ParamsAreValidated) {
  const PolicyContext c = Context(2, 2, 1, kN, kSpans);
  EXPECT_FALSE(CreatePolicy("vl_cache", PolicyConfig(0.1, {{"p", 2.0}}), c).ok());
  EXPECT_FALSE(CreatePolicy("vl_cache", PolicyConfig(0.1, {{"bogus", 1.0}}), c).ok());
  EXPECT_FALSE(CreatePolicy("vl_cache", PolicyConfig(0.1, {{"selection", "x"}}), c).ok());
  EXPECT_FALSE(CreatePolicy("vl_cache", PolicyConfig(0.1, {{"pooling", "median"}}), c).ok());
  EXPECT_TRUE(
      CreatePolicy("vl_cache", PolicyConfig(0.1, {{"kernel", 7.0}, {"pooling", "max"}}), c).ok());
  EXPECT_FALSE(CreatePolicy("vl_cache", PolicyConfig(1.5, {}), c).ok());
  EXPECT_TRUE(CreatePolicy("vl_cache",
                           PolicyConfig(0.1, {{"selection", "shared"}, {"redistribute", "true"}}),
                           c)
                  .ok());
}

TEST(VlCachePolicy, RedistributeUsesTheBudgetClippingWouldDrop) {
  // One very dense layer would get beta > 1 at a large budget; redistribution hands its excess
  // to the other layer, the paper's rule drops it.
  const PolicyContext c = Context(2, 1, 1, kN, kSpans);
  LogitFn dense = [](int32_t, int32_t, int32_t) { return 0.0; };
  LogitFn sparse = [](int32_t, int32_t, int32_t j) { return j == 5 ? 12.0 : 0.0; };
  auto paper = Make(0.7, c);
  auto water = Make(0.7, c, {{"redistribute", "true"}});
  const KeepPlan a = RunPolicy(*paper, c, {dense, sparse});
  const KeepPlan b = RunPolicy(*water, c, {dense, sparse});
  auto kept = [](const KeepPlan& p, int32_t l) {
    return p.layers[l].untouched() ? kN : p.layers[l].kept();
  };
  EXPECT_EQ(kept(a, 0), kN);
  EXPECT_EQ(kept(b, 0), kN);
  EXPECT_GT(kept(b, 1), kept(a, 1));
  EXPECT_LE(kept(b, 0) + kept(b, 1) - 40, static_cast<int32_t>(0.7 * 2 * 40 + 1e-6));
}

TEST(VlCachePolicy, SharedSelectionKeepsOneSetPerLayer) {
  const PolicyContext c = Context(1, 4, 2, kN, kSpans);
  auto policy = Make(0.1, c, {{"selection", "shared"}});
  LogitFn fn = [](int32_t h, int32_t, int32_t j) { return j == 7 + h ? 6.0 : 0.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {fn});
  ASSERT_EQ(plan.layers.size(), 1u);
  EXPECT_EQ(plan.layers[0].heads[0], plan.layers[0].heads[1]);
  for (int32_t t : {7, 8, 9, 10}) EXPECT_TRUE(Contains(plan.layers[0].heads[0], t));
}

// `budget` as a fraction of the whole prompt, the kept text included, so a request's footprint
// is the same as under snapkv or h2o at that budget.
TEST(VlCachePolicy, PromptBudgetCountsTheKeptText) {
  policy_testing::ExpectPromptBudgetCountsKeptText("vl_cache",
                                                   {{"budget_of", "prompt"}, {"rank", "spans"}});
}

// The defaults (rank=all, budget_of=prompt), as in the paper: text and span keys compete in one
// top-k; only the post-vision window is forced; the whole prompt is the budget base.
TEST(VlCachePolicy, DefaultRanksTextAndSpanKeysTogether) {
  const int32_t n = 60;
  const PolicyContext c = Context(2, 2, 1, n, {{SpanKind::kContext, 10, 50}});
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy("vl_cache", PolicyConfig(0.3, {}), c);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ((*policy)->Observation().window_begin, 50);
  // The window attends to text token 3 and span tokens 20..24; everything else is flat.
  LogitFn fn = [](int32_t, int32_t, int32_t j) { return j == 3 || (j >= 20 && j < 25) ? 6.0 : 0.0; };
  const KeepPlan plan = RunPolicy(**policy, c, {fn, fn});
  ASSERT_EQ(plan.layers.size(), 2u);
  int64_t total = 0;
  for (const LayerKeep& keep : plan.layers) {
    ASSERT_FALSE(keep.untouched());
    total += keep.kept();
    for (const std::vector<int32_t>& head : keep.heads) {
      EXPECT_TRUE(Contains(head, 3));
      for (int32_t p = 20; p < 25; ++p) EXPECT_TRUE(Contains(head, p)) << p;
      for (int32_t p = 50; p < n; ++p) EXPECT_TRUE(Contains(head, p)) << "window " << p;
      EXPECT_FALSE(Contains(head, 0) && Contains(head, 1) && Contains(head, 2)) << "flat text kept";
    }
  }
  EXPECT_LE(total, 2 * KeepCount(0.3, n));
}

}  // namespace
}  // namespace winnow::cache::policies
