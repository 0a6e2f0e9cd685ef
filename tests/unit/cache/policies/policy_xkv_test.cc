// XKV on constructed attention patterns: the global top-N equals Algorithm 1's greedy, a layer
// with many high normalised scores gets more budget, Eq. 18 mode, the SnapKV regression on a
// uniform allocation, profile mode reusing an averaged allocation, and the budget invariants.
#include "cache/policies/xkv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"
#include "tests/unit/cache/policies/policy_test_util.h"

namespace winnow::cache::policies {
namespace {

using policy_testing::Contains;
using policy_testing::Context;
using policy_testing::FakeLayer;
using policy_testing::LogitFn;
using policy_testing::MakeLayer;
using policy_testing::RunPolicy;

constexpr char kPolicy[] = "xkv";

std::unique_ptr<CompressionPolicy> Make(double budget, const PolicyContext& c,
                                        PolicyParams p = {}) {
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy(kPolicy, PolicyConfig(budget, std::move(p)), c);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(*policy);
}

// Algorithm 1 as printed (typos fixed): a wait list of each layer's next-best normalised score,
// N times take the max (first index on ties), advance that layer.
std::vector<int32_t> PaperGreedy(const std::vector<float>& scores, int32_t layers, int32_t prefix,
                                 int64_t budget) {
  std::vector<std::vector<float>> sorted(layers);
  for (int32_t l = 0; l < layers; ++l) {
    sorted[l].assign(scores.begin() + l * prefix, scores.begin() + (l + 1) * prefix);
    std::sort(sorted[l].begin(), sorted[l].end(), std::greater<float>());
  }
  std::vector<int32_t> counts(layers, 0);
  for (int64_t step = 0; step < budget; ++step) {
    int32_t best = -1;
    for (int32_t l = 0; l < layers; ++l) {
      if (counts[l] >= prefix) continue;
      if (best < 0 || sorted[l][counts[l]] > sorted[best][counts[best]]) best = l;
    }
    if (best < 0) break;
    ++counts[best];
  }
  return counts;
}

std::vector<float> RandomNormalised(std::mt19937& rng, int32_t layers, int32_t prefix) {
  std::vector<float> s(static_cast<size_t>(layers) * prefix);
  for (int32_t l = 0; l < layers; ++l) {
    const double shape = 0.2 + 3.0 * (rng() % 100) / 100.0;  // diffuse to peaked layers
    double sum = 0.0;
    for (int32_t i = 0; i < prefix; ++i) {
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      s[l * prefix + i] = static_cast<float>(std::pow(u, 1.0 + 8.0 * shape));
      sum += s[l * prefix + i];
    }
    for (int32_t i = 0; i < prefix; ++i) s[l * prefix + i] /= static_cast<float>(sum);
  }
  return s;
}

TEST(XkvAllocate, EqualsThePapersGreedy) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    const int32_t layers = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t prefix = 1 + static_cast<int32_t>(rng() % 60);
    const std::vector<float> s = RandomNormalised(rng, layers, prefix);
    const int64_t budget = static_cast<int64_t>(rng() % (layers * prefix + 5));
    const XkvAllocation got = XkvAllocate(s, layers, prefix, budget, 0, 0.0);
    EXPECT_EQ(got.counts, PaperGreedy(s, layers, prefix, budget)) << trial;
    int64_t sum = 0;
    for (int32_t c : got.counts) sum += c;
    EXPECT_EQ(sum, std::min<int64_t>(budget, int64_t{layers} * prefix));
  }
}

TEST(XkvAllocate, TiesGoToTheLowerLayer) {
  const std::vector<float> s = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_EQ(XkvAllocate(s, 2, 4, 3, 0, 0.0).counts, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(PaperGreedy(s, 2, 4, 3), (std::vector<int32_t>{3, 0}));
}

TEST(XkvAllocate, LayerWithManyHighScoresGetsMore) {
  // Layer 0: ten tokens at 0.09 each (0.9 of its mass); layer 1: one token at 0.9.
  const int32_t prefix = 40;
  std::vector<float> s(2 * prefix);
  for (int32_t i = 0; i < prefix; ++i) {
    s[i] = i < 10 ? 0.09f : 0.1f / 30;
    s[prefix + i] = i == 0 ? 0.9f : 0.1f / 39;
  }
  const XkvAllocation a = XkvAllocate(s, 2, prefix, 11, 0, 0.0);
  EXPECT_EQ(a.counts, (std::vector<int32_t>{10, 1}));
  EXPECT_NEAR(a.r_avg, 0.9, 1e-5);
}

TEST(XkvAllocate, RTargetTakesTheFewestTokens) {
  std::mt19937 rng(9);
  const std::vector<float> s = RandomNormalised(rng, 4, 50);
  const XkvAllocation a = XkvAllocate(s, 4, 50, 200, 0, 0.6);
  EXPECT_GE(a.r_avg, 0.6 - 1e-6);
  int64_t n = 0;
  for (int32_t c : a.counts) n += c;
  // One token fewer (the greedy's last pick undone) misses the target.
  const XkvAllocation fewer = XkvAllocate(s, 4, 50, n - 1, 0, 0.0);
  EXPECT_LT(fewer.r_avg, 0.6);
  // The budget stays a cap.
  const XkvAllocation capped = XkvAllocate(s, 4, 50, 5, 0, 0.99);
  int64_t m = 0;
  for (int32_t c : capped.counts) m += c;
  EXPECT_EQ(m, 5);
}

TEST(XkvAllocate, FloorPerLayer) {
  const int32_t prefix = 20;
  std::vector<float> s(2 * prefix, 0.0f);
  s[0] = 1.0f;  // layer 0: one token holds everything
  for (int32_t i = 0; i < prefix; ++i) s[prefix + i] = 1.0f / prefix;
  EXPECT_EQ(XkvAllocate(s, 2, prefix, 6, 0, 0.0).counts, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(XkvAllocate(s, 2, prefix, 6, 3, 0.0).counts, (std::vector<int32_t>{3, 3}));
}

TEST(XkvPolicy, IdenticalLayersReduceToSnapKv) {
  const int32_t n = 120;
  const PolicyContext c = Context(4, 4, 2, n, {});
  auto xkv = Make(0.25, c);
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> snap = CreatePolicy(
      "snapkv", PolicyConfig(0.25, {{"window", 8.0}, {"kernel", 7.0}, {"pooling", "avg"}}), c);
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(xkv->Observation().window_begin, n - 8);
  ASSERT_EQ((*snap)->Observation().window_begin, n - 8);
  LogitFn fn = [](int32_t h, int32_t pos, int32_t j) {
    return std::sin(0.37 * j + 1.3 * h) * 2.0 + std::cos(0.11 * pos * j) * 0.5;
  };
  std::vector<LogitFn> fns(4, fn);
  const KeepPlan a = RunPolicy(*xkv, c, fns);
  const KeepPlan b = RunPolicy(**snap, c, fns);
  ASSERT_EQ(a.layers.size(), 4u);
  ASSERT_EQ(b.layers.size(), 4u);
  for (int32_t l = 0; l < 4; ++l) EXPECT_EQ(a.layers[l].heads, b.layers[l].heads) << l;
}

TEST(XkvPolicy, BudgetFollowsHowSpreadEachLayersImportanceIs) {
  const int32_t n = 108;  // prefix 100 + window 8
  const PolicyContext c = Context(2, 2, 1, n, {});
  // 21 per layer: 2 * 21 - 2 * 8 = 26 prefix tokens in all. No pooling here: a kernel-7 average
  // would smear layer 1's two peaks over 14 neighbours and flatten layer 0's comb.
  auto policy = Make(0.2, c, {{"kernel", 1.0}});
  // Layer 0: the window spreads its attention over 20 tokens; layer 1 over 2.
  LogitFn spread = [](int32_t, int32_t, int32_t j) { return (j % 5 == 0) ? 6.0 : 0.0; };
  LogitFn peaked = [](int32_t, int32_t, int32_t j) { return (j == 30 || j == 70) ? 9.0 : 0.0; };
  const KeepPlan plan = RunPolicy(*policy, c, {spread, peaked});
  ASSERT_EQ(plan.layers.size(), 2u);
  const int32_t k0 = plan.layers[0].kept() - 8;
  const int32_t k1 = plan.layers[1].kept() - 8;
  EXPECT_EQ(k0 + k1, 26);
  EXPECT_GT(k0, k1);
  for (int32_t t : {30, 70}) EXPECT_TRUE(Contains(plan.layers[1].heads[0], t));
  for (const LayerKeep& keep : plan.layers) {
    for (int32_t p = n - 8; p < n; ++p) EXPECT_TRUE(Contains(keep.heads[0], p));
  }
}

TEST(XkvPolicy, RandomPatternsStayWithinBudget) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 20 + static_cast<int32_t>(rng() % 100);
    const int32_t layers = 1 + static_cast<int32_t>(rng() % 5);
    const PolicyContext c = Context(layers, 4, 2, n, {});
    const double budget = 0.02 + 0.95 * (rng() % 1000) / 1000.0;
    auto policy = Make(budget, c, {{"min_per_layer", static_cast<double>(rng() % 4)}});
    std::vector<LogitFn> fns;
    for (int32_t l = 0; l < layers; ++l) {
      const uint32_t seed = rng();
      fns.push_back([seed, l](int32_t h, int32_t pos, int32_t j) {
        const uint32_t x = (seed ^ (h * 7919u) ^ (pos * 104729u) ^ (j * 15485863u)) * 2654435761u;
        return (x % 1000) / 1000.0 * (1.0 + 2.0 * l);
      });
    }
    const KeepPlan plan = RunPolicy(*policy, c, fns);
    int64_t slots = 0;
    for (int32_t l = 0; l < layers; ++l) {
      const bool all = plan.layers.empty() || plan.layers[l].untouched();
      slots += all ? n : plan.layers[l].kept();
      if (all) continue;
      for (const std::vector<int32_t>& head : plan.layers[l].heads) {
        EXPECT_TRUE(Contains(head, n - 1));  // the window's last token, always
      }
    }
    EXPECT_LE(slots, int64_t{layers} * KeepCount(budget, n)) << trial;
    EXPECT_LE(slots, policy->SteadyStateSlots(n, 0));
  }
}

TEST(XkvPolicy, ProfileModeReusesTheAveragedAllocation) {
  XkvProfileStore::Global().Clear();
  const int32_t n = 108;
  const PolicyContext c = Context(2, 2, 1, n, {});
  LogitFn spread = [](int32_t, int32_t, int32_t j) { return (j % 5 == 0) ? 6.0 : 0.0; };
  LogitFn peaked = [](int32_t, int32_t, int32_t j) { return (j == 30 || j == 70) ? 9.0 : 0.0; };
  const PolicyParams params = {
      {"mode", "profile"}, {"category", 7.0}, {"profile_warmup", 1.0}, {"profile_rate", 0.0},
      {"kernel", 1.0}};
  // The first request of category 7 is profiled: its own allocation, recorded.
  auto first = Make(0.2, c, params);
  const KeepPlan a = RunPolicy(*first, c, {spread, peaked});
  EXPECT_EQ(XkvProfileStore::Global().Samples(7, 2), 1);
  const int32_t a0 = a.layers[0].kept() - 8;
  const int32_t a1 = a.layers[1].kept() - 8;
  ASSERT_GT(a0, a1);
  // The next one has the opposite pattern but reuses the category's shares.
  auto second = Make(0.2, c, params);
  const KeepPlan b = RunPolicy(*second, c, {peaked, spread});
  EXPECT_EQ(XkvProfileStore::Global().Samples(7, 2), 1);
  EXPECT_EQ(b.layers[0].kept() - 8, a0);
  EXPECT_EQ(b.layers[1].kept() - 8, a1);
  // It still selects its own tokens within those budgets.
  for (int32_t t : {30, 70}) EXPECT_TRUE(Contains(b.layers[0].heads[0], t));
  // Another category knows nothing yet and profiles itself.
  auto other = Make(0.2, c, {{"mode", "profile"}, {"category", 8.0}, {"kernel", 1.0}});
  const KeepPlan d = RunPolicy(*other, c, {peaked, spread});
  EXPECT_LT(d.layers[0].kept(), d.layers[1].kept());
  EXPECT_EQ(XkvProfileStore::Global().Samples(8, 2), 1);
  XkvProfileStore::Global().Clear();
}

TEST(XkvProfileStore, SamplesWarmupThenEveryPeriod) {
  XkvProfileStore store;
  std::vector<bool> sampled;
  for (int i = 0; i < 25; ++i) {
    const bool s = store.ShouldProfile(1, 4, 3, 0.1);
    sampled.push_back(s);
    if (s) store.Record(1, std::vector<int32_t>{1, 2, 3, 4});
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(sampled[i]);
  int after = 0;
  for (int i = 3; i < 25; ++i) after += sampled[i];
  EXPECT_EQ(after, 2);  // requests 12 and 22
  EXPECT_TRUE(sampled[12]);
  const std::optional<std::vector<double>> avg = store.Average(1, 4);
  ASSERT_TRUE(avg.has_value());
  EXPECT_NEAR((*avg)[3], 0.4, 1e-12);
  EXPECT_FALSE(store.Average(1, 5).has_value());
}

TEST(XkvPolicy, ShortPromptsAreNotCompressed) {
  const PolicyContext c = Context(2, 2, 1, 8, {});
  auto policy = Make(1.0, c);
  const KeepPlan plan = RunPolicy(*policy, c, {[](int32_t, int32_t, int32_t) { return 0.0; },
                                               [](int32_t, int32_t, int32_t) { return 0.0; }});
  EXPECT_TRUE(plan.empty());
}

TEST(XkvPolicy, ParamsAreValidated) {
  const PolicyContext c = Context(2, 2, 1, 100, {});
  EXPECT_FALSE(CreatePolicy("xkv", PolicyConfig(0.1, {{"mode", "offline"}}), c).ok());
  EXPECT_FALSE(CreatePolicy("xkv", PolicyConfig(0.1, {{"r_target", 2.0}}), c).ok());
  EXPECT_FALSE(CreatePolicy("xkv", PolicyConfig(0.1, {{"category", 2.5}}), c).ok());
  EXPECT_FALSE(CreatePolicy("xkv", PolicyConfig(0.0, {}), c).ok());
  EXPECT_TRUE(CreatePolicy("xkv", PolicyConfig(0.1, {{"mode", "profile"}, {"category", 3.0},
                                                     {"r_target", 0.9}, {"kernel", 5.0}}),
                           c)
                  .ok());
}

// A category is a client's tag, any int32: large ones are no longer mangled into text.
TEST(XkvPolicy, LargeCategoryArrivesExactly) {
  absl::StatusOr<XkvOptions> o =
      ParseXkvOptions(PolicyConfig(0.1, {{"mode", "profile"}, {"category", 1048576.0}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->profile);
  EXPECT_EQ(o->category, 1048576);
  o = ParseXkvOptions(PolicyConfig(0.1, {{"category", 2147483647.0}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->category, 2147483647);
  o = ParseXkvOptions(PolicyConfig(0.1, {{"category", 2.5}}));
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("compression.params.category"), absl::string_view::npos)
      << o.status();
}

}  // namespace
}  // namespace winnow::cache::policies
