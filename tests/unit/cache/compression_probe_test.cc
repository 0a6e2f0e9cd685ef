// A context scored with a probe (CompressionSession::SetProbe): the policy must plan from the
// probe rows' attention to the context, folded (summed, or the maximum for kvzip), as if those
// were its window's; each segment attends to the context and itself only, and the probe's K/V
// must be gone afterwards. The reference computes the folded scores by hand with the host
// scoring kernel, one cache of context + segment per segment, and hands them to a fresh policy
// of the same name.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/compression.h"
#include "cache/host_scoring.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache {
namespace {

constexpr int32_t kLayers = 3;
constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 8;
constexpr int32_t kBlock = 4;
constexpr int32_t kContext = 40;
// Two probe segments, the second run in two forwards; their rows and K/V come from the
// fixture's rows after the context, the second segment's after the first's. Each scores its own
// part of the context: the first [0, kSplit), the second the rest.
constexpr int32_t kSegments[2] = {6, 8};
constexpr int32_t kSplit = 25;
constexpr int32_t kTotal = kContext + 6 + 8;
constexpr int64_t kRowFloats = int64_t{kHeads} * kDim;

class CompressionProbeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    pool_ = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 128);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    rows_.resize(kLayers);
    for (std::vector<float>& layer : rows_) {
      layer.resize(kTotal * kRowFloats);
      for (float& x : layer) x = normal(rng);
    }
    kv_rows_.resize(int64_t{kLayers} * kKvHeads * kTotal * 2 * kDim);
    for (float& x : kv_rows_) x = normal(rng);
  }

  policies::PolicyContext Context() const {
    policies::PolicyContext context;
    context.dims = {kLayers, kHeads, kKvHeads, kDim, kBlock};
    context.layout.num_tokens = kContext;
    return context;
  }

  // Positions [from, to) of every layer written as a forward would, from the fixture's rows
  // [from + source, to + source) (the same values always).
  void Write(SequenceKv& kv, int32_t from, int32_t to, int32_t source = 0) {
    ASSERT_TRUE(kv.Reserve(*pool_, to - from));
    for (int32_t l = 0; l < kLayers; ++l) {
      kv.AppendSlots(l, to - from);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t s = from; s < to; ++s) {
          const int32_t block = kv.block_table(l)[s / kBlock];
          const int32_t row = s + source;
          for (bool values : {false, true}) {
            const int64_t at = (((int64_t{l} * kKvHeads + h) * kTotal + row) * 2 + values) * kDim;
            pool_->WriteRow(block, h, s % kBlock, values, kv_rows_.data() + at);
          }
        }
      }
    }
  }

  // The reference scores: rows of layer l's query from `q`, row r seeing the first visible[r]
  // slots of `cache`, their attention folded over the rows by `reduce` (num_heads x slots).
  static std::vector<float> FoldedScores(HostScoring& scoring, const SequenceKv& cache,
                                         int32_t l, const float* q,
                                         const std::vector<int32_t>& visible,
                                         kernels::ColumnReduce reduce) {
    kernels::ScoreInput in;
    in.block_table = cache.block_table(l).data();
    in.num_slots = cache.num_slots(l);
    in.q = q;
    in.num_rows = static_cast<int32_t>(visible.size());
    in.visible = visible.data();
    in.num_heads = kHeads;
    in.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    in.reduce = reduce;
    std::vector<float> all(int64_t{kHeads} * in.num_slots, 0.0f);
    EXPECT_TRUE(scoring.AccumulateAttentionColumns(in, all.data(), DeviceRows{}).ok());
    return all;
  }

  // What the session hands the policy for layer l: the window rows at `rows` and their folded
  // `scores` over `slots` keys, as the window's sums or maxima.
  static policies::ObservationAttention Observed(int32_t l, std::span<const int32_t> rows,
                                                 int32_t slots, std::span<const float> scores,
                                                 kernels::ColumnReduce reduce) {
    policies::ObservationAttention attention;
    attention.layer = l;
    attention.num_heads = kHeads;
    attention.num_kv_heads = kKvHeads;
    attention.num_rows = static_cast<int32_t>(rows.size());
    attention.num_slots = slots;
    attention.row_positions = rows;
    (reduce == kernels::ColumnReduce::kMax ? attention.window_max : attention.window_sums) =
        scores;
    return attention;
  }

  std::unique_ptr<BlockPool> pool_;
  kernels::ThreadPool threads_{1};
  std::vector<std::vector<float>> rows_;  // [layer] every position's query row
  std::vector<float> kv_rows_;
};

TEST_P(CompressionProbeTest, ThePolicyPlansFromTheProbeRowsFoldedOverTheContext) {
  HostScoring scoring(*pool_, threads_);
  const policies::PolicyConfig config(0.25, {});

  // The session: the context prefilled (nothing captured), then each probe segment run after
  // it (the second in two forwards; its rows consumed layer by layer) and dropped, then the plan.
  std::unique_ptr<CompressionSession> session =
      *CompressionSession::Create(GetParam(), config, Context());
  ASSERT_TRUE(session->SetProbe({{std::vector<int32_t>(kSegments[0], 7), 0, kSplit},
                                 {std::vector<int32_t>(kSegments[1], 8), kSplit, kContext}})
                  .ok());
  EXPECT_EQ(session->ProbeFootprint(), kSegments[1]);
  SequenceKv kv(kLayers, kBlock);
  Write(kv, 0, kContext);
  EXPECT_EQ(session->PrefillCapture(0, kContext), nullptr);
  ASSERT_TRUE(session->AfterPrefillChunk().ok());
  EXPECT_TRUE(session->probe_pending());
  struct Forward {
    int32_t from, to, source;  // positions, and where their fixture rows start beyond them
  };
  const std::vector<std::vector<Forward>> segments = {
      {{kContext, kContext + 6, 0}},
      {{kContext, kContext + 3, 6}, {kContext + 3, kContext + 8, 6}}};
  for (const std::vector<Forward>& forwards : segments) {
    for (const Forward& f : forwards) {
      Write(kv, f.from, f.to, f.source);
      QueryCapture* capture = session->ProbeCapture(f.from, f.to - f.from);
      capture->per_layer.resize(kLayers);
      for (int32_t p = f.from; p < f.to; ++p) capture->positions.push_back(p);
      for (int32_t l = 0; l < kLayers; ++l) {
        capture->per_layer[l].assign(rows_[l].begin() + (f.from + f.source) * kRowFloats,
                                     rows_[l].begin() + (f.to + f.source) * kRowFloats);
        capture->layer_done(l, kv, scoring);
      }
      ASSERT_TRUE(session->AfterProbeChunk().ok());
    }
    ASSERT_TRUE(session->EndProbeSegment(kv, *pool_).ok());
    for (int32_t l = 0; l < kLayers; ++l) EXPECT_EQ(kv.num_slots(l), kContext);
  }
  EXPECT_FALSE(session->probe_pending());
  ASSERT_TRUE(session->Compress(kv, *pool_, scoring).ok());

  // The reference: per segment, a cache of the context and that segment alone, the segment's
  // rows' attention over it folded over rows as the policy asks (summed, or kvzip's maximum);
  // its scored part of the context's columns are the window's scores there.
  std::unique_ptr<policies::CompressionPolicy> policy =
      *policies::CreatePolicy(GetParam(), config, Context());
  policy->UseScoring(&scoring);
  const policies::ObservationRequest observe = policy->Observation();
  std::vector<std::vector<float>> folded(kLayers, std::vector<float>(kHeads * kContext, 0.0f));
  int32_t source = 0;
  for (int32_t segment = 0; segment < 2; ++segment) {
    const int32_t size = kSegments[segment];
    const int32_t begin = segment == 0 ? 0 : kSplit, end = segment == 0 ? kSplit : kContext;
    SequenceKv whole(kLayers, kBlock);
    Write(whole, 0, kContext);
    Write(whole, kContext, kContext + size, source);
    std::vector<int32_t> visible;
    for (int32_t p = kContext; p < kContext + size; ++p) visible.push_back(p + 1);
    for (int32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> all =
          FoldedScores(scoring, whole, l, rows_[l].data() + (kContext + source) * kRowFloats,
                       visible, observe.window_reduce);
      const int32_t slots = kContext + size;
      for (int32_t h = 0; h < kHeads; ++h) {
        for (int32_t j = begin; j < end; ++j) folded[l][h * kContext + j] = all[h * slots + j];
      }
    }
    whole.Release(*pool_);
    source += size;
  }
  std::vector<int32_t> window;
  for (int32_t p = observe.window_begin; p < kContext; ++p) window.push_back(p);
  SequenceKv context(kLayers, kBlock);
  Write(context, 0, kContext);
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<float> norms;
    policies::ObservationAttention attention =
        Observed(l, window, kContext, folded[l], observe.window_reduce);
    if (observe.value_norms) {
      norms.resize(int64_t{kKvHeads} * kContext);
      ASSERT_TRUE(scoring.ValueNorms(context.block_table(l), kContext, norms.data()).ok());
      attention.value_norms = norms;
    }
    ASSERT_TRUE(policy->ObserveLayer(attention).ok());
  }
  const policies::KeepPlan plan = *policy->Plan();
  policies::SlotPositions want(kLayers, kKvHeads);
  want.AppendRange(0, kContext);
  want.Apply(plan);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const auto got = session->slot_positions().Positions(l, h);
      const auto expected = want.Positions(l, h);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()),
                std::vector<int32_t>(expected.begin(), expected.end()))
          << "layer " << l << " head " << h;
    }
  }
  kv.Release(*pool_);
  context.Release(*pool_);
  EXPECT_EQ(pool_->num_used(), 0);
}

// A stage: a context's later tokens compressed after its earlier ones, already compressed (a
// different count per layer, different positions per KV head). The earlier slots stay as they
// are; the stage's tokens and its probe attend to them, and the policy, made for the stage's
// tokens alone, plans from those tokens' columns of the scores over every slot. The reference
// scores the same cache by hand, cuts the columns out and asks a fresh policy.
TEST_P(CompressionProbeTest, AStageIsPlannedFromItsOwnColumnsAfterTheEarlierSlots) {
  constexpr int32_t kEarlier = 24;  // positions [0, kEarlier), compressed before
  constexpr int32_t kStage = kContext - kEarlier;
  constexpr int32_t kProbe = 6;
  HostScoring scoring(*pool_, threads_);
  // (12 of the stage's 16 tokens: more than a policy's window keeps)
  const policies::PolicyConfig config(0.75, {});
  policies::PolicyContext stage_context = Context();
  stage_context.layout.num_tokens = kStage;

  // The earlier stage's kept slots: layer l keeps 9 + l, each KV head its own (more than a
  // window, so that a row seeing too few slots would score the stage's keys differently).
  policies::SlotPositions history(kLayers, kKvHeads);
  history.AppendRange(0, kEarlier);
  policies::KeepPlan earlier;
  earlier.layers.resize(kLayers);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t g = 0; g < kKvHeads; ++g) {
      std::vector<int32_t>& kept = earlier.layers[l].heads.emplace_back();
      for (int32_t j = g; j < kEarlier && static_cast<int32_t>(kept.size()) < 9 + l; j += 2) {
        kept.push_back(j);
      }
    }
  }
  history.Apply(earlier);
  // A cache of the earlier slots (rows of the positions they hold), the stage's tokens and,
  // with `probe`, a probe segment after them.
  auto write_cache = [&](SequenceKv& kv, int32_t extra) {
    ASSERT_TRUE(kv.Reserve(*pool_, kEarlier + kStage + extra));  // (more than a layer needs)
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t slots = history.num_slots(l) + kStage + extra;
      kv.AppendSlots(l, slots);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t s = 0; s < slots; ++s) {
          const int32_t base = history.num_slots(l);
          const int32_t row = s < base ? history.Positions(l, h)[s] : kEarlier + (s - base);
          const int32_t block = kv.block_table(l)[s / kBlock];
          for (bool values : {false, true}) {
            const int64_t at = (((int64_t{l} * kKvHeads + h) * kTotal + row) * 2 + values) * kDim;
            pool_->WriteRow(block, h, s % kBlock, values, kv_rows_.data() + at);
          }
        }
      }
    }
  };
  for (const bool probe : {false, true}) {
    SCOPED_TRACE(probe ? "probe" : "own rows");
    std::unique_ptr<CompressionSession> session =
        *CompressionSession::Create(GetParam(), config, stage_context, kEarlier);
    if (probe) {
      ASSERT_TRUE(session->SetProbe({{std::vector<int32_t>(kProbe, 7), 0, kStage}}).ok());
    }
    SequenceKv kv(kLayers, kBlock);
    write_cache(kv, 0);
    // (the history as the cache holds it: what the session is started after)
    for (int32_t l = 0; l < kLayers; ++l) kv.Truncate(*pool_, l, history.num_slots(l));
    ASSERT_TRUE(session->StartAfter(history, kv).ok());
    EXPECT_EQ(session->num_tokens(), kContext);
    EXPECT_EQ(session->first_position(), kEarlier);
    kv.Release(*pool_);
    write_cache(kv, 0);
    // The stage's tokens prefilled in one chunk; their window rows (or the probe's) observed.
    QueryCapture* capture = session->PrefillCapture(kEarlier, kStage);
    std::vector<int32_t> rows;  // the positions whose query rows the policy's scores come from
    if (probe) {
      EXPECT_EQ(capture, nullptr);
      ASSERT_TRUE(session->AfterPrefillChunk().ok());
      kv.Release(*pool_);
      write_cache(kv, kProbe);  // the probe's K/V after the stage's
      capture = session->ProbeCapture(kContext, kProbe);
      for (int32_t p = kContext; p < kContext + kProbe; ++p) rows.push_back(p);
    } else {
      ASSERT_NE(capture, nullptr);
      for (int32_t p = capture->first_position; p < kContext; ++p) rows.push_back(p);
    }
    capture->per_layer.resize(kLayers);
    capture->positions = rows;
    for (int32_t l = 0; l < kLayers; ++l) {
      capture->per_layer[l].assign(rows_[l].begin() + rows.front() * kRowFloats,
                                   rows_[l].begin() + (rows.back() + 1) * kRowFloats);
      if (capture->layer_done) capture->layer_done(l, kv, scoring);
    }
    if (probe) {
      ASSERT_TRUE(session->AfterProbeChunk().ok());
      ASSERT_TRUE(session->EndProbeSegment(kv, *pool_).ok());
    } else {
      ASSERT_TRUE(session->AfterPrefillChunk().ok());
    }
    ASSERT_TRUE(session->Compress(kv, *pool_, scoring).ok());

    // The reference: the same rows' scores over every slot, the stage's columns, a fresh policy.
    std::unique_ptr<policies::CompressionPolicy> policy =
        *policies::CreatePolicy(GetParam(), config, stage_context);
    policy->UseScoring(&scoring);
    const policies::ObservationRequest observe = policy->Observation();
    SequenceKv whole(kLayers, kBlock);
    write_cache(whole, probe ? kProbe : 0);
    std::vector<int32_t> relative;
    for (int32_t p : rows) relative.push_back(p - kEarlier);
    if (probe) {
      relative.clear();
      for (int32_t p = observe.window_begin; p < kStage; ++p) relative.push_back(p);
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t base = history.num_slots(l);
      std::vector<int32_t> visible;
      for (int32_t p : rows) visible.push_back(base + (p - kEarlier) + 1);
      const std::vector<float> all =
          FoldedScores(scoring, whole, l, rows_[l].data() + rows.front() * kRowFloats, visible,
                       observe.window_reduce);
      const int32_t slots = whole.num_slots(l);
      std::vector<float> columns(kHeads * kStage);
      for (int32_t h = 0; h < kHeads; ++h) {
        std::copy_n(all.begin() + h * slots + base, kStage, columns.begin() + h * kStage);
      }
      std::vector<float> norms;
      policies::ObservationAttention attention =
          Observed(l, relative, kStage, columns, observe.window_reduce);
      if (observe.value_norms) {
        std::vector<float> every(int64_t{kKvHeads} * (base + kStage));
        ASSERT_TRUE(scoring.ValueNorms(whole.block_table(l), base + kStage, every.data()).ok());
        for (int32_t g = 0; g < kKvHeads; ++g) {
          norms.insert(norms.end(), every.begin() + g * (base + kStage) + base,
                       every.begin() + (g + 1) * (base + kStage));
        }
        attention.value_norms = norms;
      }
      ASSERT_TRUE(policy->ObserveLayer(attention).ok());
    }
    const policies::KeepPlan plan = *policy->Plan();
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t g = 0; g < kKvHeads; ++g) {
        std::vector<int32_t> want(history.Positions(l, g).begin(), history.Positions(l, g).end());
        if (plan.layers.empty() || plan.layers[l].untouched()) {
          for (int32_t p = kEarlier; p < kContext; ++p) want.push_back(p);
        } else {
          for (int32_t j : plan.layers[l].heads[g]) want.push_back(kEarlier + j);
        }
        const auto got = session->slot_positions().Positions(l, g);
        EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want)
            << "layer " << l << " head " << g;
        EXPECT_EQ(kv.num_slots(l), static_cast<int32_t>(want.size()));
      }
    }
    kv.Release(*pool_);
    whole.Release(*pool_);
  }
  EXPECT_EQ(pool_->num_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, CompressionProbeTest,
                         ::testing::Values("kvzip", "snapkv", "pyramidkv", "xkv", "winnowkv"));

TEST(CompressionProbeSupportTest, PoliciesThatReadRowsOtherwiseRefuseAProbe) {
  policies::PolicyContext context;
  context.dims = {kLayers, kHeads, kKvHeads, kDim, kBlock};
  context.layout.num_tokens = kContext;
  const policies::PolicyConfig config(0.25, {});
  for (const std::string name :
       {"vl_cache", "h2o", "streaming_llm", "winnowkv_docs", "elastic_cache"}) {
    std::unique_ptr<CompressionSession> session =
        *CompressionSession::Create(name, config, context);
    const absl::Status refused = session->SetProbe({{{1, 2, 3}, 0, kContext}});
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(refused.message().find("compression.probe"), std::string::npos) << refused;
    // Nor can they compress a context in stages.
    const absl::Status staged = session->CheckStaged();
    EXPECT_EQ(staged.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(staged.message().find("compression.scope"), std::string::npos) << staged;
  }
}

}  // namespace
}  // namespace winnow::cache
