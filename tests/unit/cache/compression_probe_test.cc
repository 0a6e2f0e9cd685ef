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
// fixture's rows after the context, the second segment's after the first's.
constexpr int32_t kSegments[2] = {6, 8};
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
  ASSERT_TRUE(session->SetProbe({std::vector<int32_t>(kSegments[0], 7),
                                 std::vector<int32_t>(kSegments[1], 8)})
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
  // rows' attention over it folded over rows as the policy asks (summed, or kvzip's maximum),
  // then folded across segments the same way; its context columns are the window's scores.
  std::unique_ptr<policies::CompressionPolicy> policy =
      *policies::CreatePolicy(GetParam(), config, Context());
  policy->UseScoring(&scoring);
  const policies::ObservationRequest observe = policy->Observation();
  const bool max = observe.window_reduce == kernels::ColumnReduce::kMax;
  std::vector<std::vector<float>> folded(kLayers, std::vector<float>(kHeads * kContext, 0.0f));
  int32_t source = 0;
  for (int32_t size : kSegments) {
    SequenceKv whole(kLayers, kBlock);
    Write(whole, 0, kContext);
    Write(whole, kContext, kContext + size, source);
    std::vector<int32_t> visible;
    for (int32_t p = kContext; p < kContext + size; ++p) visible.push_back(p + 1);
    for (int32_t l = 0; l < kLayers; ++l) {
      kernels::ScoreInput in;
      in.block_table = whole.block_table(l).data();
      in.num_slots = kContext + size;
      in.q = rows_[l].data() + (kContext + source) * kRowFloats;
      in.num_rows = size;
      in.visible = visible.data();
      in.num_heads = kHeads;
      in.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
      in.reduce = observe.window_reduce;
      std::vector<float> all(int64_t{kHeads} * in.num_slots, 0.0f);
      ASSERT_TRUE(scoring.AccumulateAttentionColumns(in, all.data(), DeviceRows{}).ok());
      for (int32_t h = 0; h < kHeads; ++h) {
        for (int32_t j = 0; j < kContext; ++j) {
          float& to = folded[l][h * kContext + j];
          const float from = all[h * in.num_slots + j];
          to = max ? std::max(to, from) : to + from;
        }
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
    policies::ObservationAttention attention;
    attention.layer = l;
    attention.num_heads = kHeads;
    attention.num_kv_heads = kKvHeads;
    attention.num_rows = static_cast<int32_t>(window.size());
    attention.num_slots = kContext;
    attention.row_positions = window;
    (max ? attention.window_max : attention.window_sums) = folded[l];
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
    const absl::Status refused = session->SetProbe({{1, 2, 3}});
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(refused.message().find("compression.probe"), std::string::npos) << refused;
  }
}

}  // namespace
}  // namespace winnow::cache
