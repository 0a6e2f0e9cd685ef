#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace winnow::cache {
namespace {

TEST(PrefixBlockKeysTest, EqualPrefixesEqualKeysThenTheyDiverge) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> b = a;
  b[5] = 99;  // second block differs
  const auto ka = PrefixBlockKeys(a, {}, 0, 4, "");
  const auto kb = PrefixBlockKeys(b, {}, 0, 4, "");
  ASSERT_EQ(ka.size(), 2u);  // full blocks only
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  // A later block's key depends on everything before it.
  std::vector<int32_t> c = a;
  c[0] = 42;
  EXPECT_NE(PrefixBlockKeys(c, {}, 0, 4, "")[1], ka[1]);
}

TEST(PrefixBlockKeysTest, SaltsSeparateEqualPrompts) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  EXPECT_NE(PrefixBlockKeys(a, {}, 0, 4, "tenant-a")[0], PrefixBlockKeys(a, {}, 0, 4, "")[0]);
  EXPECT_EQ(PrefixBlockKeys(a, {}, 0, 4, "t")[0], PrefixBlockKeys(a, {}, 0, 4, "t")[0]);
}

TEST(PrefixBlockKeysTest, EmbeddingRowsAreHashedByContent) {
  const std::vector<int32_t> ids = {1, -1, -1, 2};
  std::vector<float> rows = {0.5f, 1.0f, 2.0f, 3.0f};  // 2 rows of hidden 2
  const auto k1 = PrefixBlockKeys(ids, rows, 2, 4, "");
  rows[3] = 3.5f;
  EXPECT_NE(PrefixBlockKeys(ids, rows, 2, 4, "")[0], k1[0]);
}

TEST(PrefixCacheTest, AttachFindsWhatWasPublishedInEveryLayer) {
  const KvLayout layout{2, 1, 4, 4};
  auto pool = *BlockPool::Create(layout, 12);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const auto keys = PrefixBlockKeys(prompt, {}, 0, 4, "");
  SequenceKv first(2, 4);
  ASSERT_TRUE(first.Reserve(*pool, 10));
  for (int l = 0; l < 2; ++l) first.AppendSlots(l, 10);
  EXPECT_EQ(CountCachedBlocks(*pool, keys, 2, 9), 0);
  PublishPrefixBlocks(*pool, keys, 0, 2, first);
  EXPECT_EQ(CountCachedBlocks(*pool, keys, 2, 9), 2);
  EXPECT_EQ(CountCachedBlocks(*pool, keys, 2, 1), 1);  // capped
  EXPECT_EQ(CountFreeCachedBlocks(*pool, keys, 2, 2), 0);

  SequenceKv second(2, 4);
  AttachCachedPrefix(*pool, keys, 2, second);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(second.num_slots(l), 8);
    EXPECT_EQ(second.block_table(l)[1], first.block_table(l)[1]);
  }
  first.Release(*pool);  // the shared blocks stay with `second`
  EXPECT_EQ(pool->num_references(), 4);
  second.Release(*pool);
  // Nobody holds them now, but they stay findable until reclaimed.
  EXPECT_EQ(pool->num_free(), 12);
  EXPECT_EQ(CountCachedBlocks(*pool, keys, 2, 9), 2);
  EXPECT_EQ(CountFreeCachedBlocks(*pool, keys, 2, 2), 4);
}

}  // namespace
}  // namespace winnow::cache
