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
  const int64_t head_block = SmallLayout().bytes_per_head_block();
  EXPECT_EQ(head_block, 4 * 4 * 4);  // 4 slots x head_dim 4 x float32
  EXPECT_EQ(p.Row(0, 0, 0, true) - p.Row(0, 0, 0, false), 2 * head_block);
  EXPECT_EQ(p.Row(0, 1, 0, false) - p.Row(0, 0, 0, false), head_block);
  EXPECT_EQ(p.Row(0, 0, 1, false) - p.Row(0, 0, 0, false), 4 * 4);
  EXPECT_EQ(p.Row(1, 0, 0, false) - p.Row(0, 0, 0, false), SmallLayout().bytes_per_block());
  EXPECT_EQ(reinterpret_cast<std::byte*>(p.Values(1, 1)), p.Row(1, 1, 0, true));
}

TEST(BlockPoolTest, LogitBiasesFollowTheRowsAndStartAtZero) {
  KvLayout layout = SmallLayout();
  layout.logit_bias = true;
  EXPECT_EQ(layout.bytes_per_block(), SmallLayout().bytes_per_block() + 2 * 4 * 4);
  auto pool = *BlockPool::Create(layout, 1);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(1, &blocks));
  float* bias = pool->Bias(blocks[0], 1);
  // After the last V row; head 1's four floats after head 0's.
  EXPECT_EQ(reinterpret_cast<std::byte*>(bias),
            pool->Row(blocks[0], 1, 3, /*values=*/true) + layout.row_bytes() + 4 * 4);
  bias[2] = 1.5f;
  EXPECT_EQ(pool->View().Bias(blocks[0], 1)[2], 1.5f);
  pool->Free(blocks);
  blocks.clear();
  ASSERT_TRUE(pool->Allocate(1, &blocks));  // the same block, handed out again: zeroed
  EXPECT_EQ(pool->Bias(blocks[0], 1)[2], 0.0f);
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

TEST(SequenceKvTest, DropBlocksBeforeReturnsWholeBlocksAndKeepsSlotIndices) {
  auto pool = BlockPool::Create(SmallLayout(), 16);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3, 4);
  ASSERT_TRUE(kv.Reserve(**pool, 15));  // 4 blocks per layer
  for (int l = 0; l < 3; ++l) kv.AppendSlots(l, 15);
  const int32_t last_block = kv.block_table(1)[3];
  kv.DropBlocksBefore(**pool, 1, 11);  // slots 0..7 are behind: blocks 0 and 1 go
  EXPECT_EQ(kv.num_dropped(1), 2);
  EXPECT_EQ(kv.block_table(1)[0], kDroppedBlock);
  EXPECT_EQ(kv.block_table(1)[1], kDroppedBlock);
  EXPECT_EQ(kv.block_table(1)[3], last_block);  // slot 14 still at block_table[14 / 4]
  EXPECT_EQ(kv.num_slots(1), 15);
  EXPECT_EQ(kv.num_blocks_held(), 10);
  EXPECT_EQ((*pool)->num_free(), 6);
  kv.DropBlocksBefore(**pool, 1, 5);    // behind what was dropped: nothing
  kv.DropBlocksBefore(**pool, 1, 100);  // never the block the last slot is in
  EXPECT_EQ(kv.num_dropped(1), 3);
  EXPECT_EQ(kv.BlocksNeeded(1), 0);     // the table still counts 16 slots of capacity
  ASSERT_TRUE(kv.Reserve(**pool, 2));   // one more block per layer
  EXPECT_EQ(kv.num_blocks_held(), 12);
  EXPECT_EQ(kv.BlocksFreedByRelease(**pool), 12);
  kv.Release(**pool);
  EXPECT_EQ((*pool)->num_free(), 16);
  EXPECT_EQ((*pool)->num_references(), 0);
}

// ---------------------------------------------------------------------------------------------
// Reference counts and the content index (prefix caching).

TEST(BlockPoolTest, SharedBlockReturnsToTheFreeQueueWithItsLastReference) {
  auto pool = *BlockPool::Create(SmallLayout(), 4);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(1, &blocks));
  pool->AddReference(blocks[0]);
  EXPECT_EQ(pool->references(blocks[0]), 2);
  EXPECT_EQ(pool->num_references(), 2);
  pool->Free(blocks);
  EXPECT_EQ(pool->num_free(), 3);  // still referenced once
  pool->Free(blocks);
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_EQ(pool->num_references(), 0);
}

TEST(BlockPoolTest, CachedFreeBlocksStayFindableAndAreReclaimedLast) {
  auto pool = *BlockPool::Create(SmallLayout(), 3);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool->Allocate(2, &a));
  pool->SetKey(a[0], 111);
  pool->SetKey(a[1], 222);
  pool->Free(a);  // both cached and free: 3 free, 2 of them cached
  EXPECT_EQ(pool->num_free(), 3);
  EXPECT_EQ(pool->num_cached_free(), 2);
  EXPECT_EQ(pool->FindCached(111), a[0]);

  // The never-cached block goes first; then the least recently freed cached one (a[0]).
  ASSERT_TRUE(pool->Allocate(1, &b));
  EXPECT_NE(b[0], a[0]);
  EXPECT_NE(b[0], a[1]);
  EXPECT_EQ(pool->FindCached(111), a[0]);
  ASSERT_TRUE(pool->Allocate(1, &b));
  EXPECT_EQ(b[1], a[0]);
  EXPECT_EQ(pool->FindCached(111), -1);  // reclaimed: its key is forgotten
  EXPECT_EQ(pool->FindCached(222), a[1]);
  EXPECT_EQ(pool->num_cached_free(), 1);

  // Reusing a cached free block takes it off the free queue.
  pool->AddReference(a[1]);
  EXPECT_EQ(pool->num_free(), 0);
  EXPECT_FALSE(pool->Allocate(1, &b));
  pool->Free({&a[1], 1});
  pool->Free(b);
  EXPECT_EQ(pool->num_free(), 3);
}

TEST(BlockPoolTest, AKeyStaysWithTheFirstBlockThatHeldIt) {
  auto pool = *BlockPool::Create(SmallLayout(), 2);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(2, &blocks));
  pool->SetKey(blocks[0], 5);
  pool->SetKey(blocks[1], 5);  // computed the same prefix concurrently
  EXPECT_EQ(pool->FindCached(5), blocks[0]);
  EXPECT_FALSE(pool->has_key(blocks[1]));
  pool->ClearKey(blocks[0]);
  EXPECT_EQ(pool->FindCached(5), -1);
  pool->Free(blocks);
}

TEST(SequenceKvTest, MakePrivateCopiesSharedBlocksAndLeavesTheOriginalIntact) {
  auto pool = *BlockPool::Create(SmallLayout(), 8);
  SequenceKv owner(3, 4), sharer(3, 4);
  ASSERT_TRUE(owner.Reserve(*pool, 4));
  for (int l = 0; l < 3; ++l) {
    owner.AppendSlots(l, 4);
    pool->Keys(owner.block_table(l)[0], 0)[0] = 10.0f + l;
    pool->SetKey(owner.block_table(l)[0], 100 + l);
    sharer.AppendSharedBlock(*pool, l, owner.block_table(l)[0]);
  }
  EXPECT_EQ(sharer.SharedBlocks(*pool), 3);
  EXPECT_EQ(sharer.BlocksFreedByRelease(*pool), 0);
  ASSERT_TRUE(sharer.MakePrivate(*pool).ok());
  for (int l = 0; l < 3; ++l) {
    const int32_t mine = sharer.block_table(l)[0];
    EXPECT_NE(mine, owner.block_table(l)[0]);
    EXPECT_EQ(pool->Keys(mine, 0)[0], 10.0f + l);
    pool->Keys(mine, 0)[0] = -1.0f;  // compaction writes here...
    EXPECT_EQ(pool->Keys(owner.block_table(l)[0], 0)[0], 10.0f + l);  // ...not there
    EXPECT_EQ(pool->FindCached(100 + l), owner.block_table(l)[0]);
  }
  EXPECT_EQ(sharer.SharedBlocks(*pool), 0);
  // Blocks it owns alone lose their key instead: their contents are about to change.
  ASSERT_TRUE(owner.MakePrivate(*pool).ok());
  EXPECT_EQ(pool->FindCached(100), -1);
  owner.Release(*pool);
  sharer.Release(*pool);
  EXPECT_EQ(pool->num_free(), 8);
  EXPECT_EQ(pool->num_references(), 0);
}

}  // namespace
}  // namespace winnow::cache
