// Compaction: kept K/V move bit for bit, merges average, mass merges keep the observed row's
// output, blocks return to the pool exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache {
namespace {

using policies::KeepPlan;
using policies::LayerKeep;

constexpr int32_t kLayers = 3;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 4;
constexpr int32_t kBlock = 4;

// A recognisable value for every (layer, head, slot, dim, K/V).
float Tag(int32_t l, int32_t h, int32_t s, int32_t d, bool v) {
  return l * 10000.0f + h * 1000.0f + s * 10.0f + d + (v ? 0.5f : 0.0f);
}

float* RowOf(BlockPool& pool, const SequenceKv& kv, int32_t l, int32_t h, int32_t s, bool v) {
  const int32_t block = kv.block_table(l)[s / kBlock];
  return (v ? pool.Values(block, h) : pool.Keys(block, h)) + (s % kBlock) * kDim;
}

void Fill(BlockPool& pool, SequenceKv& kv, int32_t slots) {
  ASSERT_TRUE(kv.Reserve(pool, slots));
  for (int32_t l = 0; l < kLayers; ++l) {
    kv.AppendSlots(l, slots);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t s = 0; s < slots; ++s) {
        for (bool v : {false, true}) {
          for (int32_t d = 0; d < kDim; ++d) RowOf(pool, kv, l, h, s, v)[d] = Tag(l, h, s, d, v);
        }
      }
    }
  }
}

TEST(CompactionTest, KeepsExactBytesPerHeadAndFreesBlocksAtOnce) {
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 40);
  SequenceKv kv(kLayers, kBlock);
  Fill(*pool, kv, 18);  // 5 blocks per layer
  ASSERT_EQ(pool->num_used(), 15);

  KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[0].heads = {{0, 3, 7, 17}, {1, 2, 16, 17}};  // per-head sets, 4 slots -> 1 block
  // layer 1 untouched
  // 9 slots -> 3 blocks.
  plan.layers[2].heads = {{0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 2, 4, 6, 8, 10, 12, 14, 16}};
  absl::StatusOr<CompactionStats> stats = ApplyKeepPlan(plan, kv, *pool);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks_freed, 4 + 0 + 2);
  EXPECT_EQ(stats->slots_removed, (18 - 4) + (18 - 9));
  EXPECT_EQ(kv.num_slots(0), 4);
  EXPECT_EQ(kv.num_slots(1), 18);
  EXPECT_EQ(kv.num_slots(2), 9);
  EXPECT_EQ(pool->num_used(), kv.num_blocks_held());
  EXPECT_EQ(pool->num_used(), 1 + 5 + 3);
  for (int32_t l : {0, 2}) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const std::vector<int32_t>& kept = plan.layers[l].heads[h];
      for (size_t i = 0; i < kept.size(); ++i) {
        for (bool v : {false, true}) {
          for (int32_t d = 0; d < kDim; ++d) {
            EXPECT_EQ(RowOf(*pool, kv, l, h, i, v)[d], Tag(l, h, kept[i], d, v));
          }
        }
      }
    }
  }
  for (int32_t s = 0; s < 18; ++s) {
    EXPECT_EQ(RowOf(*pool, kv, 1, 1, s, true)[2], Tag(1, 1, s, 2, true));
  }
  // The compacted sequence can grow again from its new end.
  ASSERT_TRUE(kv.Reserve(*pool, 1));
  EXPECT_EQ(pool->num_used(), kv.num_blocks_held());
  kv.Release(*pool);
  EXPECT_EQ(pool->num_used(), 0);
}

TEST(CompactionTest, MergesAverageTheirSources) {
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 40);
  SequenceKv kv(kLayers, kBlock);
  Fill(*pool, kv, 8);
  KeepPlan plan;
  plan.layers.resize(kLayers);
  for (int32_t l = 0; l < kLayers; ++l) {
    plan.layers[l].heads = {{0, 2, 7}, {0, 2, 7}};
    plan.layers[l].merge = {{{0}, {1, 2, 3, 4, 5, 6}, {7}}, {}};  // head 1: plain selection
  }
  ASSERT_TRUE(ApplyKeepPlan(plan, kv, *pool).ok());
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(kv.num_slots(l), 3);
    for (int32_t d = 0; d < kDim; ++d) {
      EXPECT_EQ(RowOf(*pool, kv, l, 0, 0, false)[d], Tag(l, 0, 0, d, false));
      EXPECT_NEAR(RowOf(*pool, kv, l, 0, 1, true)[d], Tag(l, 0, 3, d, true) + 5.0f, 1e-2);
      EXPECT_EQ(RowOf(*pool, kv, l, 0, 2, false)[d], Tag(l, 0, 7, d, false));
      EXPECT_EQ(RowOf(*pool, kv, l, 1, 1, false)[d], Tag(l, 1, 2, d, false));
    }
  }
  EXPECT_EQ(pool->num_used(), kv.num_blocks_held());
  kv.Release(*pool);
}

TEST(CompactionTest, RejectsMalformedPlansWithoutTouchingTheCache) {
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 40);
  SequenceKv kv(kLayers, kBlock);
  Fill(*pool, kv, 8);
  const int32_t used = pool->num_used();
  auto bad = [&](LayerKeep keep) {
    KeepPlan plan;
    plan.layers.resize(kLayers);
    plan.layers[1] = std::move(keep);
    return ApplyKeepPlan(plan, kv, *pool).status();
  };
  EXPECT_FALSE(bad(LayerKeep{{{0, 1}, {0, 1, 2}}, {}}).ok());   // counts differ
  EXPECT_FALSE(bad(LayerKeep{{{1, 0}, {0, 1}}, {}}).ok());      // not ascending
  EXPECT_FALSE(bad(LayerKeep{{{0, 8}, {0, 1}}, {}}).ok());      // out of range
  EXPECT_FALSE(bad(LayerKeep{{{}, {}}, {}}).ok());              // keeps nothing
  EXPECT_FALSE(bad(LayerKeep{{{0, 1}}, {}}).ok());              // one head missing
  EXPECT_FALSE(bad(LayerKeep{{{0, 5}, {0, 5}}, {{{0, 1}, {5, 4}}, {}}}).ok());  // bad merge
  KeepPlan wrong_layers;
  wrong_layers.layers.resize(2);
  EXPECT_FALSE(ApplyKeepPlan(wrong_layers, kv, *pool).ok());
  EXPECT_EQ(pool->num_used(), used);
  for (int32_t l = 0; l < kLayers; ++l) EXPECT_EQ(kv.num_slots(l), 8);
  kv.Release(*pool);
}

// A layer that returned the blocks behind its sliding window cannot be compacted (those slots
// are gone); the plan is refused before any layer moves.
TEST(CompactionTest, RefusesALayerThatDroppedBlocksBehindItsWindow) {
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 40);
  SequenceKv kv(kLayers, kBlock);
  Fill(*pool, kv, 12);
  kv.DropBlocksBefore(*pool, 2, 8);
  const int32_t used = pool->num_used();
  KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[0] = LayerKeep{{{0, 11}, {1, 11}}, {}};
  plan.layers[2] = LayerKeep{{{8, 11}, {9, 11}}, {}};
  const absl::Status refused = ApplyKeepPlan(plan, kv, *pool).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(pool->num_used(), used);
  EXPECT_EQ(kv.num_slots(0), 12);
  EXPECT_EQ(RowOf(*pool, kv, 0, 0, 1, false)[0], Tag(0, 0, 1, 0, false));
  kv.Release(*pool);
}

TEST(CompactionTest, SlidingLayersKeepOnlyWhatTheirNextTokenReads) {
  policies::ModelDims dims{kLayers, kKvHeads, kKvHeads, kDim, kBlock};
  dims.windows = {0, 5, 9};  // layer 0 global; the next token reads 4 and 8 past slots
  KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[0] = LayerKeep{{{0, 3, 5, 7, 11}, {1, 2, 6, 9, 10}}, {}};
  plan.layers[1] = LayerKeep{{{0, 3, 5, 7, 11}, {1, 2, 6, 9, 10}},
                             {{{0}, {1, 2, 3}, {4, 5}, {7}, {11}}, {}}};
  plan.layers[2] = LayerKeep{{{0, 3, 5, 7, 11}, {1, 2, 6, 9, 10}}, {}};
  const KeepPlan before = plan;
  KeepSlidingWindows(plan, dims, [](int32_t) { return 12; });
  EXPECT_EQ(plan.layers[0].heads, before.layers[0].heads);  // full attention: the policy's
  // Five kept >= the four its next token reads: the last four slots, the merges gone.
  EXPECT_EQ(plan.layers[1].heads, (std::vector<std::vector<int32_t>>{{8, 9, 10, 11},
                                                                     {8, 9, 10, 11}}));
  EXPECT_TRUE(plan.layers[1].merge.empty());
  // Five < eight: the newest five in every head, whatever the picks.
  EXPECT_EQ(plan.layers[2].heads, (std::vector<std::vector<int32_t>>{{7, 8, 9, 10, 11},
                                                                     {7, 8, 9, 10, 11}}));
  EXPECT_TRUE(plan.Validate(dims, [](int32_t) { return 12; }).ok());
  // Layer 2's next token sees all of 8 slots: the plan stands, merges too.
  LayerKeep short_layer{{{0, 3, 7}, {1, 2, 7}}, {{{0, 1}, {2, 3}, {7}}, {}}};
  const LayerKeep short_before = short_layer;
  KeepSlidingWindow(short_layer, 8, dims.WindowOf(2));
  EXPECT_EQ(short_layer.heads, short_before.heads);
  EXPECT_EQ(short_layer.merge, short_before.merge);
  KeepPlan untouched;
  untouched.layers.resize(kLayers);
  KeepSlidingWindows(untouched, dims, [](int32_t) { return 12; });
  EXPECT_TRUE(untouched.empty());
}

// KeepKV's merge keeps what the observed row reads: with that row's attention as the masses,
// the row attends to the compacted cache as it did to the whole one (the same output), the
// biases already there included, and the slots past the new end start at bias 0 again.
TEST(CompactionTest, MassMergeKeepsTheObservedRowsOutput) {
  constexpr int32_t kHeads = 2, kD = 8, kSlots = 18;
  const KvLayout layout{1, kHeads, kD, kBlock, kernels::KvDtype::kF32, /*logit_bias=*/true};
  auto pool = *BlockPool::Create(layout, 12);
  SequenceKv kv(1, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool, kSlots));
  kv.AppendSlots(0, kSlots);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bias = [&](int32_t h, int32_t s) -> float& {
    return pool->Bias(kv.block_table(0)[s / kBlock], h)[s % kBlock];
  };
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t s = 0; s < kSlots; ++s) {
      for (int32_t d = 0; d < kD; ++d) {
        pool->Keys(kv.block_table(0)[s / kBlock], h)[(s % kBlock) * kD + d] = normal(rng);
        pool->Values(kv.block_table(0)[s / kBlock], h)[(s % kBlock) * kD + d] = normal(rng);
      }
      bias(h, s) = 0.1f * normal(rng);  // earlier merges
    }
  }
  std::vector<float> q(kHeads * kD);
  for (float& x : q) x = 0.5f * normal(rng);
  kernels::ThreadPool threads(1);
  const float scale = 1.0f / std::sqrt(float{kD});
  // The row of the last slot, reading all of them: its output and its attention.
  auto attend = [&](int32_t slots, float* probs) {
    std::vector<float> out(kHeads * kD);
    kernels::AttentionSequence seq{kv.block_table(0).data(), slots, 1, 0};
    seq.probs = probs;
    kernels::PagedAttention(pool->View(), {&seq, 1}, q.data(), kHeads, scale, out.data(),
                            threads);
    return out;
  };
  std::vector<float> probs(kHeads * kSlots, 0.0f);
  const std::vector<float> full = attend(kSlots, probs.data());

  KeepPlan plan;
  plan.layers.resize(1);
  LayerKeep& keep = plan.layers[0];
  keep.heads = {{0, 1, 5, 9, 12, 16, 17}, {0, 2, 6, 7, 13, 16, 17}};
  for (int32_t h = 0; h < kHeads; ++h) {
    keep.mass.emplace_back(probs.begin() + h * kSlots, probs.begin() + (h + 1) * kSlots);
  }
  keep.absorb_begin = 1;  // the sink and the window (16, 17) keep their own values
  keep.absorb_end = 16;
  const float sink_bias = bias(0, 0);
  ASSERT_TRUE(ApplyKeepPlan(plan, kv, *pool).ok());
  ASSERT_EQ(kv.num_slots(0), 7);
  EXPECT_EQ(bias(0, 0), sink_bias);
  EXPECT_EQ(bias(0, 7), 0.0f);  // past the new end of the last block
  EXPECT_EQ(bias(1, 7), 0.0f);
  std::vector<float> kept_probs(kHeads * 7, 0.0f);
  const std::vector<float> merged = attend(7, kept_probs.data());
  for (int32_t i = 0; i < kHeads * kD; ++i) EXPECT_NEAR(merged[i], full[i], 1e-5) << i;
  // The slots that absorbed nothing keep their own attention (the total is preserved).
  for (int32_t h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(kept_probs[h * 7 + 6], probs[h * kSlots + 17], 1e-6);
    EXPECT_NEAR(kept_probs[h * 7], probs[h * kSlots], 1e-6);
  }
}

TEST(CompactionTest, MassMergeNeedsAPoolWithLogitBiasesAndWellFormedMasses) {
  auto pool = *BlockPool::Create(KvLayout{kLayers, kKvHeads, kDim, kBlock}, 40);
  SequenceKv kv(kLayers, kBlock);
  Fill(*pool, kv, 8);
  KeepPlan plan;
  plan.layers.resize(kLayers);
  plan.layers[0].heads = {{0, 5}, {0, 5}};
  plan.layers[0].mass.assign(kKvHeads, std::vector<float>(8, 0.1f));
  plan.layers[0].absorb_end = 8;
  EXPECT_EQ(ApplyKeepPlan(plan, kv, *pool).status().code(),
            absl::StatusCode::kFailedPrecondition);
  plan.layers[0].mass[1].resize(7);
  EXPECT_EQ(ApplyKeepPlan(plan, kv, *pool).status().code(), absl::StatusCode::kInvalidArgument);
  plan.layers[0].mass[1].assign(8, -1.0f);
  EXPECT_EQ(ApplyKeepPlan(plan, kv, *pool).status().code(), absl::StatusCode::kInvalidArgument);
  plan.layers[0].mass[1].assign(8, 0.1f);
  plan.layers[0].absorb_end = 9;
  EXPECT_EQ(ApplyKeepPlan(plan, kv, *pool).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.num_slots(0), 8);
}

}  // namespace
}  // namespace winnow::cache
