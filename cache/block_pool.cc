#include "cache/block_pool.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cache/kv_device.h"

#include <cstdio>

namespace winnow::cache {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             int32_t num_blocks,
                                                             bool host_arena) {
  if (absl::Status s = kernels::CheckKvDtype(layout.dtype, layout.head_dim); !s.ok()) return s;
  if (num_blocks <= 0 || layout.bytes_per_block() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool needs at least one block (got ", num_blocks, " blocks of ",
        layout.bytes_per_block(), " bytes)"));
  }
  if (!host_arena) return std::unique_ptr<BlockPool>(new BlockPool(layout, num_blocks, nullptr));
  const size_t bytes = static_cast<size_t>(layout.bytes_per_block()) * num_blocks;
  // 64-byte alignment keeps every head block on its own cache lines for the SIMD kernels.
  const size_t rounded = (bytes + 63) / 64 * 64;
  auto* arena = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (arena == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV pool of ", bytes, " bytes"));
  }
  std::memset(arena, 0, rounded);
  return std::unique_ptr<BlockPool>(new BlockPool(layout, num_blocks, arena));
}

BlockPool::BlockPool(const KvLayout& layout, int32_t num_blocks, std::byte* arena)
    : layout_(layout), num_blocks_(num_blocks), arena_(arena), meta_(num_blocks) {
  // Hand out low ids first: they were touched first and are likeliest to be resident.
  for (int32_t b = 0; b < num_blocks; ++b) PushFree(b, /*front=*/false);
}

BlockPool::~BlockPool() { std::free(arena_); }

int32_t BlockPool::BlocksForBytes(const KvLayout& layout, int64_t bytes) {
  const int64_t per_block = layout.bytes_per_block();
  if (per_block <= 0 || bytes <= 0) return 0;
  const int64_t blocks = bytes / per_block;
  return blocks > INT32_MAX ? INT32_MAX : static_cast<int32_t>(blocks);
}

void BlockPool::PushFree(int32_t block, bool front) {
  Meta& m = meta_[block];
  m.prev = front ? -1 : tail_;
  m.next = front ? head_ : -1;
  (m.prev >= 0 ? meta_[m.prev].next : head_) = block;
  (m.next >= 0 ? meta_[m.next].prev : tail_) = block;
  ++num_free_;
  if (m.has_key) ++num_cached_free_;
}

void BlockPool::Unlink(int32_t block) {
  Meta& m = meta_[block];
  (m.prev >= 0 ? meta_[m.prev].next : head_) = m.next;
  (m.next >= 0 ? meta_[m.next].prev : tail_) = m.prev;
  m.prev = m.next = -1;
  --num_free_;
  if (m.has_key) --num_cached_free_;
}

bool BlockPool::Allocate(int32_t count, std::vector<int32_t>* out) {
  if (count < 0 || count > num_free_) return false;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t block = head_;
    Unlink(block);
    meta_[block].refs = 1;
    ClearKey(block);
    if (arena_ != nullptr && layout_.logit_bias) {
      std::memset(Bias(block, 0), 0, layout_.bias_bytes_per_block());
    }
    ++num_references_;
    out->push_back(block);
  }
  return true;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t block : blocks) {
    if (block < 0 || block >= num_blocks_ || meta_[block].refs <= 0) {
      std::fprintf(stderr, "KV block %d freed twice or never allocated\n", block);
      std::abort();
    }
    --num_references_;
    // Uncached blocks go to the front, to be reused before any cached block is reclaimed.
    if (--meta_[block].refs == 0) PushFree(block, /*front=*/!meta_[block].has_key);
  }
}

void BlockPool::AddReference(int32_t block) {
  if (meta_[block].refs == 0) Unlink(block);
  ++meta_[block].refs;
  ++num_references_;
}

int32_t BlockPool::FindCached(uint64_t key) const {
  auto it = index_.find(key);
  return it == index_.end() ? -1 : it->second;
}

void BlockPool::SetKey(int32_t block, uint64_t key) {
  Meta& m = meta_[block];
  if (m.has_key || index_.contains(key)) return;
  m.has_key = true;
  m.key = key;
  index_[key] = block;
}

void BlockPool::ClearKey(int32_t block) {
  Meta& m = meta_[block];
  if (!m.has_key) return;
  index_.erase(m.key);
  m.has_key = false;
  ++keys_dropped_;
  if (m.refs == 0) --num_cached_free_;
}

absl::Status BlockPool::CopyBlock(int32_t from, int32_t to) {
  if (device_ != nullptr) return device_->CopyBlock(from, to);
  if (arena_ == nullptr) {
    std::fprintf(stderr, "CopyBlock on a KV pool whose data is not on the host\n");
    std::abort();
  }
  const int64_t bytes = layout_.bytes_per_block();
  std::memcpy(arena_ + to * bytes, arena_ + from * bytes, bytes);
  return absl::OkStatus();
}

float* BlockPool::F32(std::byte* p) {
  if (layout_.dtype != kernels::KvDtype::kF32) {
    std::fprintf(stderr, "float view of a %s KV pool\n", kernels::KvDtypeName(layout_.dtype));
    std::abort();
  }
  return reinterpret_cast<float*>(p);
}

}  // namespace winnow::cache
