// kernels/cuda/sparse_attention.h against kernels::PagedAttention with a selection (the CPU's
// TokenSelect path): two decode tokens of sequences with their own block tables, each attending
// to a list of selected past slots and its own slot, GQA (three query heads per KV head), both
// pool dtypes. The CPU reads the same 16-bit K/V and the bf16-rounded queries in float32; the
// GPU output is rounded to bf16 once (half an ulp of values below 1: 2^-9), so 4e-3 absolute.
#include "kernels/cuda/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

using ::winnow::testing::Download16;
using ::winnow::testing::ExpectClose;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::RoundedTo;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;
using ::winnow::testing::Upload16;

constexpr int32_t kHeads = 6;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 64;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocks = 24;

class SparseAttentionTest : public ::winnow::testing::CudaTest {};

TEST_F(SparseAttentionTest, MatchesTheCpusSelectedAttention) {
  const std::vector<int32_t> slots = {23, 30};  // per sequence, its new token's included
  const std::vector<std::vector<int32_t>> selected = {{0, 1, 5, 9, 10, 17, 21},
                                                      {2, 3, 4, 8, 15, 16, 28}};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kBF16}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    auto pool = *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, dtype},
                                          kBlocks);
    ::winnow::testing::FillRandom(*pool, 41);
    // Interleaved reservations: neither table is contiguous.
    std::vector<cache::SequenceKv> kvs;
    for (int32_t i = 0; i < 2; ++i) kvs.emplace_back(1, kBlock);
    for (int32_t step = 0; step < 8; ++step) {
      for (int32_t i = 0; i < 2; ++i) {
        const int32_t n = std::min(kBlock, slots[i] - kvs[i].num_slots(0));
        if (n <= 0) continue;
        ASSERT_TRUE(kvs[i].Reserve(*pool, n));
        kvs[i].AppendSlots(0, n);
      }
    }
    // Two query rows, the first one of the batch is a dense row the kernel must not touch.
    const std::vector<float> q =
        RoundedTo(KvDtype::kBF16, RandomNormal(3 * kHeads * kDim, 42, 2.0f));
    std::vector<float> want(3 * kHeads * kDim, 0.0f);
    ThreadPool threads(2);
    std::vector<AttentionSequence> seqs;
    for (int32_t i = 0; i < 2; ++i) {
      seqs.push_back({kvs[i].block_table(0).data(), slots[i], 1, i + 1, selected[i].data(),
                      static_cast<int32_t>(selected[i].size())});
    }
    kernels::PagedAttention(pool->View(), seqs, q.data(), kHeads, scale, want.data(), threads);

    std::vector<int32_t> rows = {1, 2}, table_offsets, list_offsets = {0}, tables, lists;
    for (int32_t i = 0; i < 2; ++i) {
      table_offsets.push_back(static_cast<int32_t>(tables.size()));
      tables.insert(tables.end(), kvs[i].block_table(0).begin(), kvs[i].block_table(0).end());
      lists.insert(lists.end(), selected[i].begin(), selected[i].end());
      lists.push_back(slots[i] - 1);
      list_offsets.push_back(static_cast<int32_t>(lists.size()));
    }
    const std::byte* host = pool->View().arena;
    auto arena =
        Upload(std::vector<std::byte>(host, host + kBlocks * pool->layout().bytes_per_block()));
    auto d_rows = Upload(rows), d_table_offsets = Upload(table_offsets);
    auto d_list_offsets = Upload(list_offsets), d_tables = Upload(tables), d_lists = Upload(lists);
    auto d_q = Upload16<__nv_bfloat16>(q);
    // The output starts as the dense row's "previous" values: they must survive.
    auto d_out = Upload16<__nv_bfloat16>(std::vector<float>(3 * kHeads * kDim, 0.5f));
    const DeviceSparseDecode in{2,          d_rows.data(),   d_table_offsets.data(),
                                d_list_offsets.data(), d_tables.data(), d_lists.data()};
    ASSERT_TRUE(SparseDecodeAttention(DevicePagedKvFor(pool->View(), arena.data()), in,
                                      d_q.data(), kHeads, scale, d_out.data(), nullptr)
                    .ok());
    ASSERT_TRUE(Synchronize().ok());
    std::vector<float> got = Download16(d_out);
    std::fill(want.begin(), want.begin() + kHeads * kDim, 0.5f);
    ExpectClose(got, want, 0, 4e-3, "sparse attention");
    for (cache::SequenceKv& kv : kvs) kv.Release(*pool);
  }
}

TEST_F(SparseAttentionTest, RejectsHeadsThatDoNotGroup) {
  auto pool =
      *cache::BlockPool::Create(cache::KvLayout{1, kKvHeads, kDim, kBlock, KvDtype::kBF16}, 1);
  const DevicePagedKv kv = DevicePagedKvFor(pool->View(), reinterpret_cast<std::byte*>(16));
  const absl::Status s = SparseDecodeAttention(kv, DeviceSparseDecode{1}, nullptr, 5, 1.0f,
                                               nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_heads"), std::string::npos) << s;
}

}  // namespace
}  // namespace winnow::kernels::cuda
