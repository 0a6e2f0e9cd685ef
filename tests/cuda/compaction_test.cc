// kernels/cuda/compaction.h against the CPU's compaction (cache::ApplyKeepPlan, copies only):
// in place, the whole device arena must equal the CPU's byte for byte (tolerance 0), rows the
// CPU leaves alone included; into fresh blocks, every kept row must equal the CPU's.
#include "kernels/cuda/compaction.h"

#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/sequence_kv.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

using ::winnow::testing::Allocate;
using ::winnow::testing::Download;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;

constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocks = 10;
constexpr int32_t kSlots = 23;

class CompactionTest : public ::winnow::testing::CudaTest,
                       public ::testing::WithParamInterface<KvDtype> {};

std::vector<std::byte> ArenaBytes(const cache::BlockPool& pool) {
  const std::byte* arena = pool.View().arena;
  return std::vector<std::byte>(arena, arena + int64_t{kBlocks} * pool.layout().bytes_per_block());
}

TEST_P(CompactionTest, GathersKeptSlotsLikeTheCpuInPlaceAndIntoFreshBlocks) {
  const KvDtype dtype = GetParam();
  auto pool = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, dtype}, kBlocks);
  ::winnow::testing::FillRandom(*pool, 41);
  std::vector<int32_t> spare;  // blocks 0-2: the fresh destination later
  ASSERT_TRUE(pool->Allocate(3, &spare));
  cache::SequenceKv kv(1, kBlock);
  ASSERT_TRUE(kv.Reserve(*pool, kSlots));
  kv.AppendSlots(0, kSlots);
  const std::vector<int32_t> table(kv.block_table(0).begin(), kv.block_table(0).end());
  const std::vector<std::byte> before = ArenaBytes(*pool);

  // Head 0 keeps a prefix in place (0-2) then moves; head 1 moves every entry.
  const std::vector<std::vector<int32_t>> heads = {{0, 1, 2, 5, 9, 22}, {3, 4, 8, 12, 17, 21}};
  const int32_t kept = static_cast<int32_t>(heads[0].size());
  cache::policies::KeepPlan plan;
  plan.layers.resize(1);
  plan.layers[0].heads = heads;
  ASSERT_TRUE(cache::ApplyKeepPlan(plan, kv, *pool).ok());
  ASSERT_EQ(kv.num_slots(0), kept);
  const std::vector<std::byte> want = ArenaBytes(*pool);

  std::vector<int32_t> flat_slots;
  for (const auto& h : heads) flat_slots.insert(flat_slots.end(), h.begin(), h.end());
  auto d_slots = Upload(flat_slots);
  auto d_table = Upload(table);
  const DevicePagedKv geometry = DevicePagedKvFor(pool->View(), nullptr);
  auto d_scratch = Allocate<std::byte>(CompactionScratchBytes(geometry, kept));

  // In place.
  auto d_arena = Upload(before);
  DevicePagedKv device = DevicePagedKvFor(pool->View(), d_arena.data());
  ASSERT_TRUE(CompactLayer(device, d_table.data(), d_table.data(), d_slots.data(), kept,
                           d_scratch.data(), nullptr)
                  .ok());
  ASSERT_TRUE(Synchronize().ok());
  EXPECT_TRUE(Download(d_arena) == want) << "in-place compaction differs from the CPU's";

  // Into fresh blocks (two of the spares, out of order): entry i lands in slot i of dst.
  const std::vector<int32_t> dst_table = {spare[2], spare[0]};
  auto d_dst_table = Upload(dst_table);
  auto d_fresh = Upload(before);
  device.arena = d_fresh.data();
  ASSERT_TRUE(CompactLayer(device, d_table.data(), d_dst_table.data(), d_slots.data(), kept,
                           d_scratch.data(), nullptr)
                  .ok());
  ASSERT_TRUE(Synchronize().ok());
  const std::vector<std::byte> got = Download(d_fresh);
  const cache::KvLayout& layout = pool->layout();
  auto offset = [&](int32_t block, int32_t h, int32_t slot, bool v) {
    return block * layout.bytes_per_block() +
           (int64_t{v ? kKvHeads : 0} + h) * layout.bytes_per_head_block() +
           slot * layout.row_bytes();
  };
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int32_t i = 0; i < kept; ++i) {
      for (bool v : {false, true}) {
        const int64_t at_got = offset(dst_table[i / kBlock], h, i % kBlock, v);
        const int64_t at_want = offset(table[i / kBlock], h, i % kBlock, v);
        EXPECT_TRUE(std::equal(got.begin() + at_got, got.begin() + at_got + layout.row_bytes(),
                               want.begin() + at_want))
            << "head " << h << " entry " << i << (v ? " V" : " K");
      }
    }
  }
  // The source blocks are read, never written, when the destination is elsewhere.
  for (int32_t block : table) {
    const int64_t at = offset(block, 0, 0, false);
    EXPECT_TRUE(std::equal(got.begin() + at, got.begin() + at + layout.bytes_per_block(),
                           before.begin() + at))
        << "source block " << block << " changed";
  }
  kv.Release(*pool);
  pool->Free(spare);
}

INSTANTIATE_TEST_SUITE_P(DevicePoolDtypes, CompactionTest,
                         ::testing::Values(KvDtype::kF16, KvDtype::kBF16),
                         [](const ::testing::TestParamInfo<KvDtype>& info) {
                           return std::string(KvDtypeName(info.param));
                         });

TEST(CompactionArgumentsTest, KeepingNothingIsAnError) {
  auto pool =
      *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, KvDtype::kBF16}, 1);
  const DevicePagedKv kv = DevicePagedKvFor(pool->View(), reinterpret_cast<std::byte*>(16));
  const absl::Status s = CompactLayer(kv, nullptr, nullptr, nullptr, 0, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kept"), std::string::npos) << s;
}

}  // namespace
}  // namespace winnow::kernels::cuda
