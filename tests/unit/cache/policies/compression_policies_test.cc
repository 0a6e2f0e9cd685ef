// The baselines on constructed attention patterns whose right keep set is known, their
// invariants (kept <= budget, sinks and windows kept), the shared helpers and the registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "cache/keep_plan.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {
namespace {

constexpr int32_t kLayers = 4;
constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kTokens = 40;

PolicyContext Context(int32_t tokens = kTokens) {
  PolicyContext c;
  c.dims = ModelDims{kLayers, kHeads, kKvHeads, 8, 4};
  c.layout.num_tokens = tokens;
  return c;
}

std::unique_ptr<CompressionPolicy> Make(const std::string& name, double budget,
                                        PolicyParams params = {},
                                        PolicyContext context = Context()) {
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> p =
      CreatePolicy(name, PolicyConfig(budget, std::move(params)), context);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

// Owns the buffers behind an ObservationAttention.
struct Observation {
  std::vector<int32_t> positions;
  std::vector<float> probs;
  std::vector<float> lse;
  std::vector<float> column_sums;
  int32_t rows = 0;
  int32_t n = kTokens;

  // Rows for positions [first, n): a small causal background, plus `peaks[h]` keys that get
  // most of each row's mass for query head h.
  void Window(int32_t first, const std::vector<std::vector<int32_t>>& peaks) {
    rows = n - first;
    for (int32_t r = 0; r < rows; ++r) positions.push_back(first + r);
    probs.assign(static_cast<size_t>(kHeads) * rows * n, 0.0f);
    lse.assign(static_cast<size_t>(kHeads) * rows, 0.0f);
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int32_t r = 0; r < rows; ++r) {
        float* row = probs.data() + (h * rows + r) * n;
        for (int32_t j = 0; j <= positions[r]; ++j) row[j] = 0.001f;
        for (int32_t j : peaks[h]) {
          if (j <= positions[r]) row[j] = 0.2f;
        }
      }
    }
  }
  ObservationAttention For(int32_t layer) const {
    ObservationAttention a;
    a.layer = layer;
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.num_rows = rows;
    a.num_slots = n;
    a.row_positions = positions;
    a.probs = probs;
    a.log_normalizer = lse;
    a.column_sums = column_sums;
    return a;
  }
};

KeepPlan RunPolicy(CompressionPolicy& policy, const Observation& obs) {
  for (int32_t l = 0; l < kLayers; ++l) EXPECT_TRUE(policy.ObserveLayer(obs.For(l)).ok());
  absl::StatusOr<KeepPlan> plan = policy.Plan();
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->Validate(Context().dims, [](int32_t) { return kTokens; }).ok());
  return *std::move(plan);
}

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> out;
  for (int32_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

std::vector<int32_t> Union(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  std::set<int32_t> s(a.begin(), a.end());
  s.insert(b.begin(), b.end());
  return {s.begin(), s.end()};
}

// ---------------------------------------------------------------------------------------------

TEST(ScoringHelpersTest, KeepCountFloorsAndClamps) {
  EXPECT_EQ(KeepCount(0.1, 40), 4);
  EXPECT_EQ(KeepCount(0.3, 10), 3);  // 0.3 * 10 is 2.9999999 in floating point
  EXPECT_EQ(KeepCount(0.01, 40), 1);
  EXPECT_EQ(KeepCount(1.0, 40), 40);
}

TEST(ScoringHelpersTest, PoolingIsAlignedAndPadsLikePyTorch) {
  const std::vector<float> x = {0, 0, 5, 0, 0, 0, 1};
  EXPECT_EQ(Pool1d(x, 3, Pooling::kMax), (std::vector<float>{0, 5, 5, 5, 0, 1, 1}));
  const std::vector<float> avg = Pool1d(x, 3, Pooling::kAvg);
  EXPECT_FLOAT_EQ(avg[0], 0.0f);
  EXPECT_FLOAT_EQ(avg[1], 5.0f / 3);
  EXPECT_FLOAT_EQ(avg[6], 1.0f / 3);  // the padding counts as zero
  EXPECT_EQ(Pool1d(x, 1, Pooling::kAvg), x);
}

TEST(ScoringHelpersTest, TopKBreaksTiesToTheLowerSlotAndForcesSinksAndWindow) {
  const std::vector<float> s = {1, 3, 3, 0, 3, 2, 0, 0};
  EXPECT_EQ(TopK(s, Range(0, 8), 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(TopKWithForced(s, 8, SinksAndWindow(8, 1, 2), 5),
            (std::vector<int32_t>{0, 1, 2, 6, 7}));
  // More forced than the budget: the most recent forced slots win.
  EXPECT_EQ(TopKWithForced(s, 8, SinksAndWindow(8, 2, 3), 3), (std::vector<int32_t>{5, 6, 7}));
}

TEST(ScoringHelpersTest, TopKWithNeighboursKeepsRunsAroundTheBestSlots) {
  // Slot 10 scores best, slot 3 second: each brings its neighbours, the one after first.
  std::vector<float> s(16, 0.0f);
  s[10] = 5;
  s[3] = 4;
  const std::vector<int32_t> sink = {0};
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 6, 2), (std::vector<int32_t>{0, 8, 9, 10, 11, 12}));
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 8, 2),
            (std::vector<int32_t>{0, 3, 4, 8, 9, 10, 11, 12}));
  // Runs clip at the ends and skip what is kept; radius 0 is TopKWithForced.
  EXPECT_EQ(TopKWithNeighbours(s, 12, sink, 4, 3), (std::vector<int32_t>{0, 9, 10, 11}));
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 3, 0), TopKWithForced(s, 16, sink, 3));
  EXPECT_EQ(TopKWithNeighbours(s, 16, {}, 16, 4).size(), 16u);
}

TEST(ScoringHelpersTest, NeighbourShareWidensOnlyThatPartOfTheBudget) {
  // Slots 10, 3, 6 score best. Share 0.5 of the 6 candidate slots: slot 10 and its two
  // neighbours after the sink (3 slots), then single picks 3 and 6 and the best of the rest.
  std::vector<float> s(16, 0.0f);
  s[10] = 5;
  s[3] = 4;
  s[6] = 3;
  s[14] = 2;
  const std::vector<int32_t> sink = {0};
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 7, 1, 0.5),
            (std::vector<int32_t>{0, 3, 6, 9, 10, 11, 14}));
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 7, 1, 1.0),
            (std::vector<int32_t>{0, 2, 3, 4, 9, 10, 11}));
  EXPECT_EQ(TopKWithNeighbours(s, 16, sink, 7, 1, 0.0), TopKWithForced(s, 16, sink, 7));
}

TEST(ScoringHelpersTest, GroupAggregation) {
  const std::vector<float> heads = {1, 4, 3, 2, 0, 0, 5, 5};  // 4 heads x 2 slots
  EXPECT_EQ(AggregateGroups(heads, 4, 2, 2, GroupAggregation::kSum),
            (std::vector<float>{4, 6, 5, 5}));
  EXPECT_EQ(AggregateGroups(heads, 4, 2, 2, GroupAggregation::kMean),
            (std::vector<float>{2, 3, 2.5, 2.5}));
  EXPECT_EQ(AggregateGroups(heads, 4, 2, 2, GroupAggregation::kMax),
            (std::vector<float>{3, 4, 5, 5}));
}

TEST(ScoringHelpersTest, PyramidBudgetsDecreaseAndKeepTheMean) {
  const std::vector<int32_t> b = PyramidBudgets(8, 1000, 100, 8, 20.0);
  int64_t total = 0;
  for (size_t l = 0; l < b.size(); ++l) {
    total += b[l];
    if (l > 0) {
      EXPECT_LE(b[l], b[l - 1]);
    }
    EXPECT_GE(b[l], 8);
  }
  EXPECT_GT(b.front(), 100);
  EXPECT_LT(b.back(), 100);
  EXPECT_LE(total, 800);
  EXPECT_GE(total, 800 - 8);
}

TEST(PromptLayoutTest, WindowIsTheTextAfterTheLastCompressibleSpan) {
  PromptLayout layout;
  layout.num_tokens = 100;
  EXPECT_EQ(ObservationWindow(layout, 32, 8, 256).begin, 68);  // no span: last 32
  layout.spans = {{SpanKind::kImage, 5, 50}, {SpanKind::kContext, 52, 90}};
  ASSERT_TRUE(layout.Validate().ok());
  EXPECT_EQ(ObservationWindow(layout, 32, 8, 256).begin, 90);
  EXPECT_EQ(ObservationWindow(layout, 32, 16, 256).begin, 84);  // at least min_window
  EXPECT_EQ(ObservationWindow(layout, 32, 4, 6).begin, 94);     // at most max_window
  EXPECT_TRUE(layout.IsCompressible(5));
  EXPECT_FALSE(layout.IsCompressible(50));
  EXPECT_EQ(layout.CompressiblePositions().size(), 45u + 38u);
  layout.spans.push_back({SpanKind::kText, 80, 95});
  EXPECT_FALSE(layout.Validate().ok());  // overlaps
}

TEST(PromptLayoutTest, LeadingKeepsTheContextsSpansAndRefusesOnesPastThePrompt) {
  const PromptLayout layout{100, {{SpanKind::kImage, 5, 50}, {SpanKind::kContext, 52, 90}}};
  const PromptLayout context = layout.Leading(60);
  EXPECT_EQ(context.num_tokens, 60);
  ASSERT_EQ(context.spans.size(), 2u);
  EXPECT_EQ(context.spans[1].end, 60);  // cut at the context's end
  EXPECT_TRUE(context.Validate().ok());
  EXPECT_EQ(layout.Leading(50).spans.size(), 1u);  // the context span starts after it
  EXPECT_EQ(layout.Leading(200).num_tokens, 100);
  const PromptLayout broken{40, {{SpanKind::kContext, 10, 60}}};  // past the prompt
  EXPECT_FALSE(broken.Leading(20).Validate().ok());
}

// ---------------------------------------------------------------------------------------------

TEST(RegistryTest, ValidatesNameBudgetAndParams) {
  auto status = [](const std::string& name, double budget,
                   PolicyParams params = {}) {
    return CreatePolicy(name, PolicyConfig(budget, std::move(params)), Context()).status();
  };
  absl::StatusOr<std::unique_ptr<CompressionPolicy>> none =
      CreatePolicy("none", PolicyConfig(0.0, {}), Context());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  EXPECT_TRUE(CreatePolicy("", PolicyConfig(), Context()).ok());

  absl::Status unknown = status("lz4", 0.5);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("compression.policy"), absl::string_view::npos);
  EXPECT_NE(unknown.message().find("snapkv"), absl::string_view::npos);  // lists known names
  for (double budget : {0.0, -0.1, 1.5, std::nan("")}) {
    absl::Status s = status("snapkv", budget);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << budget;
    EXPECT_NE(s.message().find("compression.budget"), absl::string_view::npos);
  }
  absl::Status misspelt = status("snapkv", 0.5, {{"windw", 8.0}});
  EXPECT_NE(misspelt.message().find("compression.params.windw"), absl::string_view::npos);
  absl::Status bad_value = status("snapkv", 0.5, {{"window", 8.5}});
  EXPECT_NE(bad_value.message().find("compression.params.window: 8.5 is not an integer"),
            absl::string_view::npos)
      << bad_value;
  absl::Status wrong_map = status("snapkv", 0.5, {{"window", "8"}});
  EXPECT_NE(wrong_map.message().find("compression.options.window"), absl::string_view::npos)
      << wrong_map;
  EXPECT_FALSE(status("h2o", 0.5, {{"gqa", "median"}}).ok());
  EXPECT_TRUE(status("h2o", 0.5, {{"gqa", "max"}, {"recent_fraction", 0.25}}).ok());
  const std::vector<std::string> known = KnownPolicies();
  for (const char* name : {"none", "streaming_llm", "h2o", "snapkv", "pyramidkv"}) {
    EXPECT_NE(std::find(known.begin(), known.end(), name), known.end()) << name;
  }
}

TEST(BaselinesTest, BudgetOneKeepsEverything) {
  Observation obs;
  obs.Window(0, std::vector<std::vector<int32_t>>(kHeads, {3}));
  obs.column_sums.assign(kHeads * kTokens, 1.0f);
  for (const char* name : {"streaming_llm", "h2o", "snapkv", "pyramidkv"}) {
    std::unique_ptr<CompressionPolicy> p = Make(name, 1.0);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(RunPolicy(*p, obs).empty()) << name;
  }
}

TEST(StreamingLlmTest, KeepsSinksAndTheMostRecentTokens) {
  std::unique_ptr<CompressionPolicy> p = Make("streaming_llm", 0.25);  // 10 of 40
  EXPECT_EQ(p->Observation().window_begin, kTokens);                  // observes nothing
  KeepPlan plan = RunPolicy(*p, Observation());
  ASSERT_EQ(plan.layers.size(), size_t{kLayers});
  const std::vector<int32_t> want = Union(Range(0, 4), Range(34, 40));
  for (const LayerKeep& layer : plan.layers) {
    for (const auto& head : layer.heads) EXPECT_EQ(head, want);
  }
}

TEST(StreamingLlmTest, DecodeEvictionStaysWithinTheRelativeBudget) {
  std::unique_ptr<CompressionPolicy> p =
      Make("streaming_llm", 0.25, {{"evict_every", 4.0}, {"sinks", 2.0}});
  SlotPositions slots(kLayers, kKvHeads);
  slots.AppendRange(0, kTokens);
  slots.Apply(RunPolicy(*p, Observation()));
  int32_t evictions = 0;
  for (int32_t pos = kTokens; pos < kTokens + 100; ++pos) {
    slots.AppendRange(pos, 1);
    DecodeStep step{pos, pos + 1, &slots, {}};
    absl::StatusOr<KeepPlan> plan = p->OnDecodeStep(step);
    ASSERT_TRUE(plan.ok());
    if (!plan->empty()) {
      ++evictions;
      ASSERT_TRUE(plan->Validate(Context().dims, [&](int32_t l) { return slots.num_slots(l); })
                      .ok());
      slots.Apply(*plan);
      EXPECT_EQ(slots.num_slots(0), KeepCount(0.25, pos + 1));
    }
    EXPECT_LT(slots.num_slots(0), KeepCount(0.25, pos + 1) + 4);
    EXPECT_EQ(slots.Positions(0, 0)[0], 0);  // sinks survive
    EXPECT_EQ(slots.Positions(0, 0)[1], 1);
    EXPECT_EQ(slots.Positions(3, 1).back(), pos);  // the newest token is always there
  }
  EXPECT_GT(evictions, 5);
  EXPECT_EQ(p->SteadyStateSlots(kTokens, 100), kLayers * (KeepCount(0.25, 140) + 4));
}

TEST(SnapKvTest, EachKvHeadKeepsItsGroupsPeaksPlusTheWindow) {
  std::unique_ptr<CompressionPolicy> p =
      Make("snapkv", 0.25, {{"window", 4.0}, {"kernel", 1.0}});  // 10 = 4 window + 6
  ASSERT_EQ(p->Observation().window_begin, 36);
  ASSERT_FALSE(p->Observation().accumulate_all_rows);
  const std::vector<int32_t> peaks0 = {3, 10, 11, 20, 25, 30};
  const std::vector<int32_t> peaks1 = {1, 5, 7, 9, 13, 33};
  Observation obs;
  // Query heads 0,1 read KV head 0; 2,3 read KV head 1. Head 1 agrees with head 0 on 4 peaks
  // and adds two more that head 0 lacks; the group sum still ranks head 0's six first.
  obs.Window(36, {peaks0, {3, 10, 11, 20}, peaks1, peaks1});
  KeepPlan plan = RunPolicy(*p, obs);
  for (const LayerKeep& layer : plan.layers) {
    EXPECT_EQ(layer.heads[0], Union(peaks0, Range(36, 40)));
    EXPECT_EQ(layer.heads[1], Union(peaks1, Range(36, 40)));
  }
}

TEST(SnapKvTest, PoolingKeepsTheNeighbourhoodOfAPeak) {
  std::unique_ptr<CompressionPolicy> p =
      Make("snapkv", 0.25, {{"window", 4.0}, {"kernel", 5.0}, {"pooling", "max"}});
  Observation obs;
  obs.Window(36, std::vector<std::vector<int32_t>>(kHeads, {20}));
  KeepPlan plan = RunPolicy(*p, obs);
  // Max pooling spreads the single peak over 18..22; the 6th slot goes to the lowest tie (0).
  EXPECT_EQ(plan.layers[0].heads[0], Union({0, 18, 19, 20, 21, 22}, Range(36, 40)));
}

TEST(PyramidKvTest, LowerLayersKeepMoreAndTheTotalStaysWithinBudget) {
  std::unique_ptr<CompressionPolicy> p =
      Make("pyramidkv", 0.25, {{"window", 4.0}, {"kernel", 1.0}});
  Observation obs;
  obs.Window(36, std::vector<std::vector<int32_t>>(kHeads, {2, 4, 6, 8, 10, 12, 14, 16, 18}));
  KeepPlan plan = RunPolicy(*p, obs);
  int32_t total = 0;
  for (int32_t l = 0; l < kLayers; ++l) {
    const int32_t kept = plan.layers[l].kept();
    total += kept;
    if (l > 0) {
      EXPECT_LT(kept, plan.layers[l - 1].kept());
    }
    const std::vector<int32_t>& head = plan.layers[l].heads[0];
    for (int32_t w = 36; w < 40; ++w) EXPECT_TRUE(std::binary_search(head.begin(), head.end(), w));
  }
  EXPECT_LE(total, kLayers * 10);
  EXPECT_GE(total, kLayers * 10 - kLayers);
}

TEST(H2oTest, KeepsHeavyHittersPerHeadAndTheRecentHalf) {
  std::unique_ptr<CompressionPolicy> p = Make("h2o", 0.25);  // 10 = 5 recent + 5 heavy
  ASSERT_TRUE(p->Observation().accumulate_all_rows);
  Observation obs;
  obs.column_sums.assign(kHeads * kTokens, 1.0f);
  const std::vector<int32_t> heavy0 = {2, 8, 15, 22, 29};
  const std::vector<int32_t> heavy1 = {0, 4, 12, 18, 31};
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t j : (h < 2 ? heavy0 : heavy1)) obs.column_sums[h * kTokens + j] = 5.0f;
  }
  obs.column_sums[0 * kTokens + 36] = 50.0f;  // inside the recent window anyway
  KeepPlan plan = RunPolicy(*p, obs);
  for (const LayerKeep& layer : plan.layers) {
    EXPECT_EQ(layer.heads[0], Union(heavy0, Range(35, 40)));
    EXPECT_EQ(layer.heads[1], Union(heavy1, Range(35, 40)));
  }
}

TEST(H2oTest, DecodeAttentionAccumulatesAndDecidesEvictions) {
  std::unique_ptr<CompressionPolicy> p = Make("h2o", 0.25, {{"evict_every", 2.0}});
  ASSERT_TRUE(p->WantsDecodeAttention());
  Observation obs;
  obs.column_sums.assign(kHeads * kTokens, 1.0f);
  SlotPositions slots(kLayers, kKvHeads);
  slots.AppendRange(0, kTokens);
  slots.Apply(RunPolicy(*p, obs));
  // Every decode token puts all its attention on the token at position 7 (if kept) or on the
  // first slot: position 7 was not kept at prefill (uniform scores: lowest slots win ties).
  std::vector<std::vector<float>> attention(kLayers);
  for (int32_t pos = kTokens; pos < kTokens + 40; ++pos) {
    slots.AppendRange(pos, 1);
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t n = slots.num_slots(l);
      attention[l].assign(kHeads * n, 0.0f);
      for (int32_t h = 0; h < kHeads; ++h) attention[l][h * n + 1] = 1.0f;  // slot 1
    }
    DecodeStep step{pos, pos + 1, &slots, attention};
    absl::StatusOr<KeepPlan> plan = p->OnDecodeStep(step);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (plan->empty()) continue;
    slots.Apply(*plan);
    EXPECT_LE(slots.num_slots(0), KeepCount(0.25, pos + 1));
  }
  // The token every decode step attended to survives every eviction; position 0 too (slot 0
  // won the prefill tie); both old enough to be outside the recent window.
  const std::span<const int32_t> kept = slots.Positions(2, 1);
  EXPECT_EQ(kept[0], 0);
  EXPECT_EQ(kept[1], 1);
  EXPECT_EQ(kept.back(), kTokens + 39);
}

// Layers 1 and 3 slide (the next token reads 8 past slots): h2o keeps there only what the
// window shows, at prefill and at every decode eviction, and its accumulated scores follow the
// confined plan (a plan out of step with them fails the next step), so the session's own pass
// (KeepSlidingWindows) finds nothing to change.
TEST(H2oTest, SlidingLayersKeepTheirWindowAndTheScoresFollow) {
  PolicyContext context = Context();
  context.dims.windows = {0, 9, 0, 9};
  std::unique_ptr<CompressionPolicy> p = Make("h2o", 0.25, {{"evict_every", 2.0}}, context);
  Observation obs;
  obs.column_sums.assign(kHeads * kTokens, 1.0f);
  for (int32_t h = 0; h < kHeads; ++h) obs.column_sums[h * kTokens + 3] = 9.0f;  // far heavy
  SlotPositions slots(kLayers, kKvHeads);
  slots.AppendRange(0, kTokens);
  KeepPlan prefill = RunPolicy(*p, obs);
  EXPECT_EQ(prefill.layers[1].heads[0], Range(32, 40));  // 10 kept >= 8 read: the last 8
  EXPECT_TRUE(std::binary_search(prefill.layers[0].heads[0].begin(),
                                 prefill.layers[0].heads[0].end(), 3));
  slots.Apply(prefill);
  std::vector<std::vector<float>> attention(kLayers);
  int32_t evictions = 0;
  for (int32_t pos = kTokens; pos < kTokens + 40; ++pos) {
    slots.AppendRange(pos, 1);
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t n = slots.num_slots(l);
      attention[l].assign(kHeads * n, 0.0f);
      for (int32_t h = 0; h < kHeads; ++h) attention[l][h * n] = 1.0f;  // the oldest slot
    }
    DecodeStep step{pos, pos + 1, &slots, attention};
    absl::StatusOr<KeepPlan> plan = p->OnDecodeStep(step);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (plan->empty()) continue;
    ++evictions;
    const KeepPlan before = *plan;
    KeepSlidingWindows(*plan, context.dims, [&](int32_t l) { return slots.num_slots(l); });
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(plan->layers[l].heads, before.layers[l].heads);
    }
    slots.Apply(*plan);
    for (int32_t l : {1, 3}) {  // what the next token reads is the full cache's view
      const std::span<const int32_t> kept = slots.Positions(l, 0);
      ASSERT_GE(kept.size(), 8u);
      EXPECT_EQ(std::vector<int32_t>(kept.end() - 8, kept.end()), Range(pos - 7, pos + 1));
    }
  }
  EXPECT_GT(evictions, 0);
}

TEST(BaselinesTest, InvariantsOnRandomAttention) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (const char* name : {"streaming_llm", "h2o", "snapkv", "pyramidkv"}) {
    for (double budget : {0.05, 0.1, 0.2, 0.5}) {
      std::unique_ptr<CompressionPolicy> p = Make(name, budget, {});
      const ObservationRequest req = p->Observation();
      Observation obs;
      std::vector<std::vector<int32_t>> peaks(kHeads);
      for (auto& v : peaks) {
        for (int i = 0; i < 5; ++i) v.push_back(static_cast<int32_t>(u(rng) * 39));
      }
      obs.Window(req.window_begin, peaks);
      obs.column_sums.resize(kHeads * kTokens);
      for (float& x : obs.column_sums) x = u(rng);
      KeepPlan plan = RunPolicy(*p, obs);
      const int32_t k = KeepCount(budget, kTokens);
      int64_t total = 0;
      for (const LayerKeep& layer : plan.layers) {
        total += layer.kept();
        if (std::string(name) != "pyramidkv") {
          EXPECT_LE(layer.kept(), k) << name << budget;
        }
        for (const auto& head : layer.heads) {
          EXPECT_EQ(head.back(), kTokens - 1) << name;  // the last prompt token is never lost
        }
      }
      EXPECT_LE(total, int64_t{kLayers} * k) << name << " " << budget;
      if (std::string(name) == "streaming_llm" && k >= 5) {
        for (const LayerKeep& layer : plan.layers) {
          EXPECT_EQ(layer.heads[0][3], 3);
        }
      }
    }
  }
}

}  // namespace
}  // namespace winnow::cache::policies
