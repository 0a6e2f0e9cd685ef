// kernels/cuda/window_top_k.h against the host's helpers (cache/policies/scoring_helpers.h):
// pooling and the GQA fold within float rounding (the host's PoolRowPrefixes, AggregateGroups);
// the top-k with the window kept exactly equal to TopKWithForced on the same scores, with many
// ties (ties go to the lower slot), over rows longer than one block's pass.
#include "kernels/cuda/window_top_k.h"

#include <algorithm>
#include <random>
#include <vector>

#include "cache/policies/scoring_helpers.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

namespace pol = cache::policies;
using ::winnow::testing::Allocate;
using ::winnow::testing::Download;
using ::winnow::testing::ExpectClose;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;

class WindowTopKTest : public ::winnow::testing::CudaTest {};

TEST_F(WindowTopKTest, PoolsAndFoldsLikeTheHost) {
  const int32_t heads = 8, kv_heads = 2, n = 300, prefix = 268;
  std::vector<float> sums = ::winnow::testing::RandomNormal(size_t{heads} * n, 3);
  for (float& x : sums) x = std::abs(x);
  auto d_sums = Upload(sums);
  auto d_scores = Allocate<float>(int64_t{kv_heads} * prefix);
  for (pol::Pooling pooling : {pol::Pooling::kNone, pol::Pooling::kAvg, pol::Pooling::kMax}) {
    for (pol::GroupAggregation folding :
         {pol::GroupAggregation::kSum, pol::GroupAggregation::kMean, pol::GroupAggregation::kMax}) {
      for (int32_t kernel : {1, 5, 8}) {
        const std::vector<float> want = pol::AggregateGroups(
            pol::PoolRowPrefixes(sums, heads, n, prefix, kernel, pooling, nullptr), heads,
            kv_heads, prefix, folding);
        WindowScoreShape shape{heads, kv_heads, n, prefix, kernel,
                               static_cast<KeyPooling>(pooling),
                               static_cast<HeadFolding>(folding)};
        ASSERT_TRUE(PoolAndFoldWindowScores(d_sums.data(), shape, d_scores.data(), nullptr).ok());
        ASSERT_TRUE(Synchronize().ok());
        ExpectClose(Download(d_scores), want, 1e-6, 1e-7,
                    "pooling " + std::to_string(static_cast<int>(pooling)) + " folding " +
                        std::to_string(static_cast<int>(folding)) + " kernel " +
                        std::to_string(kernel));
      }
    }
  }
}

TEST_F(WindowTopKTest, PicksWhatTopKWithForcedPicksTiesIncluded) {
  const int32_t kv_heads = 3, n = 3000, window = 32, prefix = n - window;
  std::mt19937 rng(11);
  // Few distinct values, so most picks are decided by the tie rule; one head all equal.
  std::uniform_int_distribution<int> level(0, 40);
  std::vector<float> scores(size_t{kv_heads} * prefix);
  for (size_t i = 0; i < scores.size(); ++i) {
    scores[i] = i < size_t{prefix} ? 0.5f : static_cast<float>(level(rng)) * 0.25f;
  }
  auto d_scores = Upload(scores);
  const std::vector<int32_t> forced = pol::SinksAndWindow(n, 0, window);
  for (int32_t keep : {1, window, window + 1, 300, 1500, prefix, n - 1, n}) {
    auto d_kept = Allocate<int32_t>(int64_t{kv_heads} * keep);
    ASSERT_TRUE(TopKWithWindow(d_scores.data(), kv_heads, prefix, n, keep, d_kept.data(), nullptr)
                    .ok());
    ASSERT_TRUE(Synchronize().ok());
    const std::vector<int32_t> got = Download(d_kept);
    for (int32_t g = 0; g < kv_heads; ++g) {
      std::vector<float> row(n, 0.0f);
      std::copy_n(scores.begin() + int64_t{g} * prefix, prefix, row.begin());
      EXPECT_EQ(std::vector<int32_t>(got.begin() + int64_t{g} * keep,
                                     got.begin() + int64_t{g + 1} * keep),
                pol::TopKWithForced(row, n, forced, keep))
          << "keep " << keep << ", KV head " << g;
    }
  }
}

TEST_F(WindowTopKTest, RejectsBadArguments) {
  auto d_scores = Allocate<float>(16);
  auto d_kept = Allocate<int32_t>(16);
  EXPECT_FALSE(TopKWithWindow(d_scores.data(), 1, 8, 10, 0, d_kept.data(), nullptr).ok());
  EXPECT_FALSE(TopKWithWindow(d_scores.data(), 1, 8, 10, 11, d_kept.data(), nullptr).ok());
  EXPECT_FALSE(TopKWithWindow(d_scores.data(), 1, 11, 10, 5, d_kept.data(), nullptr).ok());
}

}  // namespace
}  // namespace winnow::kernels::cuda
