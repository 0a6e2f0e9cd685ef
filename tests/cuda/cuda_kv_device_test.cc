// model/cuda_kv_device.h against the host pool: the same cache operations (MakePrivate's block
// copies, ApplyKeepPlan with and without merges, the compression scoring) run once on a host
// BlockPool and once on a books-only pool with the CUDA device attached, over the same block
// ids and the same starting bytes. Moves must match byte for byte; scores within the scoring
// kernels' tolerance (tests/cuda/scoring_test.cc).
#include "model/cuda_kv_device.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/host_scoring.h"
#include "cache/policies/scoring_helpers.h"
#include "cache/policies/tokenselect.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::model {
namespace {

using ::winnow::testing::Download;
using ::winnow::testing::ExpectClose;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::Upload;
using kernels::KvDtype;

constexpr int32_t kLayers = 2;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeads = 6;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocks = 24;
constexpr int32_t kSlots = 23;

class CudaKvDeviceTest : public ::winnow::testing::CudaTest,
                         public ::testing::WithParamInterface<KvDtype> {
 protected:
  void SetUp() override {
    ::winnow::testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    const cache::KvLayout layout{kLayers, kKvHeads, kDim, kBlock, GetParam()};
    host_ = *cache::BlockPool::Create(layout, kBlocks);
    books_ = *cache::BlockPool::Create(layout, kBlocks, /*host_arena=*/false);
    ::winnow::testing::FillRandom(*host_, 17);
    arena_ = Upload(HostArena());
    device_ = std::make_unique<CudaKvDevice>(
        kernels::cuda::DevicePagedKvFor(layout.View(nullptr), arena_.data()), nullptr,
        threads_);
    books_->AttachDevice(device_.get());
    // The same reservations on both pools give the same block ids.
    for (cache::BlockPool* pool : {host_.get(), books_.get()}) {
      kvs_.emplace_back(kLayers, kBlock);
      ASSERT_TRUE(kvs_.back().Reserve(*pool, kSlots));
      for (int32_t l = 0; l < kLayers; ++l) kvs_.back().AppendSlots(l, kSlots);
    }
    ASSERT_EQ(std::vector<int32_t>(kvs_[0].block_table(1).begin(), kvs_[0].block_table(1).end()),
              std::vector<int32_t>(kvs_[1].block_table(1).begin(), kvs_[1].block_table(1).end()));
  }
  void TearDown() override {
    if (kvs_.size() == 2) {
      kvs_[0].Release(*host_);
      kvs_[1].Release(*books_);
      EXPECT_EQ(host_->num_used(), books_->num_used());
    }
  }

  std::vector<std::byte> HostArena() const {
    const std::byte* a = host_->View().arena;
    return std::vector<std::byte>(a, a + int64_t{kBlocks} * host_->layout().bytes_per_block());
  }
  void ExpectSameArena() {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(Download(arena_) == HostArena()) << "device arena differs from the host's";
  }

  std::unique_ptr<cache::BlockPool> host_, books_;
  kernels::cuda::DeviceBuffer<std::byte> arena_;
  kernels::ThreadPool threads_{1};
  std::unique_ptr<CudaKvDevice> device_;
  std::vector<cache::SequenceKv> kvs_;  // [0] on host_, [1] on books_
};

TEST_P(CudaKvDeviceTest, CopyBlockThroughThePoolCopiesOnTheDevice) {
  std::vector<int32_t> spare;
  ASSERT_TRUE(host_->Allocate(1, &spare));
  ASSERT_TRUE(books_->Allocate(1, &spare));
  ASSERT_EQ(spare[0], spare[1]);
  ASSERT_TRUE(host_->CopyBlock(kvs_[0].block_table(0)[2], spare[0]).ok());
  ASSERT_TRUE(books_->CopyBlock(kvs_[1].block_table(0)[2], spare[1]).ok());
  ExpectSameArena();
  host_->Free({&spare[0], 1});
  books_->Free({&spare[1], 1});
}

TEST_P(CudaKvDeviceTest, ApplyKeepPlanMovesTheHostsBytes) {
  cache::policies::KeepPlan plan;
  plan.layers.resize(kLayers);
  // Layer 0: head 0 keeps a prefix in place then moves, head 1 moves every entry.
  plan.layers[0].heads = {{0, 1, 2, 5, 9, 22}, {3, 4, 8, 12, 17, 21}};
  // Layer 1 untouched.
  cache::CompactionStats want = *cache::ApplyKeepPlan(plan, kvs_[0], *host_);
  absl::StatusOr<cache::CompactionStats> got = cache::ApplyKeepPlan(plan, kvs_[1], *books_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->blocks_freed, want.blocks_freed);
  EXPECT_EQ(books_->num_free(), host_->num_free());
  EXPECT_EQ(kvs_[1].num_slots(0), 6);
  ExpectSameArena();
}

TEST_P(CudaKvDeviceTest, ApplyKeepPlanWithMergesMatchesTheHostsMeans) {
  cache::policies::KeepPlan plan;
  plan.layers.resize(kLayers);
  // Layer 1: head 0 merges groups (one group of one), head 1 only keeps.
  cache::policies::LayerKeep& keep = plan.layers[1];
  keep.heads = {{0, 4, 10, 20}, {1, 2, 15, 22}};
  keep.merge = {{{0, 1, 2, 3}, {4}, {5, 6, 10, 11, 12}, {19, 20, 21, 22}}, {}};
  ASSERT_TRUE(cache::ApplyKeepPlan(plan, kvs_[0], *host_).ok());
  absl::StatusOr<cache::CompactionStats> got = cache::ApplyKeepPlan(plan, kvs_[1], *books_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(kvs_[1].num_slots(1), 4);
  ExpectSameArena();
}

TEST_P(CudaKvDeviceTest, ScoringMatchesTheCpuKernels) {
  const int32_t rows = 5;
  const std::vector<float> q = RandomNormal(int64_t{rows} * kHeads * kDim, 5);
  std::vector<int32_t> visible(rows);
  for (int32_t r = 0; r < rows; ++r) visible[r] = kSlots - rows + r + 1;
  kernels::ScoreInput in;
  in.block_table = kvs_[0].block_table(0).data();
  in.num_slots = kSlots;
  in.q = q.data();
  in.num_rows = rows;
  in.visible = visible.data();
  in.num_heads = kHeads;
  in.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  kernels::ThreadPool threads(2);

  const int64_t n = int64_t{kHeads} * rows * kSlots;
  std::vector<float> want(n), want_lse(kHeads * rows), got(n), got_lse(kHeads * rows);
  kernels::AttentionProbabilities(host_->View(), in, want.data(), want_lse.data(), threads);
  ASSERT_TRUE(device_->AttentionProbabilities(in, got.data(), got_lse.data()).ok());
  ExpectClose(got, want, 2e-4, 1e-6, "probabilities");
  ExpectClose(got_lse, want_lse, 1e-4, 1e-6, "log-normaliser");

  std::vector<float> want_sums(int64_t{kHeads} * kSlots, 1.0f), got_sums = want_sums;
  kernels::AccumulateAttentionColumns(host_->View(), in, want_sums.data(), threads);
  ASSERT_TRUE(device_->AccumulateAttentionColumns(in, got_sums.data(), cache::DeviceRows{}).ok());
  ExpectClose(got_sums, want_sums, 2e-4, 1e-6, "column sums (added to 1)");

  // Query rows left on the device by the forward (bf16, QueryCapture::device_rows): the CPU
  // scores the same rounded values.
  const std::vector<float> q16 = ::winnow::testing::RoundedTo(KvDtype::kBF16, q);
  auto d_q16 = ::winnow::testing::Upload16<__nv_bfloat16>(q);
  in.q = q16.data();
  std::fill(want_sums.begin(), want_sums.end(), 0.0f);
  std::fill(got_sums.begin(), got_sums.end(), 0.0f);
  kernels::AccumulateAttentionColumns(host_->View(), in, want_sums.data(), threads);
  in.q = nullptr;
  ASSERT_TRUE(device_
                  ->AccumulateAttentionColumns(in, got_sums.data(),
                                               cache::DeviceRows{d_q16.data(), rows})
                  .ok());
  ExpectClose(got_sums, want_sums, 2e-4, 1e-6, "column sums of device rows");
  // With the rows' log-sum-exps from the forward's attention (base 2, [row][head]), a bf16 pool
  // takes the tensor-core kernel (kernels/cuda/column_sums.h).
  in.q = q16.data();
  std::vector<float> probs16(n), natural16(kHeads * rows), lse_log2(kHeads * rows);
  kernels::AttentionProbabilities(host_->View(), in, probs16.data(), natural16.data(), threads);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < kHeads; ++h) {
      lse_log2[r * kHeads + h] = natural16[h * rows + r] * 1.4426950408889634f;
    }
  }
  auto d_lse = ::winnow::testing::Upload(lse_log2);
  std::fill(got_sums.begin(), got_sums.end(), 0.0f);
  in.q = nullptr;
  ASSERT_TRUE(device_
                  ->AccumulateAttentionColumns(in, got_sums.data(),
                                               cache::DeviceRows{d_q16.data(), rows, d_lse.data()})
                  .ok());
  ExpectClose(got_sums, want_sums, 2e-4, 1e-6, "column sums of device rows with their lse");
  in.q = q.data();

  std::vector<float> want_norms(int64_t{kKvHeads} * kSlots), got_norms(want_norms.size());
  kernels::ValueNorms(host_->View(), in.block_table, kSlots, want_norms.data());
  ASSERT_TRUE(device_->ValueNorms(kvs_[1].block_table(0), kSlots, got_norms.data()).ok());
  ExpectClose(got_norms, want_norms, 1e-5, 1e-6, "value norms");

  // TokenSelect's vote: the selector votes through the scoring backend it was given.
  cache::policies::TokenSelectOptions options;
  options.num_heads = kHeads;
  options.num_kv_heads = kKvHeads;
  options.head_dim = kDim;
  options.scaled_vote = true;
  const std::vector<float> query(q.begin(), q.begin() + kHeads * kDim);
  cache::policies::TokenSelectSelector on_host(options), on_device(options);
  cache::HostScoring host_scoring(*host_, threads_);
  on_host.set_scoring(&host_scoring);
  on_device.set_scoring(device_.get());
  const std::vector<float> want_vote = on_host.Vote(0, query, 3, 20, kvs_[0]);
  const std::vector<float> got_vote = on_device.Vote(0, query, 3, 20, kvs_[1]);
  EXPECT_TRUE(on_device.error().ok()) << on_device.error();
  ExpectClose(got_vote, want_vote, 2e-4, 1e-6, "TokenSelect vote");
}

// A SnapKV prompt plan decided and applied on the device (ScoringBackend::CompactToWindowTopK)
// keeps the slots the host's helpers pick from the same rows, and moves the same bytes as the
// host's compaction of those slots.
TEST_P(CudaKvDeviceTest, CompactToWindowTopKKeepsAndMovesWhatTheHostWould) {
  const int32_t window = 4, keep = 10, kernel = 3;
  const int32_t prefix = kSlots - window;
  const std::vector<float> q = RandomNormal(int64_t{window} * kHeads * kDim, 9);
  const std::vector<float> q16 = ::winnow::testing::RoundedTo(KvDtype::kBF16, q);
  auto d_q16 = ::winnow::testing::Upload16<__nv_bfloat16>(q);
  std::vector<int32_t> visible(window);
  for (int32_t r = 0; r < window; ++r) visible[r] = prefix + r + 1;
  kernels::ScoreInput in;
  in.block_table = kvs_[0].block_table(0).data();
  in.num_slots = kSlots;
  in.q = q16.data();
  in.num_rows = window;
  in.visible = visible.data();
  in.num_heads = kHeads;
  in.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  kernels::ThreadPool threads(2);
  std::vector<float> sums(int64_t{kHeads} * kSlots, 0.0f);
  kernels::AccumulateAttentionColumns(host_->View(), in, sums.data(), threads);
  namespace pol = cache::policies;
  const std::vector<float> folded = pol::AggregateGroups(
      pol::PoolRowPrefixes(sums, kHeads, kSlots, prefix, kernel, pol::Pooling::kAvg, nullptr),
      kHeads, kKvHeads, prefix, pol::GroupAggregation::kMean);
  const std::vector<int32_t> forced = pol::SinksAndWindow(kSlots, 0, window);
  pol::KeepPlan plan;
  plan.layers.resize(kLayers);
  for (int32_t g = 0; g < kKvHeads; ++g) {
    std::vector<float> scores(kSlots, 0.0f);
    std::copy_n(folded.begin() + g * prefix, prefix, scores.begin());
    plan.layers[0].heads.push_back(pol::TopKWithForced(scores, kSlots, forced, keep));
  }

  std::vector<int32_t> kept(kKvHeads * keep, -1);
  cache::WindowTopKRequest request;
  request.block_table = kvs_[1].block_table(0);
  request.num_slots = kSlots;
  request.device_rows = {d_q16.data(), window};
  request.visible = visible;
  request.num_heads = kHeads;
  request.scale = in.scale;
  request.window = window;
  request.kernel = kernel;
  request.keep = keep;
  request.kept_slots = kept.data();
  ASSERT_TRUE(device_->CompactToWindowTopK(request).ok());
  ASSERT_TRUE(device_->Flush().ok());
  for (int32_t g = 0; g < kKvHeads; ++g) {
    EXPECT_EQ(std::vector<int32_t>(kept.begin() + g * keep, kept.begin() + (g + 1) * keep),
              plan.layers[0].heads[g])
        << "KV head " << g;
  }
  ASSERT_TRUE(cache::ApplyKeepPlan(plan, kvs_[0], *host_).ok());
  ASSERT_TRUE(cache::ApplyKeepPlan(plan, kvs_[1], *books_, /*data_moved=*/true).ok());
  EXPECT_EQ(books_->num_free(), host_->num_free());
  ExpectSameArena();
}

INSTANTIATE_TEST_SUITE_P(DevicePoolDtypes, CudaKvDeviceTest,
                         ::testing::Values(KvDtype::kF16, KvDtype::kBF16),
                         [](const ::testing::TestParamInfo<KvDtype>& info) {
                           return std::string(kernels::KvDtypeName(info.param));
                         });

}  // namespace
}  // namespace winnow::model
