// The KV cache of one sequence: for each layer, a block table and the number of filled slots.
// Slots are filled front to back; slot i of a layer lives in block_table[i / block_size] at
// offset i % block_size. After compression, slot order is still the tokens' causal order. A
// sliding-window layer may have dropped its leading blocks (kDroppedBlock in the table).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"

namespace winnow::cache {

// Blocks of `block_size` slots that hold `slots` slots.
inline int32_t BlocksFor(int32_t slots, int32_t block_size) {
  return (slots + block_size - 1) / block_size;
}

// The table entry of a block returned by DropBlocksBefore: its slots are no longer readable.
inline constexpr int32_t kDroppedBlock = -1;

class SequenceKv {
 public:
  SequenceKv(int32_t num_layers, int32_t block_size)
      : block_size_(block_size), layers_(num_layers) {}
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;
  ~SequenceKv() = default;  // blocks must be returned with Release() before destruction

  int32_t num_layers() const { return static_cast<int32_t>(layers_.size()); }
  int32_t num_slots(int32_t layer) const { return layers_[layer].num_slots; }
  std::span<const int32_t> block_table(int32_t layer) const { return layers_[layer].blocks; }
  int32_t block_size() const { return block_size_; }
  // Blocks in the layers' tables (not the dropped ones) and pinned ones.
  int32_t num_blocks_held() const;
  // Leading blocks of `layer` that DropBlocksBefore returned.
  int32_t num_dropped(int32_t layer) const { return layers_[layer].dropped; }
  // Slots the reserved blocks of `layer` can hold.
  int32_t capacity(int32_t layer) const {
    return static_cast<int32_t>(layers_[layer].blocks.size()) * block_size_;
  }

  // Blocks that must be allocated so that every layer can take `extra_slots` more slots.
  int32_t BlocksNeeded(int32_t extra_slots) const;
  // Allocates those blocks: all or nothing. Returns false (and changes nothing) when the pool
  // has too few free blocks.
  bool Reserve(BlockPool& pool, int32_t extra_slots);
  // Records that `count` slots were written after the existing ones in `layer` (the forward
  // pass calls this once it has stored the new K/V). Capacity must have been reserved.
  void AppendSlots(int32_t layer, int32_t count);
  // Replaces a layer's table after compaction. The caller has already freed the old blocks
  // that are not in `blocks`. (A layer that dropped blocks is never compacted.)
  void ReplaceLayer(int32_t layer, std::vector<int32_t> blocks, int32_t num_slots);
  // Shrinks `layer` to its first `num_slots` slots (compaction has moved the kept K/V there)
  // and returns the blocks beyond what they need to the pool at once.
  void Truncate(BlockPool& pool, int32_t layer, int32_t num_slots);
  // Frees blocks beyond what the filled slots need (e.g. a reservation that was not used).
  void TrimUnused(BlockPool& pool);
  // Returns to the pool the blocks of `layer` that hold only slots before `slot` (a
  // sliding-window layer's past, which no later token reads); their entries become
  // kDroppedBlock, so later slots keep their indices. Only for a cache that nothing reads whole
  // again: no compression scores or compacts it any more (ApplyKeepPlan refuses such a layer).
  void DropBlocksBefore(BlockPool& pool, int32_t layer, int32_t slot);
  // Returns every block to the pool (drops this sequence's reference); the cache is then
  // empty.
  void Release(BlockPool& pool);

  // --- Prefix caching. ---
  // Appends a full block shared with other sequences (a cached prompt block) to `layer`, which
  // must hold whole blocks and no unused reservation. Takes a reference.
  void AppendSharedBlock(BlockPool& pool, int32_t layer, int32_t block);
  // Appends `block`, which this sequence allocated (one reference) and whose first `slots` slots
  // hold K/V, to `layer`, which must hold whole blocks and no unused reservation: a private copy
  // of a compressed context's partial last block (cache/compressed_prefix.h).
  void AppendBlock(int32_t layer, int32_t block, int32_t slots);
  // Keeps `block` (one reference, which this sequence now owns) alive until Release, outside
  // every layer's table: a published compressed context's partial blocks, so that they return to
  // the free queue with the rest of the context, not before it.
  void Pin(int32_t block) { pinned_.push_back(block); }
  // Blocks that other sequences also reference (from each layer's block holding slot
  // first_slots[layer] on; every block when empty).
  int32_t SharedBlocks(const BlockPool& pool, std::span<const int32_t> first_slots = {}) const;
  // Blocks that Release would return to the free queue (those only this sequence references).
  int32_t BlocksFreedByRelease(const BlockPool& pool) const;
  // Before the cache is rewritten in place (compaction): copies every shared block into a block
  // of its own and forgets the content key of the blocks it owns alone, so the cached prefix
  // stays intact for others. With `first_slots`, only each layer's blocks from the one holding
  // slot first_slots[layer] on (a stage's compaction leaves the earlier slots where they are).
  // ResourceExhausted (nothing changed) when the pool has too few free blocks; a device's error
  // when a copy fails (the cache is then unusable).
  absl::Status MakePrivate(BlockPool& pool, std::span<const int32_t> first_slots = {});

 private:
  int32_t block_size_;
  struct Layer {
    std::vector<int32_t> blocks;
    int32_t num_slots = 0;
    int32_t dropped = 0;  // blocks[0, dropped) are kDroppedBlock
  };
  std::vector<Layer> layers_;
  std::vector<int32_t> pinned_;
};

}  // namespace winnow::cache
