// Compressed contexts published for reuse. A request that compresses only its context
// (scheduler::CompressionSpec::context_tokens) gets a plan that depends on the context alone, so
// its compressed K/V serve any later request that starts with the same context and asks for the
// same compression: it attaches them and computes only its own suffix, at positions continuing
// where the context ended.
//
// The key covers everything that determined the compressed K/V: the context's tokens (embedding
// rows hashed bit for bit), the cache salt and the plan's inputs (policy, budget, parameters,
// the context's spans: a canonical text the engine builds). Model and KV dtype are the pool's
// own, fixed for its lifetime.
//
// Storage reuses the pool's content index, so reclamation is the uncompressed prefix cache's
// LRU: each block of a published context carries a key derived from the context's key, layer and
// index, or, for the blocks of an earlier stage of the same context (published before, left as
// they were by the later stage's compression), that stage's key: a block holds one key, and the
// stages share it. Whole blocks are keyed where they are (the publisher's own table; it never
// rewrites them: context-scoped policies do not compact again, and a later stage's compaction
// leaves the earlier slots where they are). A layer's partial last block is copied: the
// publisher keeps writing its suffix into its own, and the copy is pinned to the publisher so the
// context's blocks go back to the free queue together. An attaching sequence shares the whole
// blocks and copies the partial ones (copy on attach), since it writes its suffix after them.
// A context is resident while every one of its blocks still holds its key; once one is reclaimed
// the context is gone (the rest age out of the free queue as usual).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/policies/policy.h"
#include "cache/sequence_kv.h"

namespace winnow::cache {

// What a published context holds, besides its blocks.
struct CompressedContext {
  int32_t num_tokens = 0;             // the context's tokens; the suffix starts at this position
  std::vector<int32_t> slots;         // kept slots per layer
  policies::SlotPositions positions;  // the position each kept slot holds
  std::vector<std::vector<int32_t>> blocks;  // per layer, as published
  std::vector<std::vector<uint64_t>> block_keys;  // the key each of them holds while resident

  // Slots summed over layers.
  int64_t total_slots() const;
};

class CompressedPrefixCache {
 public:
  explicit CompressedPrefixCache(BlockPool& pool) : pool_(pool) {}
  CompressedPrefixCache(const CompressedPrefixCache&) = delete;
  CompressedPrefixCache& operator=(const CompressedPrefixCache&) = delete;

  // The key of a context: its tokens (a negative id marks an embedding position, whose row of
  // `hidden` floats in `embeddings` is hashed instead), the salt, and `plan_inputs`.
  static uint64_t Key(std::span<const int32_t> tokens, std::span<const float> embeddings,
                      int32_t hidden, std::string_view salt, std::string_view plan_inputs);

  // The context published under `key` whose blocks are all still cached, or null. The pointer
  // is valid until the next non-const call.
  const CompressedContext* Find(uint64_t key);

  // Free blocks attaching `context` takes: its blocks no sequence references (they leave the
  // free queue; a partial one only while it is copied) and a private copy of each layer's
  // partial last block.
  int32_t BlocksToAttach(const CompressedContext& context) const;
  // The K/V bytes `context` holds.
  int64_t KvBytes(const CompressedContext& context) const {
    return context.total_slots() * 2 * pool_.layout().num_kv_heads * pool_.layout().row_bytes();
  }
  // New blocks `tokens` more slots per layer need after attaching `context`.
  int32_t BlocksForSuffix(const CompressedContext& context, int32_t tokens) const;

  // Attaches `context` (found by Find, nothing changed since) to `kv`, which must be empty:
  // whole blocks shared, partial last blocks copied. The caller has checked BlocksToAttach
  // against the free blocks. A device's copy error leaves `kv` holding what it took (Release
  // returns it).
  absl::Status Attach(const CompressedContext& context, SequenceKv& kv);

  // Publishes the compressed context `kv` holds (exactly its `positions`, nothing after them)
  // under `key`, pinning the copies of its partial blocks to `kv`. Blocks that hold a key
  // already are an earlier stage's, published before: they keep it. False, with nothing
  // changed, when a context is already published under `key` or the pool has fewer free blocks
  // than Publish takes (PublishBlocks).
  absl::StatusOr<bool> Publish(uint64_t key, int32_t num_tokens,
                               const policies::SlotPositions& positions, SequenceKv& kv);
  // Free blocks publishing a context of these per-layer slots takes: one per partial block.
  int32_t PublishBlocks(std::span<const int32_t> slots) const;

  // Contexts published and still whole.
  int32_t resident();

 private:
  uint64_t BlockKey(uint64_t key, int32_t layer, int32_t index) const;
  bool Whole(const CompressedContext& context) const;
  // Forgets contexts that lost a block, when any block lost its key since the last look.
  void Prune();

  BlockPool& pool_;
  absl::flat_hash_map<uint64_t, CompressedContext> contexts_;
  uint64_t pruned_at_drops_ = 0;
};

}  // namespace winnow::cache
