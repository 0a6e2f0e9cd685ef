// The paged KV arena: one allocation cut into fixed-size blocks, each holding one layer's K and
// V for `block_size` token slots. Per-layer blocks let every layer keep a different number of
// tokens (the point of the compression policies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_dtype.h"

namespace winnow::cache {

class KvDevice;

// Geometry of a block. Inside a block the layout is
//   K[kv_head][slot][row] followed by V[kv_head][slot][row],
// a row being one token's head_dim values for one KV head, stored as `dtype`
// (kernels/cpu/kv_dtype.h: f32, f16, bf16, or q8_0 blocks of 32 values with an fp16 scale).
// One head's keys for a block are contiguous (attention streams them) and each row is whole and
// contiguous, so compaction moves a token by copying its row's bytes, whatever the dtype.
// With `logit_bias` the block ends with Bias[kv_head][slot], one float per (KV head, slot)
// added to every attention logit on that key: zero for a computed token, log(group mass / own
// mass) for a slot that absorbed evicted ones (a mass-preserving merge, cache/compaction.h).
// It lives in the block so that every block copy (copy-on-write, published prefixes) carries it.
struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  kernels::KvDtype dtype = kernels::KvDtype::kF32;
  bool logit_bias = false;

  int64_t row_bytes() const { return kernels::KvRowBytes(dtype, head_dim); }
  int64_t bytes_per_head_block() const { return int64_t{block_size} * row_bytes(); }
  // Where a block's Bias[kv_head][slot] starts (after K and V), and its size (0 without bias).
  int64_t bias_offset() const { return 2 * int64_t{num_kv_heads} * bytes_per_head_block(); }
  int64_t bias_bytes_per_block() const {
    return logit_bias ? int64_t{num_kv_heads} * block_size * int64_t{sizeof(float)} : 0;
  }
  int64_t bytes_per_block() const { return bias_offset() + bias_bytes_per_block(); }
  // K, V (and bias) bytes one token occupies across all layers (uncompressed).
  int64_t kv_bytes_per_token() const {
    return int64_t{num_layers} * (2 * num_kv_heads * row_bytes() +
                                  bias_bytes_per_block() / block_size);
  }
  kernels::PagedKvView View(const std::byte* arena) const {
    return kernels::PagedKvView{arena,    bytes_per_block(), block_size,
                                num_kv_heads, head_dim,       dtype,
                                row_bytes(),  logit_bias ? bias_offset() : 0};
  }
};

// Blocks are reference-counted so that sequences can share full prompt blocks (prefix
// caching). A block whose last reference is dropped goes back to the free queue; if it carries a
// content key (it holds a cached prompt block) it stays findable by that key until it is
// reallocated, so "free" means "reclaimable": the pool reuses a cached block only when it has no
// never-cached free block left, and then the least recently freed first (LRU).
class BlockPool {
 public:
  // Allocates the arena; ResourceExhausted when the memory cannot be had. Without
  // `host_arena` the pool only keeps the books (free list, references, prefix index) for data
  // that lives elsewhere, the CUDA worker's device arena (model/cuda_model.h); Row, WriteRow,
  // ReadRow, Keys, Values and View's data must then not be used, and CopyBlock needs an
  // attached device.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           int32_t num_blocks,
                                                           bool host_arena = true);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // How many blocks fit in `bytes` of arena.
  static int32_t BlocksForBytes(const KvLayout& layout, int64_t bytes);

  const KvLayout& layout() const { return layout_; }
  int32_t num_blocks() const { return num_blocks_; }
  // Blocks no sequence references (cached ones included: they are reclaimed on demand).
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_blocks_ - num_free_; }
  // Sum of all blocks' reference counts: what the sequences' block tables hold in total.
  int64_t num_references() const { return num_references_; }
  // Free blocks that still hold a cached prompt block.
  int32_t num_cached_free() const { return num_cached_free_; }

  // Appends `count` block ids, each with one reference, to `out`, or takes none and returns
  // false when fewer are free. Reclaiming a cached block forgets its key. A host arena's
  // logit biases of the blocks handed out are zeroed (the forwards write only K and V).
  bool Allocate(int32_t count, std::vector<int32_t>* out);
  // Drops one reference from each block. Freeing a block that has none aborts: it would corrupt
  // another sequence's cache, so it is a bug, not an input error.
  void Free(std::span<const int32_t> blocks);
  // Adds a reference to a block found by FindCached (taking it off the free queue if needed).
  void AddReference(int32_t block);
  int32_t references(int32_t block) const { return meta_[block].refs; }

  // --- Content index (prefix caching). Keys identify a block's contents: one layer's K/V of a
  // full block of prompt tokens after a given prefix (cache/prefix_hash.h). ---
  // The block holding `key`, or -1.
  int32_t FindCached(uint64_t key) const;
  // Records that `block` (referenced) holds `key`. A block holds at most one key; a key already
  // held by another block is left there (two sequences computed the same prefix at once).
  void SetKey(int32_t block, uint64_t key);
  // Forgets the block's key (its contents are about to change, e.g. compaction in place).
  void ClearKey(int32_t block);
  bool has_key(int32_t block) const { return meta_[block].has_key; }
  // The key a block holds (meaningful when has_key).
  uint64_t key(int32_t block) const { return meta_[block].key; }
  // Whether `block` holds exactly `key` (a cheap check that a block found earlier is still it).
  bool HoldsKey(int32_t block, uint64_t key) const {
    return meta_[block].has_key && meta_[block].key == key;
  }
  // How many times a block has lost its key (reclaimed, or cleared): when unchanged, every key
  // set before is still where it was.
  uint64_t keys_dropped() const { return keys_dropped_; }

  // One row (K when `values` is false, else V) in its stored form: row_bytes() bytes. Copying
  // these bytes moves a token's K or V exactly, whatever the dtype.
  std::byte* Row(int32_t block, int32_t kv_head, int32_t slot, bool values) {
    return arena_ + RowOffset(block, kv_head, slot, values);
  }
  const std::byte* Row(int32_t block, int32_t kv_head, int32_t slot, bool values) const {
    return arena_ + RowOffset(block, kv_head, slot, values);
  }
  // Stores head_dim floats into a row (rounded or quantised to the dtype).
  void WriteRow(int32_t block, int32_t kv_head, int32_t slot, bool values, const float* src) {
    kernels::EncodeKv(layout_.dtype, src, layout_.head_dim, Row(block, kv_head, slot, values));
  }
  // A block's logit biases for one KV head (block_size floats); layouts with logit_bias only.
  float* Bias(int32_t block, int32_t kv_head) {
    return reinterpret_cast<float*>(arena_ + block * layout_.bytes_per_block() +
                                    layout_.bias_offset()) +
           int64_t{kv_head} * layout_.block_size;
  }
  // Reads a row back as head_dim floats.
  void ReadRow(int32_t block, int32_t kv_head, int32_t slot, bool values, float* dst) const {
    kernels::DecodeKv(layout_.dtype, Row(block, kv_head, slot, values), layout_.head_dim, dst);
  }
  // Float views of a head block, for float32 pools only (tests and tools that poke values in
  // place); any other dtype aborts, as it has no float storage to point at.
  float* Keys(int32_t block, int32_t kv_head) { return F32(Row(block, kv_head, 0, false)); }
  float* Values(int32_t block, int32_t kv_head) { return F32(Row(block, kv_head, 0, true)); }
  // Copies a whole block's K and V (bit for bit: any dtype), on the attached device when the
  // data lives there. Fails only with a device's error.
  absl::Status CopyBlock(int32_t from, int32_t to);
  // --- Data off the host (cache/kv_device.h). ---
  // Attaches the device that holds this pool's K/V data (a pool without a host arena); it must
  // outlive the pool's use. Null detaches it.
  void AttachDevice(KvDevice* device) { device_ = device; }
  // The attached device, or null when the data is in the host arena (or nowhere yet).
  KvDevice* device() const { return device_; }
  // The arena as the kernels read it.
  kernels::PagedKvView View() const { return layout_.View(arena_); }

 private:
  struct Meta {
    int32_t refs = 0;
    bool has_key = false;
    uint64_t key = 0;
    // Free-queue links (valid while refs == 0).
    int32_t prev = -1;
    int32_t next = -1;
  };

  BlockPool(const KvLayout& layout, int32_t num_blocks, std::byte* arena);
  int64_t RowOffset(int32_t block, int32_t kv_head, int32_t slot, bool values) const {
    return block * layout_.bytes_per_block() +
           (int64_t{values ? layout_.num_kv_heads : 0} + kv_head) * layout_.bytes_per_head_block() +
           slot * layout_.row_bytes();
  }
  float* F32(std::byte* p);
  void PushFree(int32_t block, bool front);
  void Unlink(int32_t block);

  KvLayout layout_;
  int32_t num_blocks_;
  std::byte* arena_;
  KvDevice* device_ = nullptr;
  std::vector<Meta> meta_;
  // Free queue, a doubly linked list through meta_: never-cached blocks at the front (reused
  // first), cached ones appended at the back as they are freed (so the front-most cached block
  // is the least recently used).
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int32_t num_free_ = 0;
  int32_t num_cached_free_ = 0;
  int64_t num_references_ = 0;
  uint64_t keys_dropped_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> index_;  // key -> block
};

}  // namespace winnow::cache
