// A device forward scores the observation window while it runs (QueryCapture::device_plan for
// a policy that plans on the host from summed window scores and value norms): the policy must get
// the same inputs, and so make the same plan, as when the rows come to the host. The "device"
// here is the host pool, whose scoring backend reads the rows a forward would leave on the
// device from host memory; the CUDA backend is tested against the CPU kernels in
// tests/cuda/cuda_kv_device_test.cc and end to end in tests/cuda/cuda_model_test.cc.
#include <gtest/gtest.h>

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
constexpr int32_t kTokens = 40;
constexpr int64_t kRowFloats = int64_t{kHeads} * kDim;

// HostScoring that takes DeviceRows as float rows in host memory, and counts the calls that
// score after the prefill (AccumulateAttentionColumns, AttentionProbabilities, ValueNorms) apart
// from the ones a forward makes while it runs (the deferred ones).
class RowsInHostMemory : public HostScoring {
 public:
  using HostScoring::HostScoring;

  absl::Status ColumnSumsDeferred(const kernels::ScoreInput& in, float* column_sums,
                                  const DeviceRows& device) override {
    ++deferred_calls;
    kernels::ScoreInput host = in;
    if (device.q != nullptr) host.q = static_cast<const float*>(device.q);
    std::fill(column_sums, column_sums + int64_t{in.num_heads} * in.num_slots, 0.0f);
    return HostScoring::AccumulateAttentionColumns(host, column_sums, DeviceRows{});
  }
  absl::Status ValueNormsDeferred(std::span<const int32_t> table, int32_t num_slots,
                                  float* norms) override {
    ++deferred_calls;
    return HostScoring::ValueNorms(table, num_slots, norms);
  }
  absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in, float* column_sums,
                                          const DeviceRows& device) override {
    ++after_prefill_calls;
    return HostScoring::AccumulateAttentionColumns(in, column_sums, device);
  }
  absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                      float* log_normalizer) override {
    ++after_prefill_calls;
    return HostScoring::AttentionProbabilities(in, probs, log_normalizer);
  }
  absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                          float* norms) override {
    ++after_prefill_calls;
    return HostScoring::ValueNorms(table, num_slots, norms);
  }

  int32_t deferred_calls = 0;
  int32_t after_prefill_calls = 0;
};

class CompressionDeviceScoresTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    pool_ = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 64);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    rows_.resize(kLayers);
    for (std::vector<float>& layer : rows_) {
      layer.resize(kTokens * kRowFloats);
      for (float& x : layer) x = normal(rng);
    }
    keys_.resize(int64_t{kLayers} * kKvHeads * kTokens * 2 * kDim);
    for (float& x : keys_) x = normal(rng);
  }

  std::unique_ptr<CompressionSession> Session() {
    policies::PolicyContext context;
    context.dims = {kLayers, kHeads, kKvHeads, kDim, kBlock};
    context.layout.num_tokens = kTokens;
    return *CompressionSession::Create(GetParam(), policies::PolicyConfig(0.25, {}), context);
  }

  // The whole prompt's K/V, the same values in every sequence.
  void Fill(SequenceKv& kv) {
    ASSERT_TRUE(kv.Reserve(*pool_, kTokens));
    const float* next = keys_.data();
    for (int32_t l = 0; l < kLayers; ++l) {
      kv.AppendSlots(l, kTokens);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t s = 0; s < kTokens; ++s) {
          const int32_t block = kv.block_table(l)[s / kBlock];
          for (bool values : {false, true}) {
            pool_->WriteRow(block, h, s % kBlock, values, next);
            next += kDim;
          }
        }
      }
    }
  }

  // One prefill forward of the whole prompt as the CPU forward runs the hooks: the captured
  // rows go to the host, layer_done after each layer's rows; device_plan is ignored.
  void HostForward(QueryCapture& capture, SequenceKv& kv, ScoringBackend& scoring) {
    capture.per_layer.resize(kLayers);
    const int32_t first = capture.first_position;
    for (int32_t p = first; p < kTokens; ++p) capture.positions.push_back(p);
    for (int32_t l = 0; l < kLayers; ++l) {
      capture.per_layer[l].assign(rows_[l].begin() + first * kRowFloats, rows_[l].end());
      if (capture.layer_done) capture.layer_done(l, kv, scoring);
    }
  }

  // The same forward as a device forward runs it: no rows to the host, the hooks after each
  // layer's attention with the rows where they are.
  void DeviceForward(QueryCapture& capture, SequenceKv& kv, ScoringBackend& scoring) {
    ASSERT_TRUE(capture.device_plan) << GetParam() << " offers no device hook";
    capture.per_layer.resize(kLayers);
    const int32_t first = capture.first_position;
    for (int32_t p = first; p < kTokens; ++p) capture.positions.push_back(p);
    for (int32_t l = 0; l < kLayers; ++l) {
      DeviceRows rows;
      rows.q = rows_[l].data() + first * kRowFloats;
      rows.count = kTokens - first;
      rows.row_bytes = kRowFloats * static_cast<int64_t>(sizeof(float));
      rows.num_heads = kHeads;
      capture.device_rows = rows;
      if (capture.layer_done) capture.layer_done(l, kv, scoring);
      capture.device_plan(l, kv, scoring);
      capture.device_rows = {};
    }
  }

  std::unique_ptr<BlockPool> pool_;
  kernels::ThreadPool threads_{1};
  std::vector<std::vector<float>> rows_;  // [layer] every position's query row
  std::vector<float> keys_;
};

TEST_P(CompressionDeviceScoresTest, SamePlanAsWithTheRowsOnTheHost) {
  std::vector<std::vector<int32_t>> kept[2];
  for (bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device forward" : "host forward");
    RowsInHostMemory scoring(*pool_, threads_);
    std::unique_ptr<CompressionSession> session = Session();
    SequenceKv kv(kLayers, kBlock);
    Fill(kv);
    EXPECT_GT(session->DeviceWindowBegin(), 0);
    QueryCapture* capture = session->PrefillCapture(0, kTokens);
    ASSERT_NE(capture, nullptr);
    if (on_device) {
      DeviceForward(*capture, kv, scoring);
    } else {
      HostForward(*capture, kv, scoring);
    }
    ASSERT_TRUE(session->AfterPrefillChunk().ok());
    const int32_t deferred = scoring.deferred_calls;
    absl::StatusOr<CompactionStats> stats = session->Compress(kv, *pool_, scoring);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->blocks_freed, 0);
    if (on_device) {
      // Everything was asked for while the forward ran: nothing scores after it.
      EXPECT_EQ(scoring.after_prefill_calls, 0);
      EXPECT_GE(deferred, kLayers);
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t h = 0; h < kKvHeads; ++h) {
        const std::span<const int32_t> positions = session->slot_positions().Positions(l, h);
        kept[on_device].emplace_back(positions.begin(), positions.end());
      }
    }
    kv.Release(*pool_);
  }
  EXPECT_EQ(kept[1], kept[0]);
  EXPECT_EQ(pool_->num_used(), 0);
}

// xkv and winnowkv sum the window's rows; winnowkv_docs adds every row's column sums and value
// norms; all plan on the host.
INSTANTIATE_TEST_SUITE_P(Policies, CompressionDeviceScoresTest,
                         ::testing::Values("xkv", "winnowkv", "winnowkv_docs"));

TEST(CompressionDeviceScoresOfferTest, OnlyPoliciesThatSumWindowRowsOrReadNorms) {
  policies::PolicyContext context;
  context.dims = {kLayers, kHeads, kKvHeads, kDim, kBlock};
  context.layout.num_tokens = kTokens;
  const policies::PolicyConfig config(0.25, {});
  // vl_cache reads each window row's probabilities: its rows come to the host.
  std::unique_ptr<CompressionSession> rows =
      *CompressionSession::Create("vl_cache", config, context);
  EXPECT_EQ(rows->DeviceWindowBegin(), -1);
  QueryCapture* capture = rows->PrefillCapture(0, kTokens);
  ASSERT_NE(capture, nullptr);
  EXPECT_FALSE(capture->device_plan);
  std::unique_ptr<CompressionSession> sums = *CompressionSession::Create("xkv", config, context);
  EXPECT_GT(sums->DeviceWindowBegin(), 0);
  // A chunk that does not complete the prompt gets no device hook.
  capture = sums->PrefillCapture(0, kTokens - 1);
  ASSERT_NE(capture, nullptr);
  EXPECT_FALSE(capture->device_plan);
}

}  // namespace
}  // namespace winnow::cache
