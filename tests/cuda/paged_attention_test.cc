#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

// The CPU kernel reads the same 16-bit K/V and q values and computes in FP32; FlashInfer rounds
// the softmax probabilities to the 16-bit type before P*V and rounds its output. Outputs are
// weighted means of V values in [-1, 1], so each rounding costs at most half an ulp of 1:
// 2^-9 (bf16) or 2^-12 (f16). The tolerance allows about four such roundings.
double Tolerance(KvDtype dtype) { return dtype == KvDtype::kBF16 ? 1e-2 : 2e-3; }

// The log-sum-exps FlashInfer writes (base 2, of logits scaled by scale * log2 e) against the
// CPU's natural log-normalisers times log2 e. FlashInfer's prefill kernel sums each row's
// probabilities on tensor cores after rounding them to the 16-bit type, so its normaliser may be
// off by one rounding, 2^-8 relative for bf16 and 2^-11 for f16 (log2 of 1 + that: 5.6e-3 and
// 7.0e-4), plus FP32 noise. Measured on an H200: up to 1.8e-3 for bf16.
double LseTolerance(KvDtype dtype) { return dtype == KvDtype::kBF16 ? 5.7e-3 : 8e-4; }

// A sequence of the test batch: how many slots each layer holds once the new tokens are in,
// and how many of them are new (query rows).
struct SequenceSpec {
  std::vector<int32_t> slots_per_layer;
  int32_t num_new;
};

struct Geometry {
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  KvDtype dtype;
};

class PagedAttentionTest : public testing::CudaTest {
 protected:
  static constexpr int32_t kLayers = 2;
  static constexpr int32_t kBlockSize = 16;
  static constexpr int32_t kBlocks = 64;

  // Fills a host pool with random K/V for `specs`, runs every layer on the GPU and on the CPU
  // kernel, and compares.
  void CheckAgainstCpu(const Geometry& g, const std::vector<SequenceSpec>& specs) {
    SCOPED_TRACE(::testing::Message() << KvDtypeName(g.dtype) << " heads=" << g.num_heads << "/"
                                      << g.num_kv_heads << " head_dim=" << g.head_dim);
    const cache::KvLayout layout{kLayers, g.num_kv_heads, g.head_dim, kBlockSize, g.dtype};
    auto pool = cache::BlockPool::Create(layout, kBlocks);
    ASSERT_TRUE(pool.ok()) << pool.status();
    PoisonArena(**pool);
    std::mt19937 rng(static_cast<uint32_t>(g.head_dim * 31 + g.num_heads));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<cache::SequenceKv> kv;
    int32_t rows = 0;
    for (const SequenceSpec& spec : specs) {
      kv.emplace_back(kLayers, kBlockSize);
      int32_t most = 0;
      for (int32_t s : spec.slots_per_layer) most = std::max(most, s);
      ASSERT_TRUE(kv.back().Reserve(**pool, most));
      for (int32_t l = 0; l < kLayers; ++l) {
        FillLayer(**pool, kv.back(), l, spec.slots_per_layer[l], rng);
      }
      rows += spec.num_new;
    }

    const int64_t q_values = int64_t{rows} * g.num_heads * g.head_dim;
    std::vector<float> q(q_values);
    for (float& v : q) v = dist(rng);
    std::vector<std::byte> q_bits(KvRowBytes(g.dtype, static_cast<int32_t>(q_values)));
    EncodeKv(g.dtype, q.data(), q_values, q_bits.data());
    DecodeKv(g.dtype, q_bits.data(), q_values, q.data());  // the CPU reads the rounded q

    const PagedKvView view = (*pool)->View();
    auto d_arena = DeviceBuffer<std::byte>::FromHost(
        std::span<const std::byte>(view.arena, int64_t{kBlocks} * view.bytes_per_block));
    auto d_q = DeviceBuffer<std::byte>::FromHost(q_bits);
    auto d_out = DeviceBuffer<std::byte>::Allocate(static_cast<int64_t>(q_bits.size()));
    auto d_lse = DeviceBuffer<float>::Allocate(int64_t{rows} * g.num_heads);
    ASSERT_TRUE(d_arena.ok() && d_q.ok() && d_out.ok() && d_lse.ok());
    auto attention = PagedAttention::Create(
        {g.num_heads, g.num_kv_heads, g.head_dim, kBlockSize, g.dtype, kBlocks});
    ASSERT_TRUE(attention.ok()) << attention.status();

    const float scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
    ThreadPool threads(1);
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE(::testing::Message() << "layer " << l);
      std::vector<AttentionSequence> batch;
      int32_t row = 0;
      for (size_t i = 0; i < specs.size(); ++i) {
        batch.push_back({kv[i].block_table(l).data(), kv[i].num_slots(l), specs[i].num_new, row});
        row += specs[i].num_new;
      }
      std::vector<float> expected(q_values);
      kernels::PagedAttention(view, batch, q.data(), g.num_heads, scale, expected.data(),
                              threads);  // the CPU kernel

      ASSERT_TRUE((*attention)->Run(d_arena->data(), batch, d_q->data(), scale, d_out->data(),
                                    /*stream=*/nullptr, d_lse->data()).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<std::byte> out_bits(q_bits.size());
      ASSERT_TRUE(d_out->CopyToHost(std::span<std::byte>(out_bits)).ok());
      std::vector<float> actual(q_values);
      DecodeKv(g.dtype, out_bits.data(), q_values, actual.data());
      const double tol = Tolerance(g.dtype);
      for (int64_t i = 0; i < q_values; ++i) {
        ASSERT_NEAR(actual[i], expected[i], tol * (1.0 + std::fabs(expected[i])))
            << "row " << i / (int64_t{g.num_heads} * g.head_dim) << " head "
            << i / g.head_dim % g.num_heads << " dim " << i % g.head_dim;
      }
      ExpectLogSumExps(view, batch, q, g.num_heads, scale, *d_lse, LseTolerance(g.dtype),
                       threads);
    }
    for (cache::SequenceKv& s : kv) s.Release(**pool);
  }

  // Each row's log-sum-exp from Run's `lse` against the CPU's log-normaliser of the same row.
  static void ExpectLogSumExps(const PagedKvView& view,
                               const std::vector<AttentionSequence>& batch,
                               const std::vector<float>& q, int32_t num_heads, float scale,
                               DeviceBuffer<float>& d_lse, double tolerance,
                               ThreadPool& threads) {
    std::vector<float> lse(d_lse.size());
    ASSERT_TRUE(d_lse.CopyToHost(std::span<float>(lse)).ok());
    const int32_t head_dim = view.head_dim;
    for (const AttentionSequence& s : batch) {
      std::vector<int32_t> visible(s.num_new);
      for (int32_t r = 0; r < s.num_new; ++r) visible[r] = s.num_slots - s.num_new + r + 1;
      const ScoreInput in{s.block_table, s.num_slots,
                          q.data() + int64_t{s.first_row} * num_heads * head_dim,
                          s.num_new,     visible.data(), num_heads, scale};
      std::vector<float> probs(int64_t{num_heads} * s.num_new * s.num_slots);
      std::vector<float> natural(int64_t{num_heads} * s.num_new);
      kernels::AttentionProbabilities(view, in, probs.data(), natural.data(), threads);
      for (int32_t r = 0; r < s.num_new; ++r) {
        for (int32_t h = 0; h < num_heads; ++h) {
          ASSERT_NEAR(lse[(int64_t{s.first_row} + r) * num_heads + h],
                      natural[int64_t{h} * s.num_new + r] * 1.4426950408889634, tolerance)
              << "row " << s.first_row + r << " head " << h;
        }
      }
    }
  }

  // Sets every row to all-ones bits, a NaN in f16 and bf16: slots past a sequence's length
  // (the rest of its last block) must never reach the output.
  static void PoisonArena(cache::BlockPool& pool) {
    const cache::KvLayout& layout = pool.layout();
    for (int32_t b = 0; b < pool.num_blocks(); ++b) {
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        for (int32_t slot = 0; slot < layout.block_size; ++slot) {
          for (bool values : {false, true}) {
            std::memset(pool.Row(b, h, slot, values), 0xFF, layout.row_bytes());
          }
        }
      }
    }
  }

  // Writes random K and V rows into the first `slots` slots of `layer`.
  static void FillLayer(cache::BlockPool& pool, cache::SequenceKv& kv, int32_t layer,
                        int32_t slots, std::mt19937& rng) {
    const cache::KvLayout& layout = pool.layout();
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> row(layout.head_dim);
    for (int32_t slot = 0; slot < slots; ++slot) {
      const int32_t block = kv.block_table(layer)[slot / layout.block_size];
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        for (bool values : {false, true}) {
          for (float& v : row) v = dist(rng);
          pool.WriteRow(block, h, slot % layout.block_size, values, row.data());
        }
      }
    }
    kv.AppendSlots(layer, slots);
  }
};

// Decode tokens first (the decode kernel), then a prefill chunk after a cached prefix and a
// whole prompt (the prefill kernel); layer 1 keeps fewer slots than layer 0 for some sequences,
// as after compression. Lengths cross block boundaries and end mid-block.
const std::vector<SequenceSpec> kMixedBatch = {
    {{37, 21}, 1}, {{16, 16}, 1}, {{50, 33}, 20}, {{9, 9}, 9}};

TEST_F(PagedAttentionTest, MixedBatchMatchesCpuForEachDtypeAndHeadDim) {
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBF16}) {
    for (int32_t head_dim : {64, 128}) {
      CheckAgainstCpu({/*num_heads=*/6, /*num_kv_heads=*/2, head_dim, dtype}, kMixedBatch);
    }
  }
}

TEST_F(PagedAttentionTest, DecodeOnlyAndPrefillFirstBatchesMatchCpu) {
  const Geometry g{/*num_heads=*/8, /*num_kv_heads=*/2, /*head_dim=*/64, KvDtype::kBF16};
  CheckAgainstCpu(g, {{{1, 1}, 1}, {{70, 40}, 1}, {{130, 17}, 1}});
  // A prefill chunk first: every sequence goes through the prefill kernel.
  CheckAgainstCpu(g, {{{24, 24}, 24}, {{37, 21}, 1}, {{5, 3}, 1}});
}

TEST_F(PagedAttentionTest, GroupSizeWithoutDecodeKernelUsesPrefill) {
  // 5 query heads per KV head: FlashInfer's decode kernel has no such instantiation.
  CheckAgainstCpu({/*num_heads=*/10, /*num_kv_heads=*/2, /*head_dim=*/64, KvDtype::kF16},
                  kMixedBatch);
}

TEST_F(PagedAttentionTest, RejectsBadConfigAndSequencesNamingTheField) {
  PagedAttentionConfig config{6, 2, 96, kBlockSize, KvDtype::kF16, kBlocks};
  EXPECT_NE(PagedAttention::Create(config).status().message().find("head_dim 96"),
            std::string::npos);
  config.head_dim = 64;
  config.dtype = KvDtype::kQ8_0;
  EXPECT_NE(PagedAttention::Create(config).status().message().find("kv dtype q8_0"),
            std::string::npos);
  config.dtype = KvDtype::kF16;
  auto attention = PagedAttention::Create(config);
  ASSERT_TRUE(attention.ok()) << attention.status();

  const int32_t table[2] = {0, kBlocks};
  int dummy = 0;
  const auto message = [&](std::vector<AttentionSequence> batch) {
    return std::string(
        (*attention)->Run(&dummy, batch, &dummy, 1.0f, &dummy, nullptr).message());
  };
  EXPECT_NE(message({{table, 4, 1, 0}, {table, 3, 2, 0}}).find("sequence 1: first_row 0 must be 1"),
            std::string::npos);
  EXPECT_NE(message({{table, 20, 1, 0}}).find("block_table[1] = 64 is not in [0, 64)"),
            std::string::npos);
  EXPECT_NE(message({{table, 3, 4, 0}}).find("num_new (4)"), std::string::npos);
}

}  // namespace
}  // namespace winnow::kernels::cuda
