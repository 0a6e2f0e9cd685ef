#include "cache/compressed_prefix.h"

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "cache/prefix_cache.h"

namespace winnow::cache {
namespace {

int32_t WholeBlocks(int32_t slots, int32_t block_size) { return slots / block_size; }

}  // namespace

int64_t CompressedContext::total_slots() const {
  int64_t total = 0;
  for (int32_t s : slots) total += s;
  return total;
}

uint64_t CompressedPrefixCache::Key(std::span<const int32_t> tokens,
                                    std::span<const float> embeddings, int32_t hidden,
                                    std::string_view salt, std::string_view plan_inputs) {
  uint64_t key = absl::HashOf(std::string_view("compressed context"), salt, plan_inputs,
                              absl::MakeConstSpan(tokens.data(), tokens.size()));
  size_t next_row = 0;
  for (int32_t id : tokens) {
    if (id < 0) key = HashEmbeddingRow(key, embeddings.subspan(next_row++ * hidden, hidden));
  }
  return key;
}

uint64_t CompressedPrefixCache::BlockKey(uint64_t key, int32_t layer, int32_t index) const {
  return absl::HashOf(key, layer, index);
}

bool CompressedPrefixCache::Whole(const CompressedContext& context) const {
  for (size_t l = 0; l < context.blocks.size(); ++l) {
    for (size_t i = 0; i < context.blocks[l].size(); ++i) {
      if (!pool_.HoldsKey(context.blocks[l][i], context.block_keys[l][i])) return false;
    }
  }
  return true;
}

void CompressedPrefixCache::Prune() {
  if (pool_.keys_dropped() == pruned_at_drops_) return;
  absl::erase_if(contexts_,
                 [this](const auto& entry) { return !Whole(entry.second); });
  pruned_at_drops_ = pool_.keys_dropped();
}

const CompressedContext* CompressedPrefixCache::Find(uint64_t key) {
  Prune();
  auto it = contexts_.find(key);
  return it == contexts_.end() ? nullptr : &it->second;
}

int32_t CompressedPrefixCache::resident() {
  Prune();
  return static_cast<int32_t>(contexts_.size());
}

int32_t CompressedPrefixCache::BlocksToAttach(const CompressedContext& context) const {
  const int32_t block_size = pool_.layout().block_size;
  int32_t blocks = 0;
  for (size_t l = 0; l < context.blocks.size(); ++l) {
    const int32_t whole = WholeBlocks(context.slots[l], block_size);
    // Every block leaves the free queue while attached (a partial one until it is copied).
    for (int32_t block : context.blocks[l]) blocks += pool_.references(block) == 0 ? 1 : 0;
    blocks += whole < static_cast<int32_t>(context.blocks[l].size()) ? 1 : 0;  // the copy
  }
  return blocks;
}

int32_t CompressedPrefixCache::BlocksForSuffix(const CompressedContext& context,
                                               int32_t tokens) const {
  const int32_t block_size = pool_.layout().block_size;
  int32_t blocks = 0;
  for (int32_t slots : context.slots) {
    blocks += BlocksFor(slots + tokens, block_size) - BlocksFor(slots, block_size);
  }
  return blocks;
}

absl::Status CompressedPrefixCache::Attach(const CompressedContext& context, SequenceKv& kv) {
  const int32_t block_size = pool_.layout().block_size;
  const int32_t layers = static_cast<int32_t>(context.blocks.size());
  // Every block of the context is referenced before any copy is allocated, so the allocation
  // cannot reclaim one of them.
  std::vector<int32_t> tails;
  for (int32_t l = 0; l < layers; ++l) {
    const int32_t whole = WholeBlocks(context.slots[l], block_size);
    for (int32_t i = 0; i < whole; ++i) kv.AppendSharedBlock(pool_, l, context.blocks[l][i]);
    if (whole < static_cast<int32_t>(context.blocks[l].size())) {
      tails.push_back(context.blocks[l][whole]);
      pool_.AddReference(tails.back());
    }
  }
  std::vector<int32_t> copies;
  if (!pool_.Allocate(static_cast<int32_t>(tails.size()), &copies)) {
    pool_.Free(tails);
    return absl::ResourceExhaustedError("no free KV block to copy a compressed context's tail");
  }
  absl::Status status;
  size_t next = 0;
  for (int32_t l = 0; l < layers; ++l) {
    const int32_t partial = context.slots[l] % block_size;
    if (partial == 0) continue;
    // The table takes the copy even if it failed, so that every block is still returned.
    status.Update(pool_.CopyBlock(tails[next], copies[next]));
    kv.AppendBlock(l, copies[next], partial);
    ++next;
  }
  pool_.Free(tails);
  return status;
}

int32_t CompressedPrefixCache::PublishBlocks(std::span<const int32_t> slots) const {
  int32_t blocks = 0;
  for (int32_t s : slots) blocks += s % pool_.layout().block_size != 0 ? 1 : 0;
  return blocks;
}

absl::StatusOr<bool> CompressedPrefixCache::Publish(uint64_t key, int32_t num_tokens,
                                                    const policies::SlotPositions& positions,
                                                    SequenceKv& kv) {
  if (Find(key) != nullptr) return false;
  const int32_t block_size = pool_.layout().block_size;
  CompressedContext context;
  context.num_tokens = num_tokens;
  context.positions = positions;
  for (int32_t l = 0; l < kv.num_layers(); ++l) {
    if (positions.num_slots(l) != kv.num_slots(l)) {
      return absl::InternalError("compressed context: the cache holds other slots than tracked");
    }
    context.slots.push_back(kv.num_slots(l));
  }
  std::vector<int32_t> copies;
  if (!pool_.Allocate(PublishBlocks(context.slots), &copies)) return false;
  absl::Status status;
  size_t next = 0;
  context.blocks.resize(kv.num_layers());
  for (int32_t l = 0; l < kv.num_layers(); ++l) {
    const std::span<const int32_t> table = kv.block_table(l);
    const int32_t whole = WholeBlocks(context.slots[l], block_size);
    context.blocks[l].assign(table.begin(), table.begin() + whole);
    if (context.slots[l] % block_size != 0) {
      status.Update(pool_.CopyBlock(table[whole], copies[next]));
      kv.Pin(copies[next]);
      context.blocks[l].push_back(copies[next++]);
    }
  }
  // Pinned even on a failed copy, so every block is still returned; never published then.
  if (!status.ok()) return status;
  context.block_keys.resize(kv.num_layers());
  for (int32_t l = 0; l < kv.num_layers(); ++l) {
    for (size_t i = 0; i < context.blocks[l].size(); ++i) {
      const int32_t block = context.blocks[l][i];
      if (pool_.has_key(block)) {  // an earlier stage's (the only keyed blocks a publisher holds)
        context.block_keys[l].push_back(pool_.key(block));
        continue;
      }
      const uint64_t block_key = BlockKey(key, l, static_cast<int32_t>(i));
      // A block of an earlier context under this key, which lost another block since.
      if (const int32_t stale = pool_.FindCached(block_key); stale >= 0) pool_.ClearKey(stale);
      pool_.SetKey(block, block_key);
      context.block_keys[l].push_back(block_key);
    }
  }
  contexts_[key] = std::move(context);
  return true;
}

}  // namespace winnow::cache
