#include "cache/block_pool.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

#include <cstdio>

namespace winnow::cache {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             int32_t num_blocks) {
  if (num_blocks <= 0 || layout.bytes_per_block() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool needs at least one block (got ", num_blocks, " blocks of ",
        layout.bytes_per_block(), " bytes)"));
  }
  const size_t bytes = static_cast<size_t>(layout.bytes_per_block()) * num_blocks;
  // 64-byte alignment keeps every head block on its own cache lines for the SIMD kernels.
  const size_t rounded = (bytes + 63) / 64 * 64;
  auto* arena = static_cast<float*>(std::aligned_alloc(64, rounded));
  if (arena == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV pool of ", bytes, " bytes"));
  }
  std::memset(arena, 0, rounded);
  return std::unique_ptr<BlockPool>(new BlockPool(layout, num_blocks, arena));
}

BlockPool::BlockPool(const KvLayout& layout, int32_t num_blocks, float* arena)
    : layout_(layout), num_blocks_(num_blocks), arena_(arena) {
  free_list_.reserve(num_blocks);
  // Hand out low ids first: they were touched first and are likeliest to be resident.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
  in_use_.assign(num_blocks, 0);
}

BlockPool::~BlockPool() { std::free(arena_); }

int32_t BlockPool::BlocksForBytes(const KvLayout& layout, int64_t bytes) {
  const int64_t per_block = layout.bytes_per_block();
  if (per_block <= 0 || bytes <= 0) return 0;
  const int64_t blocks = bytes / per_block;
  return blocks > INT32_MAX ? INT32_MAX : static_cast<int32_t>(blocks);
}

bool BlockPool::Allocate(int32_t count, std::vector<int32_t>* out) {
  if (count < 0 || count > num_free()) return false;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t block = free_list_.back();
    free_list_.pop_back();
    in_use_[block] = 1;
    out->push_back(block);
  }
  return true;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t block : blocks) {
    if (block < 0 || block >= num_blocks_ || !in_use_[block]) {
      std::fprintf(stderr, "KV block %d freed twice or never allocated\n", block);
      std::abort();
    }
    in_use_[block] = 0;
    free_list_.push_back(block);
  }
}

}  // namespace winnow::cache
