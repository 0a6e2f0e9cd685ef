#include "cache/compressed_prefix.h"

#include <gtest/gtest.h>

#include <vector>

#include "cache/keep_plan.h"

namespace winnow::cache {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kHeadDim = 4;

// A compressed context as a publisher holds it: layer 0 keeps 6 of 10 positions (a whole block
// and a partial one), layer 1 keeps 8 (two whole blocks), each row's values naming its layer,
// slot and K/V.
class CompressedPrefixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = *BlockPool::Create(KvLayout{kLayers, 1, kHeadDim, kBlockSize}, 16);
    positions_ = policies::SlotPositions(kLayers, 1);
    positions_.AppendRange(0, 10);
    policies::KeepPlan plan;
    plan.layers.resize(kLayers);
    plan.layers[0].heads = {{0, 1, 4, 5, 6, 9}};
    plan.layers[1].heads = {{0, 1, 2, 3, 5, 6, 7, 9}};
    positions_.Apply(plan);
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t slots = positions_.num_slots(l);
      ASSERT_TRUE(ReserveLayer(l, slots));
      publisher_.AppendSlots(l, slots);
      for (int32_t j = 0; j < slots; ++j) WriteSlot(publisher_, l, j, RowValue(l, j));
    }
  }
  void TearDown() override {
    publisher_.Release(*pool_);
    EXPECT_EQ(pool_->num_references(), 0);
  }

  bool ReserveLayer(int32_t layer, int32_t slots) {
    // Reserve grows every layer alike; this fixture's layers differ, so append by hand.
    std::vector<int32_t> blocks;
    if (!pool_->Allocate((slots + kBlockSize - 1) / kBlockSize, &blocks)) return false;
    publisher_.ReplaceLayer(layer, blocks, 0);
    return true;
  }
  static float RowValue(int32_t layer, int32_t slot) { return 100.0f * layer + slot; }
  void WriteSlot(const SequenceKv& kv, int32_t layer, int32_t slot, float value) {
    const std::vector<float> row(kHeadDim, value);
    const int32_t block = kv.block_table(layer)[slot / kBlockSize];
    pool_->WriteRow(block, 0, slot % kBlockSize, false, row.data());
    pool_->WriteRow(block, 0, slot % kBlockSize, true, row.data());
  }
  float ReadSlot(const SequenceKv& kv, int32_t layer, int32_t slot) const {
    std::vector<float> row(kHeadDim);
    pool_->ReadRow(kv.block_table(layer)[slot / kBlockSize], 0, slot % kBlockSize, true,
                   row.data());
    return row[0];
  }
  uint64_t Key(std::string_view salt = "") const {
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    return CompressedPrefixCache::Key(tokens, {}, 0, salt, "snapkv|0.5");
  }

  std::unique_ptr<BlockPool> pool_;
  policies::SlotPositions positions_;
  SequenceKv publisher_{kLayers, kBlockSize};
};

TEST(CompressedContextKeyTest, EverythingThatDecidesThePlanIsInTheKey) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const uint64_t key = CompressedPrefixCache::Key(tokens, {}, 0, "", "snapkv|0.1");
  EXPECT_EQ(CompressedPrefixCache::Key(tokens, {}, 0, "", "snapkv|0.1"), key);
  EXPECT_NE(CompressedPrefixCache::Key(tokens, {}, 0, "tenant", "snapkv|0.1"), key);
  EXPECT_NE(CompressedPrefixCache::Key(tokens, {}, 0, "", "snapkv|0.2"), key);
  const std::vector<int32_t> other = {1, 2, 3, 5};
  EXPECT_NE(CompressedPrefixCache::Key(other, {}, 0, "", "snapkv|0.1"), key);
  const std::vector<int32_t> with_rows = {1, -1};
  std::vector<float> rows = {0.5f, 1.5f};
  const uint64_t embedded = CompressedPrefixCache::Key(with_rows, rows, 2, "", "p");
  rows[1] = -1.5f;
  EXPECT_NE(CompressedPrefixCache::Key(with_rows, rows, 2, "", "p"), embedded);
}

TEST_F(CompressedPrefixTest, AnAttachedContextHoldsThePublishersKvAndWritesItsOwnTail) {
  CompressedPrefixCache cache(*pool_);
  EXPECT_EQ(cache.PublishBlocks(std::vector<int32_t>{6, 8}), 1);  // layer 0's partial block
  ASSERT_TRUE(*cache.Publish(Key(), 10, positions_, publisher_));
  EXPECT_EQ(publisher_.num_blocks_held(), 4 + 1);  // its tables and the pinned copy
  EXPECT_EQ(cache.resident(), 1);
  EXPECT_EQ(cache.Find(Key("other tenant")), nullptr);

  const CompressedContext* context = cache.Find(Key());
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->num_tokens, 10);
  EXPECT_EQ(context->slots, (std::vector<int32_t>{6, 8}));
  EXPECT_EQ(cache.KvBytes(*context), 14 * 2 * kHeadDim * 4);
  // The publisher holds every whole block: attaching takes only the copy of layer 0's tail.
  EXPECT_EQ(cache.BlocksToAttach(*context), 1);
  EXPECT_EQ(cache.BlocksForSuffix(*context, 3), 1 + 1);  // layer 0: 6+3 -> 3 blocks; 1: 11 -> 3

  SequenceKv attacher(kLayers, kBlockSize);
  ASSERT_TRUE(cache.Attach(*context, attacher).ok());
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(attacher.num_slots(l), publisher_.num_slots(l));
    for (int32_t j = 0; j < attacher.num_slots(l); ++j) {
      EXPECT_EQ(ReadSlot(attacher, l, j), RowValue(l, j)) << "layer " << l << " slot " << j;
    }
    EXPECT_EQ(attacher.block_table(l)[0], publisher_.block_table(l)[0]);  // shared
  }
  EXPECT_NE(attacher.block_table(0)[1], publisher_.block_table(0)[1]);  // the tail: a copy

  // Both append their own suffix; neither the other nor the published context sees it.
  ASSERT_TRUE(attacher.Reserve(*pool_, 1));
  for (int32_t l = 0; l < kLayers; ++l) attacher.AppendSlots(l, 1);
  ASSERT_TRUE(publisher_.Reserve(*pool_, 1));
  for (int32_t l = 0; l < kLayers; ++l) publisher_.AppendSlots(l, 1);
  WriteSlot(attacher, 0, 6, -1.0f);
  WriteSlot(publisher_, 0, 6, -2.0f);
  EXPECT_EQ(ReadSlot(attacher, 0, 6), -1.0f);
  EXPECT_EQ(ReadSlot(publisher_, 0, 6), -2.0f);
  SequenceKv second(kLayers, kBlockSize);
  ASSERT_TRUE(cache.Attach(*cache.Find(Key()), second).ok());
  EXPECT_EQ(second.num_slots(0), 6);
  EXPECT_EQ(ReadSlot(second, 0, 5), RowValue(0, 5));
  second.Release(*pool_);
  attacher.Release(*pool_);
}

TEST_F(CompressedPrefixTest, AContextStaysUntilOneOfItsBlocksIsReclaimed) {
  CompressedPrefixCache cache(*pool_);
  ASSERT_TRUE(*cache.Publish(Key(), 10, positions_, publisher_));
  EXPECT_FALSE(*cache.Publish(Key(), 10, positions_, publisher_));  // already there
  publisher_.Release(*pool_);
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());  // every block reclaimable
  EXPECT_EQ(cache.resident(), 1);                       // and still found
  // Its 3 whole blocks and the tail leave the free queue; the tail's copy is a fifth.
  EXPECT_EQ(cache.BlocksToAttach(*cache.Find(Key())), 5);

  // Never-cached blocks go first (the publisher's own partial block among them); then the
  // least recently freed of the context's 4.
  EXPECT_EQ(pool_->num_cached_free(), 4);
  std::vector<int32_t> taken;
  ASSERT_TRUE(pool_->Allocate(pool_->num_blocks() - 4, &taken));
  EXPECT_EQ(cache.resident(), 1);
  ASSERT_TRUE(pool_->Allocate(1, &taken));
  EXPECT_EQ(cache.resident(), 0);
  EXPECT_EQ(cache.Find(Key()), nullptr);
  pool_->Free(taken);
}

TEST_F(CompressedPrefixTest, NothingIsPublishedWithoutAFreeBlockForTheTail) {
  CompressedPrefixCache cache(*pool_);
  std::vector<int32_t> taken;
  ASSERT_TRUE(pool_->Allocate(pool_->num_free(), &taken));
  EXPECT_FALSE(*cache.Publish(Key(), 10, positions_, publisher_));
  EXPECT_EQ(cache.resident(), 0);
  EXPECT_EQ(publisher_.num_blocks_held(), 4);
  pool_->Free(taken);
}

TEST_F(CompressedPrefixTest, APublishThatDoesNotMatchTheTrackedSlotsIsRefused) {
  CompressedPrefixCache cache(*pool_);
  policies::SlotPositions other(kLayers, 1);
  other.AppendRange(0, 10);
  EXPECT_FALSE(cache.Publish(Key(), 10, other, publisher_).ok());
  EXPECT_EQ(cache.resident(), 0);
}

}  // namespace
}  // namespace winnow::cache
