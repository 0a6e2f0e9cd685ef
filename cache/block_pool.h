// The paged KV arena: one allocation cut into fixed-size blocks, each holding one layer's K and
// V for `block_size` token slots. Per-layer blocks let every layer keep a different number of
// tokens (the point of the compression policies).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace winnow::cache {

// Geometry of a block. Inside a block the layout is
//   K[kv_head][slot][head_dim] followed by V[kv_head][slot][head_dim], float32,
// so one head's keys for a block are contiguous (attention streams them; per-head compaction
// gathers them).
struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;

  int64_t floats_per_head_block() const { return int64_t{block_size} * head_dim; }
  int64_t floats_per_block() const { return 2 * int64_t{num_kv_heads} * floats_per_head_block(); }
  int64_t bytes_per_block() const { return floats_per_block() * int64_t{sizeof(float)}; }
  // K and V bytes one token occupies across all layers (uncompressed).
  int64_t kv_bytes_per_token() const {
    return int64_t{num_layers} * 2 * num_kv_heads * head_dim * int64_t{sizeof(float)};
  }
};

class BlockPool {
 public:
  // Allocates the arena; ResourceExhausted when the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           int32_t num_blocks);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // How many blocks fit in `bytes` of arena.
  static int32_t BlocksForBytes(const KvLayout& layout, int64_t bytes);

  const KvLayout& layout() const { return layout_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_used() const { return num_blocks_ - num_free(); }

  // Appends `count` block ids to `out`, or takes none and returns false when fewer are free.
  bool Allocate(int32_t count, std::vector<int32_t>* out);
  // Returns blocks to the free list. Freeing a block that is not in use aborts: it would corrupt
  // another sequence's cache, so it is a bug, not an input error.
  void Free(std::span<const int32_t> blocks);

  float* Keys(int32_t block, int32_t kv_head) {
    return arena_ + block * layout_.floats_per_block() + kv_head * layout_.floats_per_head_block();
  }
  float* Values(int32_t block, int32_t kv_head) {
    return Keys(block, kv_head) + int64_t{layout_.num_kv_heads} * layout_.floats_per_head_block();
  }
  const float* Keys(int32_t block, int32_t kv_head) const {
    return arena_ + block * layout_.floats_per_block() + kv_head * layout_.floats_per_head_block();
  }
  const float* Values(int32_t block, int32_t kv_head) const {
    return Keys(block, kv_head) + int64_t{layout_.num_kv_heads} * layout_.floats_per_head_block();
  }
  float* arena() { return arena_; }
  const float* arena() const { return arena_; }

 private:
  BlockPool(const KvLayout& layout, int32_t num_blocks, float* arena);

  KvLayout layout_;
  int32_t num_blocks_;
  float* arena_;
  std::vector<int32_t> free_list_;
  std::vector<uint8_t> in_use_;
};

}  // namespace winnow::cache
