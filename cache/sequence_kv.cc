#include "cache/sequence_kv.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace winnow::cache {

int32_t SequenceKv::num_blocks_held() const {
  int32_t total = static_cast<int32_t>(pinned_.size());
  for (const Layer& layer : layers_) {
    total += static_cast<int32_t>(layer.blocks.size()) - layer.dropped;
  }
  return total;
}

int32_t SequenceKv::BlocksNeeded(int32_t extra_slots) const {
  int32_t needed = 0;
  for (const Layer& layer : layers_) {
    const int32_t want = BlocksFor(layer.num_slots + extra_slots, block_size_);
    const int32_t have = static_cast<int32_t>(layer.blocks.size());
    if (want > have) needed += want - have;
  }
  return needed;
}

bool SequenceKv::Reserve(BlockPool& pool, int32_t extra_slots) {
  std::vector<int32_t> fresh;
  if (!pool.Allocate(BlocksNeeded(extra_slots), &fresh)) return false;
  size_t next = 0;
  for (Layer& layer : layers_) {
    const int32_t want = BlocksFor(layer.num_slots + extra_slots, block_size_);
    while (static_cast<int32_t>(layer.blocks.size()) < want) layer.blocks.push_back(fresh[next++]);
  }
  return true;
}

void SequenceKv::AppendSlots(int32_t layer, int32_t count) {
  Layer& l = layers_[layer];
  if (l.num_slots + count > capacity(layer)) {
    // Writing past the reservation would scribble over another sequence's blocks.
    std::fprintf(stderr, "KV slots appended beyond reserved capacity (layer %d)\n", layer);
    std::abort();
  }
  l.num_slots += count;
}

void SequenceKv::ReplaceLayer(int32_t layer, std::vector<int32_t> blocks, int32_t num_slots) {
  layers_[layer].blocks = std::move(blocks);
  layers_[layer].num_slots = num_slots;
  layers_[layer].dropped = 0;
}

void SequenceKv::Truncate(BlockPool& pool, int32_t layer, int32_t num_slots) {
  Layer& l = layers_[layer];
  if (num_slots < 0 || num_slots > l.num_slots) {
    std::fprintf(stderr, "KV truncate to %d slots but layer %d has %d\n", num_slots, layer,
                 l.num_slots);
    std::abort();
  }
  l.num_slots = num_slots;
  const size_t keep = std::max<size_t>(BlocksFor(num_slots, block_size_), l.dropped);
  if (l.blocks.size() > keep) {
    pool.Free(std::span<const int32_t>(l.blocks).subspan(keep));
    l.blocks.resize(keep);
  }
}

void SequenceKv::TrimUnused(BlockPool& pool) {
  for (Layer& layer : layers_) {
    const size_t keep = std::max<size_t>(BlocksFor(layer.num_slots, block_size_), layer.dropped);
    if (layer.blocks.size() > keep) {
      pool.Free(std::span<const int32_t>(layer.blocks).subspan(keep));
      layer.blocks.resize(keep);
    }
  }
}

void SequenceKv::DropBlocksBefore(BlockPool& pool, int32_t layer, int32_t slot) {
  Layer& l = layers_[layer];
  const int32_t upto = std::min(std::max(slot, 0) / block_size_, l.num_slots / block_size_);
  if (upto <= l.dropped) return;
  std::span<int32_t> gone = std::span<int32_t>(l.blocks).subspan(l.dropped, upto - l.dropped);
  pool.Free(gone);
  std::fill(gone.begin(), gone.end(), kDroppedBlock);
  l.dropped = upto;
}

void SequenceKv::Release(BlockPool& pool) {
  for (Layer& layer : layers_) {
    pool.Free(std::span<const int32_t>(layer.blocks).subspan(layer.dropped));
    layer.blocks.clear();
    layer.num_slots = 0;
    layer.dropped = 0;
  }
  pool.Free(pinned_);
  pinned_.clear();
}

void SequenceKv::AppendSharedBlock(BlockPool& pool, int32_t layer, int32_t block) {
  Layer& l = layers_[layer];
  if (l.num_slots != capacity(layer) || l.num_slots % block_size_ != 0) {
    std::fprintf(stderr, "shared KV block appended after a partial block (layer %d)\n", layer);
    std::abort();
  }
  pool.AddReference(block);
  l.blocks.push_back(block);
  l.num_slots += block_size_;
}

void SequenceKv::AppendBlock(int32_t layer, int32_t block, int32_t slots) {
  Layer& l = layers_[layer];
  if (l.num_slots != capacity(layer) || slots < 0 || slots > block_size_) {
    std::fprintf(stderr, "KV block appended after a partial block (layer %d)\n", layer);
    std::abort();
  }
  l.blocks.push_back(block);
  l.num_slots += slots;
}

int32_t SequenceKv::SharedBlocks(const BlockPool& pool,
                                 std::span<const int32_t> first_slots) const {
  int32_t shared = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::vector<int32_t>& blocks = layers_[l].blocks;
    const size_t first = std::max<size_t>(first_slots.empty() ? 0 : first_slots[l] / block_size_,
                                          layers_[l].dropped);
    for (size_t i = first; i < blocks.size(); ++i) shared += pool.references(blocks[i]) > 1;
  }
  return shared;
}

int32_t SequenceKv::BlocksFreedByRelease(const BlockPool& pool) const {
  return num_blocks_held() - SharedBlocks(pool);
}

absl::Status SequenceKv::MakePrivate(BlockPool& pool, std::span<const int32_t> first_slots) {
  std::vector<int32_t> copies;
  if (!pool.Allocate(SharedBlocks(pool, first_slots), &copies)) {
    return absl::ResourceExhaustedError(
        "no free KV block to copy the shared prompt prefix before compression");
  }
  size_t next = 0;
  absl::Status status;
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::vector<int32_t>& blocks = layers_[l].blocks;
    const size_t first = std::max<size_t>(first_slots.empty() ? 0 : first_slots[l] / block_size_,
                                          layers_[l].dropped);
    for (auto it = blocks.begin() + std::min(first, blocks.size()); it != blocks.end(); ++it) {
      int32_t& b = *it;
      if (pool.references(b) > 1) {
        // The table takes the copy even if it failed, so that every block is still returned.
        status.Update(pool.CopyBlock(b, copies[next]));
        pool.Free({&b, 1});
        b = copies[next++];
      } else {
        pool.ClearKey(b);
      }
    }
  }
  return status;
}

}  // namespace winnow::cache
