// KV cache dtypes: the row codecs, the pool geometry each implies, and the kernels that read K/V
// (attention with its sparse and probability paths, the scoring kernels) and the cache code that
// moves it (compaction, merges, CopyBlock), for every dtype.
//
// Two kinds of check per kernel:
//  - exact: a kernel over a dtype's pool gives bit for bit what it gives over an f32 pool holding
//    the same values decoded (reads convert rows to float32 exactly, then run the f32 code);
//  - tolerance: against the f32 pool holding the original values, the error the dtype's storage
//    rounding causes, with the bound stated per dtype in kTolerance below.
#include "kernels/cpu/kv_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/policies/policy.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {
namespace {

const KvDtype kAll[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0};

std::string Name(const ::testing::TestParamInfo<KvDtype>& info) {
  return std::string(KvDtypeName(info.param));
}

// Largest |decoded - original| relative to the row's magnitude that storage may cause:
// f16 keeps 11 significant bits (half-ulp 2^-11 relative, 2^-25 absolute for subnormals), bf16
// 8 (2^-8), q8_0 rounds to
// amax/127 steps (half a step, amax/254, plus 127 times the fp16 rounding of the scale, whose
// relative precision drops once amax/127 is an fp16 subnormal), about 0.0045 of the amax.
double RowErrorBound(KvDtype dtype, double value, double block_amax) {
  switch (dtype) {
    case KvDtype::kF32: return 0.0;
    case KvDtype::kF16:  // below 2^-14 f16 is subnormal: steps of 2^-24, so half of that
      return std::max(std::abs(value) * std::ldexp(1.0, -11), std::ldexp(1.0, -25));
    case KvDtype::kBF16: return std::abs(value) * std::ldexp(1.0, -8);
    case KvDtype::kQ8_0:  // half a step, plus 127 x the fp16 rounding of the scale amax/127
      return block_amax / 254 +
             127 * std::max(block_amax / 127 * std::ldexp(1.0, -11), std::ldexp(1.0, -25));
  }
  return 0.0;
}

// Attention outputs and probabilities of unit-variance K/V and queries of scale 2, head_dim 64,
// against the f32 cache. Largest differences measured (outputs / probabilities): f16 1.2e-3 /
// 2.8e-4, bf16 7.2e-3 / 2.3e-3, q8_0 2.6e-2 / 9.4e-3 (q8_0's steps are amax/127 of a block of
// 32, ~0.02 here). The bounds are about 2-3x those: room for other data, not for a wrong read
// (a row read from the wrong slot moves outputs by ~1).
double Tolerance(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return 0.0;
    case KvDtype::kF16: return 4e-3;
    case KvDtype::kBF16: return 2e-2;
    case KvDtype::kQ8_0: return 6e-2;
  }
  return 0.0;
}

TEST(KvDtypeTest, NamesParseAndUnknownNamesAreErrorsListingTheChoices) {
  for (KvDtype d : kAll) EXPECT_EQ(*ParseKvDtype(KvDtypeName(d)), d);
  const absl::StatusOr<KvDtype> bad = ParseKvDtype("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("f32, f16, bf16 or q8_0"), std::string::npos);
  EXPECT_FALSE(ParseKvDtype("F16").ok());
}

TEST(KvDtypeTest, RowBytesAndPoolCapacityFollowTheDtype) {
  EXPECT_EQ(KvRowBytes(KvDtype::kF32, 64), 256);
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kBF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 64), 68);  // 2 blocks of (fp16 scale + 32 int8)
  // SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64.
  cache::KvLayout layout{30, 3, 64, 16, KvDtype::kF32};
  const int64_t bytes = int64_t{64} << 20;
  const int32_t f32_blocks = cache::BlockPool::BlocksForBytes(layout, bytes);
  EXPECT_EQ(layout.kv_bytes_per_token(), 30 * 2 * 3 * 256);
  layout.dtype = KvDtype::kF16;
  EXPECT_EQ(layout.kv_bytes_per_token(), 30 * 2 * 3 * 128);
  EXPECT_EQ(cache::BlockPool::BlocksForBytes(layout, bytes) / 2, f32_blocks);
  layout.dtype = KvDtype::kQ8_0;
  EXPECT_EQ(layout.bytes_per_block(), 2 * 3 * 16 * 68);
  EXPECT_NEAR(static_cast<double>(cache::BlockPool::BlocksForBytes(layout, bytes)) / f32_blocks,
              256.0 / 68.0, 0.01);
}

TEST(KvDtypeTest, Q8_0NeedsWholeBlocksPerRow) {
  EXPECT_TRUE(CheckKvDtype(KvDtype::kQ8_0, 64).ok());
  EXPECT_FALSE(CheckKvDtype(KvDtype::kQ8_0, 48).ok());
  EXPECT_TRUE(CheckKvDtype(KvDtype::kF16, 48).ok());
  EXPECT_FALSE(cache::BlockPool::Create(cache::KvLayout{1, 1, 48, 16, KvDtype::kQ8_0}, 4).ok());
}

TEST(KvDtypeTest, KnownEncodings) {
  std::byte out[2 * kQ8_0BlockBytes];
  auto u16 = [&](int i) {
    uint16_t v;
    std::memcpy(&v, out + 2 * i, 2);
    return v;
  };
  // f16: 1, -2, 65504 (max), 1 + 2^-11 (a tie: to even, 1.0), 1 + 3 * 2^-11 (tie: up), 1e-7
  // (subnormal: round(1e-7 / 2^-24) = 2), 1e6 (overflow: inf).
  const float f16_in[8] = {1.0f, -2.0f, 65504.0f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1e-7f, 1e6f,
                           0.0f};
  EncodeKv(KvDtype::kF16, f16_in, 8, out);
  const uint16_t f16_want[8] = {0x3C00, 0xC000, 0x7BFF, 0x3C00, 0x3C02, 0x0002, 0x7C00, 0x0000};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u16(i), f16_want[i]) << "f16 input " << f16_in[i];
  // bf16: 1 + 2^-8 is a tie (to even: 1.0), 1 + 3 * 2^-8 rounds up, NaN stays NaN.
  const float bf16_in[4] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                            std::numeric_limits<float>::quiet_NaN()};
  EncodeKv(KvDtype::kBF16, bf16_in, 4, out);
  EXPECT_EQ(u16(0), 0x3F80);
  EXPECT_EQ(u16(1), 0x3F80);
  EXPECT_EQ(u16(2), 0x3F82);
  EXPECT_EQ(u16(3) & 0x7F80, 0x7F80);
  EXPECT_NE(u16(3) & 0x007F, 0);
  // q8_0: the block's amax maps to +-127 and the scale is amax / 127; an all-zero block is zero.
  std::vector<float> q(64, 0.0f);
  for (int j = 0; j < 32; ++j) q[j] = (j - 16) * 0.25f;  // amax 4 at j = 0
  EncodeKv(KvDtype::kQ8_0, q.data(), 64, out);
  EXPECT_EQ(static_cast<int8_t>(out[2]), -127);
  EXPECT_EQ(static_cast<int8_t>(out[2 + 16]), 0);
  std::vector<float> back(64, -1.0f);
  DecodeKv(KvDtype::kQ8_0, out, 64, back.data());
  EXPECT_NEAR(back[0], -4.0f, 4.0 * 0x1p-11);  // 127 * the fp16 scale's rounding
  for (int j = 32; j < 64; ++j) EXPECT_EQ(back[j], 0.0f);
}

class KvDtypeRoundTripTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(KvDtypeRoundTripTest, WriteThenReadIsWithinTheDtypesRoundingAndIdempotent) {
  const KvDtype dtype = GetParam();
  constexpr int32_t kDim = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto pool = *cache::BlockPool::Create(cache::KvLayout{1, 2, kDim, 4, dtype}, 3);
  for (float magnitude : {1e-3f, 1.0f, 300.0f}) {
    for (int32_t block = 0; block < 3; ++block) {
      for (int32_t h = 0; h < 2; ++h) {
        for (int32_t slot = 0; slot < 4; ++slot) {
          for (bool values : {false, true}) {
            std::vector<float> row(kDim), back(kDim), again(kDim);
            for (float& x : row) x = magnitude * normal(rng);
            pool->WriteRow(block, h, slot, values, row.data());
            pool->ReadRow(block, h, slot, values, back.data());
            for (int32_t d = 0; d < kDim; ++d) {
              const int32_t first = d / 32 * 32;
              double amax = 0;
              for (int32_t k = first; k < first + 32; ++k) amax = std::max(amax, double{std::abs(row[k])});
              EXPECT_LE(std::abs(double{back[d]} - row[d]), RowErrorBound(dtype, row[d], amax))
                  << "magnitude " << magnitude << " d=" << d;
            }
            // Storing what was read back changes nothing: a decoded row is representable.
            pool->WriteRow(block, h, slot, values, back.data());
            pool->ReadRow(block, h, slot, values, again.data());
            EXPECT_EQ(again, back);
          }
        }
      }
    }
  }
  // K and V rows and heads do not overlap: write distinct rows everywhere, read them all back.
  std::vector<std::vector<float>> written;
  for (int32_t block = 0; block < 3; ++block) {
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t slot = 0; slot < 4; ++slot) {
        for (bool values : {false, true}) {
          std::vector<float> row(kDim, static_cast<float>(written.size() + 1));
          pool->WriteRow(block, h, slot, values, row.data());
          written.push_back(row);
        }
      }
    }
  }
  size_t i = 0;
  for (int32_t block = 0; block < 3; ++block) {
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t slot = 0; slot < 4; ++slot) {
        for (bool values : {false, true}) {
          std::vector<float> back(kDim);
          pool->ReadRow(block, h, slot, values, back.data());
          // Rows differ by 1; each dtype is within 1% of them (q8_0's fp16 scale is not exact).
          for (int32_t d = 0; d < kDim; ++d) EXPECT_NEAR(back[d], written[i][d], 0.01 * (i + 1));
          ++i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, KvDtypeRoundTripTest, ::testing::ValuesIn(kAll), Name);

// The same random K/V (and queries) in an f32 pool, in a pool of the dtype under test, and in
// an f32 pool holding what the dtype stores (its values decoded).
constexpr int32_t kHeads = 6;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kSlots = 23;  // not a multiple of the block size

struct Pools {
  std::unique_ptr<cache::BlockPool> f32, typed, decoded;
  cache::SequenceKv kv{1, kBlock};  // the same block ids in all three
  std::vector<float> q;
  std::vector<int32_t> table;

  Pools(KvDtype dtype, int32_t rows) {
    f32 = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock}, 8);
    typed = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, dtype}, 16);
    decoded = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock}, 8);
    std::vector<int32_t> spare;
    f32->Allocate(2, &spare);  // a table that is not the identity
    EXPECT_TRUE(kv.Reserve(*f32, kSlots));
    f32->Free(spare);
    kv.AppendSlots(0, kSlots);
    table.assign(kv.block_table(0).begin(), kv.block_table(0).end());
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> row(kDim), back(kDim);
    for (int32_t s = 0; s < kSlots; ++s) {
      for (int32_t g = 0; g < kKvHeads; ++g) {
        for (bool values : {false, true}) {
          for (float& x : row) x = normal(rng);
          const int32_t block = table[s / kBlock];
          f32->WriteRow(block, g, s % kBlock, values, row.data());
          typed->WriteRow(block, g, s % kBlock, values, row.data());
          typed->ReadRow(block, g, s % kBlock, values, back.data());
          decoded->WriteRow(block, g, s % kBlock, values, back.data());
        }
      }
    }
    q.resize(static_cast<size_t>(rows) * kHeads * kDim);
    for (float& x : q) x = 2.0f * normal(rng);
  }
  ~Pools() { kv.Release(*f32); }
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tolerance,
                const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double{got[i]} - want[i]));
  EXPECT_LE(worst, tolerance) << what;
}

class KvDtypeKernelTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(KvDtypeKernelTest, AttentionDenseSparseAndProbabilities) {
  const KvDtype dtype = GetParam();
  Pools p(dtype, 3);
  ThreadPool threads(2);
  const float scale = 1.0f / 8.0f;
  // A 3-token chunk at the end (causal within it) and, separately, a sparse decode token.
  const std::vector<int32_t> selected = {0, 5, 6, 13, 20};
  auto run = [&](const cache::BlockPool& pool, std::vector<float>* out, std::vector<float>* probs,
                 std::vector<float>* sparse_out) {
    out->assign(3 * kHeads * kDim, 0.0f);
    probs->assign(3 * kHeads * kSlots, 0.0f);
    AttentionSequence seq{p.table.data(), kSlots, 3, 0};
    seq.probs = probs->data();
    PagedAttention(pool.View(), {&seq, 1}, p.q.data(), kHeads, scale, out->data(), threads);
    sparse_out->assign(kHeads * kDim, 0.0f);
    AttentionSequence sparse{p.table.data(), kSlots, 1, 0};
    sparse.selected = selected.data();
    sparse.num_selected = static_cast<int32_t>(selected.size());
    PagedAttention(pool.View(), {&sparse, 1}, p.q.data(), kHeads, scale, sparse_out->data(),
                   threads);
  };
  std::vector<float> want_out, want_probs, want_sparse;
  run(*p.f32, &want_out, &want_probs, &want_sparse);
  std::vector<float> dec_out, dec_probs, dec_sparse;
  run(*p.decoded, &dec_out, &dec_probs, &dec_sparse);
  std::vector<float> got_out, got_probs, got_sparse;
  run(*p.typed, &got_out, &got_probs, &got_sparse);
  EXPECT_EQ(got_out, dec_out);
  EXPECT_EQ(got_probs, dec_probs);
  EXPECT_EQ(got_sparse, dec_sparse);
  ExpectNear(got_out, want_out, Tolerance(dtype), "dense output");
  ExpectNear(got_probs, want_probs, Tolerance(dtype), "probabilities");
  ExpectNear(got_sparse, want_sparse, Tolerance(dtype), "sparse output");
}

TEST_P(KvDtypeKernelTest, ScoringKernels) {
  const KvDtype dtype = GetParam();
  const int32_t rows = 4;
  Pools p(dtype, rows);
  ThreadPool threads(2);
  std::vector<int32_t> visible = {5, 12, 22, 23};
  ScoreInput in{p.table.data(), kSlots, p.q.data(), rows, visible.data(), kHeads, 1.0f / 8.0f};
  auto probs_of = [&](const cache::BlockPool& pool) {
    std::vector<float> probs(kHeads * rows * kSlots);
    AttentionProbabilities(pool.View(), in, probs.data(), nullptr, threads);
    return probs;
  };
  auto columns_of = [&](const cache::BlockPool& pool) {
    std::vector<float> columns(kHeads * kSlots, 0.0f);
    AccumulateAttentionColumns(pool.View(), in, columns.data(), threads);
    return columns;
  };
  EXPECT_EQ(probs_of(*p.typed), probs_of(*p.decoded));
  EXPECT_EQ(columns_of(*p.typed), columns_of(*p.decoded));
  ExpectNear(probs_of(*p.typed), probs_of(*p.f32), Tolerance(dtype), "probabilities");
  // A column sums up to `rows` probabilities.
  ExpectNear(columns_of(*p.typed), columns_of(*p.f32), rows * Tolerance(dtype), "column sums");
}

TEST_P(KvDtypeKernelTest, CompactionCopiesRowsBitForBitAndMergesInFloat) {
  const KvDtype dtype = GetParam();
  Pools p(dtype, 1);
  cache::BlockPool& pool = *p.typed;
  // A sequence of the typed pool gets copies of the blocks written there (ids 0-7 are held so
  // that its blocks, 8 and up, are not the sources).
  std::vector<int32_t> held;
  ASSERT_TRUE(pool.Allocate(8, &held));
  cache::SequenceKv kv(1, kBlock);
  ASSERT_TRUE(kv.Reserve(pool, kSlots));
  kv.AppendSlots(0, kSlots);
  for (int32_t b = 0; b < static_cast<int32_t>(p.table.size()); ++b) {
    ASSERT_TRUE(pool.CopyBlock(p.table[b], kv.block_table(0)[b]).ok());  // bit for bit
  }
  const int64_t row_bytes = pool.layout().row_bytes();
  auto bytes_of = [&](int32_t g, int32_t slot, bool values) {
    const std::byte* row = pool.Row(kv.block_table(0)[slot / kBlock], g, slot % kBlock, values);
    return std::vector<std::byte>(row, row + row_bytes);
  };
  auto floats_of = [&](int32_t g, int32_t slot, bool values) {
    std::vector<float> row(kDim);
    pool.ReadRow(kv.block_table(0)[slot / kBlock], g, slot % kBlock, values, row.data());
    return row;
  };
  for (int32_t s = 0; s < kSlots; ++s) {
    const std::byte* original = p.typed->Row(p.table[s / kBlock], 1, s % kBlock, true);
    EXPECT_EQ(bytes_of(1, s, true), std::vector<std::byte>(original, original + row_bytes));
  }
  // Head 0 keeps {2, 9, 22}; head 1 keeps {0, 1-3 merged, 17}.
  std::vector<std::vector<std::byte>> kept_bytes;
  for (int32_t s : {2, 9, 22}) kept_bytes.push_back(bytes_of(0, s, false));
  std::vector<float> mean(kDim, 0.0f);
  for (int32_t s : {1, 2, 3}) {
    const std::vector<float> row = floats_of(1, s, true);
    for (int32_t d = 0; d < kDim; ++d) mean[d] += row[d];
  }
  for (float& x : mean) x *= 1.0f / 3.0f;
  cache::policies::KeepPlan plan;
  plan.layers.resize(1);
  plan.layers[0].heads = {{2, 9, 22}, {0, 1, 17}};
  plan.layers[0].merge = {{}, {{0}, {1, 2, 3}, {17}}};
  ASSERT_TRUE(cache::ApplyKeepPlan(plan, kv, pool).ok());
  ASSERT_EQ(kv.num_slots(0), 3);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(bytes_of(0, i, false), kept_bytes[i]) << i;
  // The merged row is the mean of the decoded sources, stored in the dtype.
  std::vector<std::byte> want(row_bytes);
  EncodeKv(dtype, mean.data(), kDim, want.data());
  EXPECT_EQ(bytes_of(1, 1, true), want);
  kv.Release(pool);
  pool.Free(held);
  EXPECT_EQ(pool.num_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, KvDtypeKernelTest, ::testing::ValuesIn(kAll), Name);

}  // namespace
}  // namespace winnow::kernels
