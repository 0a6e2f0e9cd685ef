#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include "cache/sequence_kv.h"

namespace winnow::cache {
namespace {

KvLayout SmallLayout() { return KvLayout{.num_layers = 3, .num_kv_heads = 2, .head_dim = 4, .block_size = 4}; }

TEST(BlockPoolTest, AllocateAndFreeKeepExactCounts) {
  auto pool = BlockPool::Create(SmallLayout(), 10);
  ASSERT_TRUE(pool.ok());
  std::vector<int32_t> blocks;
  EXPECT_TRUE((*pool)->Allocate(7, &blocks));
  EXPECT_EQ((*pool)->num_free(), 3);
  EXPECT_FALSE((*pool)->Allocate(4, &blocks));  // all or nothing
  EXPECT_EQ(blocks.size(), 7u);
  EXPECT_EQ((*pool)->num_free(), 3);
  (*pool)->Free(blocks);
  EXPECT_EQ((*pool)->num_free(), 10);
}

TEST(BlockPoolTest, KeysAndValuesOfBlocksDoNotOverlap) {
  auto pool = BlockPool::Create(SmallLayout(), 2);
  ASSERT_TRUE(pool.ok());
  BlockPool& p = **pool;
  const int64_t head_block = SmallLayout().floats_per_head_block();
  EXPECT_EQ(p.Values(0, 0) - p.Keys(0, 0), 2 * head_block);
  EXPECT_EQ(p.Keys(0, 1) - p.Keys(0, 0), head_block);
  EXPECT_EQ(p.Keys(1, 0) - p.Keys(0, 0), SmallLayout().floats_per_block());
}

TEST(BlockPoolTest, RejectsEmptyPool) { EXPECT_FALSE(BlockPool::Create(SmallLayout(), 0).ok()); }

TEST(BlockPoolDeathTest, DoubleFreeAborts) {
  auto pool = BlockPool::Create(SmallLayout(), 2);
  ASSERT_TRUE(pool.ok());
  std::vector<int32_t> blocks;
  ASSERT_TRUE((*pool)->Allocate(1, &blocks));
  (*pool)->Free(blocks);
  EXPECT_DEATH((*pool)->Free(blocks), "freed twice");
}

TEST(SequenceKvTest, ReserveGrowsEveryLayerAllOrNothing) {
  auto pool = BlockPool::Create(SmallLayout(), 7);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3, 4);
  EXPECT_EQ(kv.BlocksNeeded(5), 6);  // 2 blocks per layer
  ASSERT_TRUE(kv.Reserve(**pool, 5));
  EXPECT_EQ((*pool)->num_free(), 1);
  for (int l = 0; l < 3; ++l) kv.AppendSlots(l, 5);
  EXPECT_EQ(kv.BlocksNeeded(3), 0);    // slots 5..7 fit in the second block
  EXPECT_EQ(kv.BlocksNeeded(4), 3);    // slot 8 needs a third block in each layer
  EXPECT_FALSE(kv.Reserve(**pool, 4));  // only 1 free: nothing taken
  EXPECT_EQ((*pool)->num_free(), 1);
  EXPECT_EQ(kv.num_blocks_held(), 6);
  kv.Release(**pool);
  EXPECT_EQ((*pool)->num_free(), 7);
  EXPECT_EQ(kv.num_blocks_held(), 0);
}

TEST(SequenceKvTest, TrimUnusedReturnsReservationBeyondFilledSlots) {
  auto pool = BlockPool::Create(SmallLayout(), 12);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3, 4);
  ASSERT_TRUE(kv.Reserve(**pool, 12));  // 3 blocks per layer
  for (int l = 0; l < 3; ++l) kv.AppendSlots(l, 4);
  kv.TrimUnused(**pool);
  EXPECT_EQ(kv.num_blocks_held(), 3);
  EXPECT_EQ((*pool)->num_free(), 9);
  kv.Release(**pool);
}

}  // namespace
}  // namespace winnow::cache
