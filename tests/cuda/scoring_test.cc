// kernels/cuda/scoring.h against the CPU scoring kernels (kernels/cpu/attention_scores.h) and
// TokenSelect's vote (TokenSelectSelector::Vote): the same keys in an f16 or bf16 pool, the same
// query rows (float, fp16 or bf16 on the device; their exact values on the CPU). Tolerance: the
// two sides differ only in float summation order and exp's last bits, so every probability, sum
// and vote is within 2e-4 relative + 1e-6 absolute, and every log-normaliser within 1e-4
// absolute (logits are O(10) here).
#include "kernels/cuda/scoring.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "cache/block_pool.h"
#include "cache/host_scoring.h"
#include "cache/policies/tokenselect.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/column_sums.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

using ::winnow::testing::Allocate;
using ::winnow::testing::Download;
using ::winnow::testing::ExpectClose;
using ::winnow::testing::Half16;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::RoundedTo;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;
using ::winnow::testing::Upload16;

constexpr int32_t kHeads = 6;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocks = 10;
constexpr int32_t kSlots = 23;  // not a multiple of the block size
constexpr double kRel = 2e-4;
constexpr double kAbs = 1e-6;

// Random K/V in every row of a pool, one sequence of kSlots slots whose table does not start at
// block 0, and the arena on the device.
struct Fixture {
  std::unique_ptr<cache::BlockPool> pool;
  cache::SequenceKv kv{1, kBlock};
  std::vector<int32_t> table;
  DeviceBuffer<std::byte> arena;
  DeviceBuffer<int32_t> d_table;

  explicit Fixture(KvDtype dtype) {
    pool = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, dtype}, kBlocks);
    ::winnow::testing::FillRandom(*pool, 31);
    std::vector<int32_t> spare;
    pool->Allocate(3, &spare);
    EXPECT_TRUE(kv.Reserve(*pool, kSlots));
    pool->Free(spare);
    kv.AppendSlots(0, kSlots);
    table.assign(kv.block_table(0).begin(), kv.block_table(0).end());
    const std::byte* host = pool->View().arena;
    arena = Upload(std::vector<std::byte>(host, host + kBlocks * pool->layout().bytes_per_block()));
    d_table = Upload(table);
  }
  ~Fixture() { kv.Release(*pool); }
  DevicePagedKv Device() { return DevicePagedKvFor(pool->View(), arena.data()); }
};

// Query values as Q holds them: exact for float, rounded for the 16-bit types.
template <typename Q>
std::vector<float> AsQ(const std::vector<float>& values) {
  if constexpr (std::is_same_v<Q, float>) {
    return values;
  } else {
    return RoundedTo(Half16<Q>::kDtype, values);
  }
}
template <typename Q>
DeviceBuffer<Q> UploadQ(const std::vector<float>& values) {
  if constexpr (std::is_same_v<Q, float>) {
    return Upload(values);
  } else {
    return Upload16<Q>(values);
  }
}

template <typename Q>
class ScoringTest : public ::winnow::testing::CudaTest {};
struct TypeNames {
  template <typename Q>
  static std::string GetName(int) {
    if constexpr (std::is_same_v<Q, float>) {
      return "f32";
    } else {
      return Half16<Q>::kDtype == KvDtype::kF16 ? "f16" : "bf16";
    }
  }
};
using QueryTypes = ::testing::Types<float, __half, __nv_bfloat16>;
TYPED_TEST_SUITE(ScoringTest, QueryTypes, TypeNames);

TYPED_TEST(ScoringTest, ProbabilitiesAndColumnSumsMatchTheCpu) {
  using Q = TypeParam;
  const int32_t rows = 4;
  const std::vector<int32_t> visible = {5, 12, 22, 23};
  const std::vector<float> q = AsQ<Q>(RandomNormal(int64_t{rows} * kHeads * kDim, 32, 2.0f));
  const float scale = 1.0f / 8.0f;
  ThreadPool threads(2);
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBF16}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    Fixture f(dtype);
    const ScoreInput cpu_in{f.table.data(), kSlots, q.data(), rows, visible.data(), kHeads, scale};
    std::vector<float> want_probs(int64_t{kHeads} * rows * kSlots);
    std::vector<float> want_lse(kHeads * rows);
    kernels::AttentionProbabilities(f.pool->View(), cpu_in, want_probs.data(), want_lse.data(),
                                    threads);
    // Sums already accumulated (from earlier chunks): non-negative, as probabilities' sums are.
    std::vector<float> initial_sums = RandomNormal(kHeads * kSlots, 33);
    for (float& x : initial_sums) x = std::abs(x);
    std::vector<float> want_sums = initial_sums;
    kernels::AccumulateAttentionColumns(f.pool->View(), cpu_in, want_sums.data(), threads);

    auto d_q = UploadQ<Q>(q);
    auto d_visible = Upload(visible);
    const DeviceScoreInput<Q> in{f.d_table.data(), kSlots, d_q.data(), rows, d_visible.data(),
                                 kHeads, scale};
    // The probabilities' buffer starts as garbage: every element must be written.
    auto d_probs = Upload(std::vector<float>(want_probs.size(), NAN));
    auto d_lse = Allocate<float>(kHeads * rows);
    ASSERT_TRUE(AttentionProbabilities<Q>(f.Device(), in, d_probs.data(), d_lse.data(), nullptr)
                    .ok());
    auto d_sums = Upload(initial_sums);
    auto d_scratch = Allocate<float>(kHeads * rows);
    ASSERT_TRUE(
        AccumulateAttentionColumns<Q>(f.Device(), in, d_sums.data(), d_scratch.data(), nullptr)
            .ok());
    ASSERT_TRUE(Synchronize().ok());
    ExpectClose(Download(d_probs), want_probs, kRel, kAbs, "probabilities");
    ExpectClose(Download(d_lse), want_lse, 0, 1e-4, "log-normalisers");
    ExpectClose(Download(d_scratch), want_lse, 0, 1e-4, "online log-normalisers");
    ExpectClose(Download(d_sums), want_sums, kRel, kAbs, "column sums");

    // The maximum over the rows instead (KVzip's reconstruction scores), folded into maxima
    // already held.
    ScoreInput cpu_max = cpu_in;
    cpu_max.reduce = kernels::ColumnReduce::kMax;
    std::vector<float> want_max = initial_sums;
    for (float& x : want_max) x = std::min(x, 0.2f);
    auto d_max = Upload(want_max);
    kernels::AccumulateAttentionColumns(f.pool->View(), cpu_max, want_max.data(), threads);
    DeviceScoreInput<Q> in_max = in;
    in_max.column_max = true;
    ASSERT_TRUE(
        AccumulateAttentionColumns<Q>(f.Device(), in_max, d_max.data(), d_scratch.data(), nullptr)
            .ok());
    ASSERT_TRUE(Synchronize().ok());
    ExpectClose(Download(d_max), want_max, kRel, kAbs, "column maxima");
  }
}

TYPED_TEST(ScoringTest, TokenSelectVoteMatchesTheCpu) {
  using Q = TypeParam;
  const int32_t begin = 3, end = 20;
  const std::vector<float> query = AsQ<Q>(RandomNormal(int64_t{kHeads} * kDim, 34, 0.5f));
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBF16}) {
    for (bool gqa_mod : {false, true}) {
      for (bool scaled : {false, true}) {
        SCOPED_TRACE(::testing::Message() << KvDtypeName(dtype) << (gqa_mod ? " mod" : " div")
                                          << (scaled ? " sqrt_d" : " raw"));
        Fixture f(dtype);
        cache::policies::TokenSelectOptions options;
        options.num_heads = kHeads;
        options.num_kv_heads = kKvHeads;
        options.head_dim = kDim;
        options.gqa_mod = gqa_mod;
        options.scaled_vote = scaled;
        cache::policies::TokenSelectSelector selector(options);
        kernels::ThreadPool threads(1);
        cache::HostScoring host_scoring(*f.pool, threads);
        selector.set_scoring(&host_scoring);
        const std::vector<float> want = selector.Vote(0, query, begin, end, f.kv);

        auto d_query = UploadQ<Q>(query);
        auto d_vote = Upload(std::vector<float>(end - begin, NAN));
        auto d_scratch = Allocate<float>(kHeads);
        const float scale = scaled ? 1.0f / std::sqrt(static_cast<float>(kDim)) : 1.0f;
        ASSERT_TRUE(TokenSelectVote<Q>(f.Device(), f.d_table.data(), d_query.data(), kHeads,
                                       begin, end, scale, gqa_mod, d_vote.data(),
                                       d_scratch.data(), nullptr)
                        .ok());
        ASSERT_TRUE(Synchronize().ok());
        ExpectClose(Download(d_vote), want, kRel, kAbs, "vote");
      }
    }
  }
}

class ColumnSumsFromLseTest : public ::winnow::testing::CudaTest,
                              public ::testing::WithParamInterface<int32_t> {};

// The tensor-core column sums from given log-sum-exps against the CPU's column sums over the
// same bf16 keys and query rows, the log-sum-exps being the CPU's (natural) log-normalisers in
// FlashInfer's base 2: three query heads per KV head, 150 keys (three key tiles, the last one
// partial) in a table that does not start at block 0, 70 rows (three row tiles) that see the
// keys causally from position 80, except a run of rows that see fewer keys than the rows before
// them, and sums that already hold earlier chunks' values.
TEST_P(ColumnSumsFromLseTest, MatchesTheCpu) {
  const int32_t head_dim = GetParam();
  constexpr int32_t kBlockSize = 16, kPoolBlocks = 16, kKeys = 150, kRows = 70;
  auto pool = cache::BlockPool::Create(
      cache::KvLayout{1, kKvHeads, head_dim, kBlockSize, KvDtype::kBF16}, kPoolBlocks);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ::winnow::testing::FillRandom(**pool, 37);
  std::vector<int32_t> spare;
  (*pool)->Allocate(2, &spare);
  cache::SequenceKv kv(1, kBlockSize);
  ASSERT_TRUE(kv.Reserve(**pool, kKeys));
  (*pool)->Free(spare);
  kv.AppendSlots(0, kKeys);
  const std::vector<int32_t> table(kv.block_table(0).begin(), kv.block_table(0).end());
  std::vector<int32_t> visible(kRows);
  for (int32_t r = 0; r < kRows; ++r) visible[r] = std::min(81 + r, kKeys);
  for (int32_t r = 40; r < 48; ++r) visible[r] = 30;
  const std::vector<float> q =
      RoundedTo(KvDtype::kBF16, RandomNormal(int64_t{kRows} * kHeads * head_dim, 35, 2.0f));
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ThreadPool threads(2);
  const ScoreInput cpu_in{table.data(), kKeys, q.data(), kRows, visible.data(), kHeads, scale};
  std::vector<float> probs(int64_t{kHeads} * kRows * kKeys), natural(int64_t{kHeads} * kRows);
  kernels::AttentionProbabilities((*pool)->View(), cpu_in, probs.data(), natural.data(), threads);
  std::vector<float> lse_log2(int64_t{kRows} * kHeads);  // [row][head], as FlashInfer writes it
  for (int32_t r = 0; r < kRows; ++r) {
    for (int32_t h = 0; h < kHeads; ++h) {
      lse_log2[r * kHeads + h] = natural[h * kRows + r] * 1.4426950408889634f;
    }
  }
  std::vector<float> want = RandomNormal(int64_t{kHeads} * kKeys, 36);
  for (float& x : want) x = std::abs(x);
  auto d_sums = Upload(want);
  kernels::AccumulateAttentionColumns((*pool)->View(), cpu_in, want.data(), threads);

  const PagedKvView view = (*pool)->View();
  auto d_arena = Upload(std::vector<std::byte>(
      view.arena, view.arena + int64_t{kPoolBlocks} * view.bytes_per_block));
  auto d_table = Upload(table);
  auto d_q = Upload16<__nv_bfloat16>(q);
  auto d_visible = Upload(visible);
  auto d_lse = Upload(lse_log2);
  const DeviceScoreInput<__nv_bfloat16> in{d_table.data(),   kKeys,  d_q.data(), kRows,
                                           d_visible.data(), kHeads, scale};
  const DevicePagedKv device = DevicePagedKvFor(view, d_arena.data());
  ASSERT_TRUE(ColumnSumsFromLse(device, in, d_lse.data(), d_sums.data(), nullptr).ok());
  ASSERT_TRUE(Synchronize().ok());
  ExpectClose(Download(d_sums), want, kRel, kAbs, "column sums");

  // The maximum over the rows instead, folded into maxima already held.
  ScoreInput cpu_max = cpu_in;
  cpu_max.reduce = kernels::ColumnReduce::kMax;
  std::vector<float> want_max(int64_t{kHeads} * kKeys, 0.01f);
  auto d_max = Upload(want_max);
  kernels::AccumulateAttentionColumns((*pool)->View(), cpu_max, want_max.data(), threads);
  DeviceScoreInput<__nv_bfloat16> in_max = in;
  in_max.column_max = true;
  ASSERT_TRUE(ColumnSumsFromLse(device, in_max, d_lse.data(), d_max.data(), nullptr).ok());
  ASSERT_TRUE(Synchronize().ok());
  ExpectClose(Download(d_max), want_max, kRel, kAbs, "column maxima");
  kv.Release(**pool);

  Fixture f16(KvDtype::kF16);
  const absl::Status s = ColumnSumsFromLse(f16.Device(), in, d_lse.data(), d_sums.data(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("takes bf16"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(HeadDims, ColumnSumsFromLseTest, ::testing::Values(64, 128));

TEST(ScoringArgumentsTest, RejectsHeadsThatDoNotGroupAndMissingScratch) {
  auto pool =
      *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, KvDtype::kF16}, 1);
  const DevicePagedKv kv = DevicePagedKvFor(pool->View(), reinterpret_cast<std::byte*>(16));
  const int32_t fake_ints[1] = {0};
  const float fake_floats[1] = {0};
  DeviceScoreInput<float> in{fake_ints, kSlots, fake_floats, 1, fake_ints, 5, 1.0f};
  absl::Status s = AttentionProbabilities<float>(kv, in, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_heads"), std::string::npos) << s;
  in.num_heads = kHeads;
  s = AccumulateAttentionColumns<float>(kv, in, nullptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("log_normalizer"), std::string::npos) << s;
  s = TokenSelectVote<float>(kv, fake_ints, fake_floats, kHeads, 5, 4, 1.0f, false, nullptr,
                             nullptr, nullptr);
  EXPECT_NE(s.message().find("range"), std::string::npos) << s;
}

}  // namespace
}  // namespace winnow::kernels::cuda
