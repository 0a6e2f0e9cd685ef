// kernels/cuda/kv_append.h against the CPU forward's K/V store (BlockPool::WriteRow): the whole
// arena must come back byte for byte (tolerance 0), for fp16 and bf16 activations into f16 and
// bf16 pools, untouched slots included.
#include "kernels/cuda/kv_append.h"

#include <cstring>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

using ::winnow::testing::Download;
using ::winnow::testing::Half16;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::RoundedTo;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;
using ::winnow::testing::Upload16;

constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocks = 6;

// A pool of `dtype` whose every row holds random values (so that a stray write shows).
std::unique_ptr<cache::BlockPool> RandomPool(KvDtype dtype) {
  std::unique_ptr<cache::BlockPool> pool =
      *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, dtype}, kBlocks);
  ::winnow::testing::FillRandom(*pool, 21);
  return pool;
}

std::vector<std::byte> ArenaBytes(const cache::BlockPool& pool) {
  const std::byte* arena = pool.View().arena;
  return std::vector<std::byte>(arena, arena + int64_t{kBlocks} * pool.layout().bytes_per_block());
}

template <typename T>
class KvAppendTest : public ::winnow::testing::CudaTest {};
struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return Half16<T>::kDtype == KvDtype::kF16 ? "f16" : "bf16";
  }
};
using Types16 = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(KvAppendTest, Types16, TypeNames);

TYPED_TEST(KvAppendTest, WritesEveryRowWhereTheCpuDoesAndNothingElse) {
  using T = TypeParam;
  const int64_t kv_dim = int64_t{kKvHeads} * kDim;
  const int64_t stride = 2 * kv_dim;  // [K | V] rows, as in a fused QKV output after Q
  // (block, slot) per row: scattered blocks, a block's last slot, one padding row (-1).
  const std::vector<int64_t> slot_mapping = {5 * kBlock + 0, 2 * kBlock + 3, -1, 0 * kBlock + 1,
                                             5 * kBlock + 1, 3 * kBlock + 2};
  const int64_t rows = static_cast<int64_t>(slot_mapping.size());
  const std::vector<float> kv_rows =
      RoundedTo(Half16<T>::kDtype, RandomNormal(rows * stride, 22, 2.0f));
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBF16}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    std::unique_ptr<cache::BlockPool> pool = RandomPool(dtype);
    auto d_arena = Upload(ArenaBytes(*pool));
    for (int64_t r = 0; r < rows; ++r) {
      if (slot_mapping[r] < 0) continue;
      const int32_t block = static_cast<int32_t>(slot_mapping[r] / kBlock);
      const int32_t slot = static_cast<int32_t>(slot_mapping[r] % kBlock);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        pool->WriteRow(block, h, slot, false, kv_rows.data() + r * stride + h * kDim);
        pool->WriteRow(block, h, slot, true, kv_rows.data() + r * stride + kv_dim + h * kDim);
      }
    }
    auto d_rows = Upload16<T>(kv_rows);
    auto d_mapping = Upload(slot_mapping);
    const DevicePagedKv kv = DevicePagedKvFor(pool->View(), d_arena.data());
    ASSERT_TRUE(KvAppend<T>(kv, d_rows.data(), d_rows.data() + kv_dim, stride, d_mapping.data(),
                            rows, nullptr)
                    .ok());
    ASSERT_TRUE(Synchronize().ok());
    EXPECT_TRUE(Download(d_arena) == ArenaBytes(*pool)) << "device arena differs from the CPU's";
  }
}

TEST(KvAppendArgumentsTest, RejectsPoolsTheDeviceDoesNotStore) {
  auto pool = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, KvDtype::kQ8_0},
                                        1);
  const DevicePagedKv kv = DevicePagedKvFor(pool->View(), reinterpret_cast<std::byte*>(16));
  const absl::Status s =
      KvAppend<__half>(kv, nullptr, nullptr, kKvHeads * kDim, nullptr, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype"), std::string::npos) << s;
  DevicePagedKv wrong = kv;
  wrong.dtype = KvDtype::kF16;  // q8_0's bytes_per_block no longer matches
  EXPECT_NE(CheckDevicePagedKv(wrong).message().find("bytes_per_block"), std::string::npos);
}

}  // namespace
}  // namespace winnow::kernels::cuda
