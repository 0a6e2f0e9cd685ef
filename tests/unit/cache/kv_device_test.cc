// The host side of the device seam (cache/kv_device.h, cache/scoring_backend.h), without a GPU:
// a books-only pool with a device attached sends MakePrivate's block copies and compaction to
// the device, the compression scores through the device's scoring backend, keeps the books
// itself (blocks freed at once), and passes the device's errors on. The device here records
// its calls; the CUDA implementation is tested against the host pool in
// tests/cuda/cuda_kv_device_test.cc.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/compression.h"
#include "cache/kv_device.h"
#include "cache/scoring_backend.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 8;
constexpr int32_t kBlock = 4;

class RecordingDevice : public KvDevice, public ScoringBackend {
 public:
  absl::Status CopyBlock(int32_t from, int32_t to) override {
    copies.push_back({from, to});
    return status;
  }
  absl::Status CompactLayer(std::span<const int32_t> table,
                            const policies::LayerKeep& keep) override {
    compacted_tables.emplace_back(table.begin(), table.end());
    compacted_kept.push_back(keep.kept());
    return status;
  }
  absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                      float* log_normalizer) override {
    ++probability_calls;
    return status;
  }
  absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in, float* column_sums,
                                          const DeviceRows&) override {
    ++column_sum_calls;
    // Later slots score higher: a window policy then keeps a known set.
    for (int32_t h = 0; h < in.num_heads; ++h) {
      for (int32_t j = 0; j < in.num_slots; ++j) column_sums[h * in.num_slots + j] += j;
    }
    return status;
  }
  absl::Status ValueNorms(std::span<const int32_t>, int32_t, float*) override {
    return status;
  }
  absl::Status TokenSelectVote(std::span<const int32_t>, std::span<const float>, int32_t,
                               int32_t, int32_t, float, bool, float*) override {
    return status;
  }
  kernels::ThreadPool& host_threads() override { return threads; }

  absl::Status status;
  kernels::ThreadPool threads{1};
  std::vector<std::pair<int32_t, int32_t>> copies;
  std::vector<std::vector<int32_t>> compacted_tables;
  std::vector<int32_t> compacted_kept;
  int32_t probability_calls = 0;
  int32_t column_sum_calls = 0;
};

class KvDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock, kernels::KvDtype::kF16},
                               64, /*host_arena=*/false);
    pool_->AttachDevice(&device_);
  }
  void TearDown() override { EXPECT_EQ(pool_->num_used(), 0); }

  RecordingDevice device_;
  std::unique_ptr<BlockPool> pool_;
};

TEST_F(KvDeviceTest, ApplyKeepPlanCompactsOnTheDeviceAndFreesBlocksInTheBooks) {
  SequenceKv kv(kLayers, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool_, 18));
  for (int32_t l = 0; l < kLayers; ++l) kv.AppendSlots(l, 18);
  const std::vector<int32_t> table0(kv.block_table(0).begin(), kv.block_table(0).end());
  policies::KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[0].heads = {{0, 3, 7, 17}, {1, 2, 16, 17}};  // layer 1 untouched
  absl::StatusOr<CompactionStats> stats = ApplyKeepPlan(plan, kv, *pool_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(device_.compacted_tables.size(), 1u);
  EXPECT_EQ(device_.compacted_tables[0], table0);  // the table before it shrank
  EXPECT_EQ(device_.compacted_kept[0], 4);
  EXPECT_EQ(stats->blocks_freed, 4);
  EXPECT_EQ(kv.num_slots(0), 4);
  EXPECT_EQ(pool_->num_used(), 1 + 5);
  kv.Release(*pool_);
}

TEST_F(KvDeviceTest, ADeviceErrorIsReturnedAndTheBlocksStayAccounted) {
  SequenceKv kv(kLayers, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool_, 8));
  for (int32_t l = 0; l < kLayers; ++l) kv.AppendSlots(l, 8);
  device_.status = absl::InternalError("device lost");
  policies::KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[1].heads = {{0, 1}, {2, 3}};
  absl::StatusOr<CompactionStats> stats = ApplyKeepPlan(plan, kv, *pool_);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(kv.num_slots(1), 8);  // not shrunk: its data was not moved
  kv.Release(*pool_);
}

TEST_F(KvDeviceTest, MakePrivateCopiesSharedBlocksOnTheDevice) {
  SequenceKv owner(kLayers, kBlock), sharer(kLayers, kBlock);
  ASSERT_TRUE(owner.Reserve(*pool_, kBlock));
  for (int32_t l = 0; l < kLayers; ++l) {
    owner.AppendSlots(l, kBlock);
    sharer.AppendSharedBlock(*pool_, l, owner.block_table(l)[0]);
  }
  ASSERT_TRUE(sharer.MakePrivate(*pool_).ok());
  ASSERT_EQ(device_.copies.size(), static_cast<size_t>(kLayers));
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(device_.copies[l].first, owner.block_table(l)[0]);
    EXPECT_EQ(device_.copies[l].second, sharer.block_table(l)[0]);
  }
  owner.Release(*pool_);
  sharer.Release(*pool_);
}

TEST_F(KvDeviceTest, CompressionScoresOnTheDeviceWithoutTheRows) {
  // snapkv asks only for the window rows' sum (row_probabilities false): one column-sums call
  // per layer, no row probabilities; then its plan is compacted on the device.
  const int32_t n = 32;
  policies::PolicyContext context;
  context.dims = {kLayers, kHeads, kKvHeads, kDim, kBlock};
  context.layout.num_tokens = n;
  // kernel 1: no pooling, so the scores are the device's as they came.
  const policies::PolicyConfig config(0.25, {{"window", 4.0}, {"kernel", 1.0}});
  std::unique_ptr<CompressionSession> session =
      *CompressionSession::Create("snapkv", config, context);
  SequenceKv kv(kLayers, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool_, n));
  QueryCapture* capture = session->PrefillCapture(0, n);
  ASSERT_NE(capture, nullptr);
  // What a forward does: the window rows (positions 28-31) of every layer.
  capture->per_layer.assign(kLayers, std::vector<float>(4 * kHeads * kDim, 0.5f));
  for (int32_t p = 28; p < n; ++p) capture->positions.push_back(p);
  for (int32_t l = 0; l < kLayers; ++l) kv.AppendSlots(l, n);
  ASSERT_TRUE(session->AfterPrefillChunk().ok());
  absl::StatusOr<CompactionStats> stats = session->Compress(kv, *pool_, device_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(device_.probability_calls, 0);
  EXPECT_EQ(device_.column_sum_calls, kLayers);
  EXPECT_EQ(device_.compacted_tables.size(), static_cast<size_t>(kLayers));
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(kv.num_slots(l), 8);
    // Later slots scored higher: the 4 before the window that score best, then the window.
    const std::span<const int32_t> kept = session->slot_positions().Positions(l, 0);
    EXPECT_EQ(std::vector<int32_t>(kept.begin(), kept.end()),
              (std::vector<int32_t>{24, 25, 26, 27, 28, 29, 30, 31}));
  }
  EXPECT_GT(stats->blocks_freed, 0);
  kv.Release(*pool_);
}

}  // namespace
}  // namespace winnow::cache
