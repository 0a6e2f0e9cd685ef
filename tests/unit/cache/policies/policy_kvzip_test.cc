// kvzip (cache/policies/kvzip.h): keys ranked by the largest single-row attention, folded over
// the GQA group by its maximum, one ranking over every layer for the layers' counts.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"
#include "policy_test_util.h"

namespace winnow::cache::policies {
namespace {

using policy_testing::Context;
using policy_testing::Contains;

constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kTokens = 100;

// One layer's observation carrying only the window's maxima, as the machinery hands it.
struct MaxLayer {
  std::vector<int32_t> positions;
  std::vector<float> window_max;  // num_heads x n

  ObservationAttention View(int32_t layer, int32_t n) const {
    ObservationAttention a;
    a.layer = layer;
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.num_rows = static_cast<int32_t>(positions.size());
    a.num_slots = n;
    a.row_positions = positions;
    a.window_max = window_max;
    return a;
  }
};

// Every key scores `base(j)` in every head; `peaks` (head, slot, value) override.
MaxLayer Layer(const ObservationRequest& observe, int32_t n, float base,
               std::vector<std::tuple<int32_t, int32_t, float>> peaks = {}) {
  MaxLayer m;
  for (int32_t p = observe.window_begin; p < n; ++p) m.positions.push_back(p);
  m.window_max.assign(static_cast<size_t>(kHeads) * n, 0.0f);
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t j = 0; j < n; ++j) m.window_max[h * n + j] = base * (1.0f + 0.001f * (j % 7));
  }
  for (auto [h, j, v] : peaks) m.window_max[h * n + j] = v;
  return m;
}

std::unique_ptr<CompressionPolicy> Kvzip(int32_t layers, double budget, PolicyParams params = {}) {
  const PolicyContext c = Context(layers, kHeads, kKvHeads, kTokens, {});
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
      CreatePolicy("kvzip", PolicyConfig(budget, std::move(params)), c);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

TEST(KvzipPolicyTest, AsksForTheWindowsMaximumWithoutRowProbabilities) {
  const ObservationRequest observe = Kvzip(2, 0.2)->Observation();
  EXPECT_FALSE(observe.row_probabilities);
  EXPECT_FALSE(observe.accumulate_all_rows);
  EXPECT_EQ(observe.window_reduce, kernels::ColumnReduce::kMax);
  EXPECT_EQ(observe.window_begin, kTokens - 8);  // the default window
}

TEST(KvzipPolicyTest, OneQueryHeadsPeakKeepsItsKeyInThatKvHead) {
  // Budget 0.2: 20 slots per head, 8 of them the window. Query head 1 (KV head 0) gives keys
  // 30 and 31 a peak; head 2 (KV head 1) gives key 60 one. Everything else is flat.
  std::unique_ptr<CompressionPolicy> policy = Kvzip(1, 0.2, {{"allocation", "uniform"}});
  const MaxLayer layer =
      Layer(policy->Observation(), kTokens, 0.01f, {{1, 30, 0.9f}, {1, 31, 0.8f}, {2, 60, 0.7f}});
  ASSERT_TRUE(policy->ObserveLayer(layer.View(0, kTokens)).ok());
  const KeepPlan plan = *policy->Plan();
  ASSERT_EQ(plan.layers.size(), 1u);
  for (int32_t g = 0; g < kKvHeads; ++g) {
    const std::vector<int32_t>& kept = plan.layers[0].heads[g];
    EXPECT_EQ(kept.size(), 20u);
    for (int32_t p = kTokens - 8; p < kTokens; ++p) EXPECT_TRUE(Contains(kept, p)) << p;
  }
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 30));
  EXPECT_TRUE(Contains(plan.layers[0].heads[0], 31));
  EXPECT_TRUE(Contains(plan.layers[0].heads[1], 60));
}

TEST(KvzipPolicyTest, OneRankingGivesTheLayerTheRowsNeedMoreSlots) {
  // Three layers at budget 0.2 (20 slots each on average, 60 in all): layer 1's keys all score
  // ten times layer 0's and layer 2's, so it takes the slots the others give up, down to their
  // window, whether a layer counts its heads' average or its neediest head.
  for (const char* allocation : {"global", "neediest"}) {
    SCOPED_TRACE(allocation);
    std::unique_ptr<CompressionPolicy> policy = Kvzip(3, 0.2, {{"allocation", allocation}});
    const ObservationRequest observe = policy->Observation();
    const std::vector<float> base = {0.01f, 0.1f, 0.01f};
    for (int32_t l = 0; l < 3; ++l) {
      const MaxLayer layer = Layer(observe, kTokens, base[l]);
      ASSERT_TRUE(policy->ObserveLayer(layer.View(l, kTokens)).ok());
    }
    const KeepPlan plan = *policy->Plan();
    ASSERT_EQ(plan.layers.size(), 3u);
    int64_t total = 0;
    for (int32_t l = 0; l < 3; ++l) total += plan.layers[l].kept();
    EXPECT_LE(total, 3 * 20);
    EXPECT_EQ(plan.layers[0].heads[0].size(), 8u);
    EXPECT_EQ(plan.layers[2].heads[0].size(), 8u);
    EXPECT_EQ(plan.layers[1].heads[0].size(), 44u);
    EXPECT_LE(total, policy->SteadyStateSlots(kTokens, 0));
  }
}

// Layer 0: KV head 0 (query head 0) needs 30 keys and KV head 1 none; layer 1: both KV heads
// need the same 20. At budget 0.34 (34 slots a layer, 8 of them the window) there are slots for
// all 50 needs only if a layer is counted by its neediest head: averaged over its heads, layer 0
// gets about 31 slots and its head 0 loses some of its 30 keys to layer 1's averages.
std::unique_ptr<CompressionPolicy> ObserveOneNeedyHead(PolicyParams params) {
  std::unique_ptr<CompressionPolicy> policy = Kvzip(2, 0.34, std::move(params));
  const ObservationRequest observe = policy->Observation();
  std::vector<std::tuple<int32_t, int32_t, float>> needy, shared;
  for (int32_t j = 0; j < 30; ++j) needy.emplace_back(0, j, 0.5f);
  for (int32_t j = 40; j < 60; ++j) {
    shared.emplace_back(0, j, 0.1f);
    shared.emplace_back(2, j, 0.1f);
  }
  EXPECT_TRUE(policy->ObserveLayer(Layer(observe, kTokens, 0.01f, needy).View(0, kTokens)).ok());
  EXPECT_TRUE(policy->ObserveLayer(Layer(observe, kTokens, 0.01f, shared).View(1, kTokens)).ok());
  return policy;
}

int32_t KeptOf(const std::vector<int32_t>& slots, int32_t begin, int32_t end) {
  int32_t kept = 0;
  for (int32_t j = begin; j < end; ++j) kept += Contains(slots, j);
  return kept;
}

TEST(KvzipPolicyTest, NeediestAllocationCountsALayerByItsNeediestHead) {
  const KeepPlan neediest = *ObserveOneNeedyHead({})->Plan();  // the default
  EXPECT_EQ(KeptOf(neediest.layers[0].heads[0], 0, 30), 30);
  EXPECT_EQ(KeptOf(neediest.layers[1].heads[0], 40, 60), 20);
  EXPECT_EQ(KeptOf(neediest.layers[1].heads[1], 40, 60), 20);
  EXPECT_LE(neediest.layers[0].kept() + neediest.layers[1].kept(), 2 * 34);

  const KeepPlan averaged = *ObserveOneNeedyHead({{"allocation", "global"}})->Plan();
  EXPECT_LT(KeptOf(averaged.layers[0].heads[0], 0, 30), 30);
}

TEST(KvzipPolicyTest, UniformAllocationKeepsTheBudgetInEveryLayer) {
  std::unique_ptr<CompressionPolicy> policy = Kvzip(3, 0.2, {{"allocation", "uniform"}});
  const ObservationRequest observe = policy->Observation();
  for (int32_t l = 0; l < 3; ++l) {
    const MaxLayer layer = Layer(observe, kTokens, l == 1 ? 0.1f : 0.01f);
    ASSERT_TRUE(policy->ObserveLayer(layer.View(l, kTokens)).ok());
  }
  const KeepPlan plan = *policy->Plan();
  for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(plan.layers[l].heads[0].size(), 20u) << l;
}

TEST(KvzipPolicyTest, RefusesBadParametersAndAPlanBeforeEveryLayer) {
  const PolicyContext c = Context(2, kHeads, kKvHeads, kTokens, {});
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> bad =
      CreatePolicy("kvzip", PolicyConfig(0.2, {{"allocation", "pyramid"}}), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("compression.options.allocation"), std::string::npos)
      << bad.status();
  bad = CreatePolicy("kvzip", PolicyConfig(0.2, {{"kernel", 5.0}}), c);
  EXPECT_FALSE(bad.ok());

  std::unique_ptr<CompressionPolicy> policy = Kvzip(2, 0.2);
  const MaxLayer layer = Layer(policy->Observation(), kTokens, 0.01f);
  ASSERT_TRUE(policy->ObserveLayer(layer.View(0, kTokens)).ok());
  EXPECT_EQ(policy->Plan().status().code(), absl::StatusCode::kFailedPrecondition);

  // An observation without the maxima (a machinery bug) is an internal error, not a plan.
  std::unique_ptr<CompressionPolicy> other = Kvzip(1, 0.2);
  ObservationAttention empty = layer.View(0, kTokens);
  empty.window_max = {};
  EXPECT_EQ(other->ObserveLayer(empty).code(), absl::StatusCode::kInternal);
}

TEST(KvzipPolicyTest, BudgetOneKeepsEverything) {
  std::unique_ptr<CompressionPolicy> policy = Kvzip(2, 1.0);
  for (int32_t l = 0; l < 2; ++l) {
    const MaxLayer layer = Layer(policy->Observation(), kTokens, 0.01f);
    ASSERT_TRUE(policy->ObserveLayer(layer.View(l, kTokens)).ok());
  }
  EXPECT_TRUE(policy->Plan()->empty());
}

}  // namespace
}  // namespace winnow::cache::policies
