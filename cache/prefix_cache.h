// Prefix caching over per-(sequence, layer) block tables. A full block of prompt tokens is
// identified by a content key that chains every token before it: two prompts that agree from
// position 0 through the end of block i have equal keys for blocks 0..i, and their K/V there
// are equal too (keys are cached after RoPE at absolute positions, which agree). Each layer's
// block of that range gets its own key, so a hit attaches one block per layer.
//
// Keys are 64-bit hashes from absl::Hash, which is seeded per process: a client cannot craft a
// collision offline, and a chance collision among 2^64 values is not a practical concern. A
// per-request salt enters the chain at its start, so requests with different salts never share
// a block (and cannot learn from TTFT whether another tenant sent the same prefix).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sequence_kv.h"

namespace winnow::cache {

// Keys of the full blocks of a prompt, one per block. A negative token id marks a position
// whose input is the next row of `embeddings` (`hidden` floats): its row is hashed instead.
std::vector<uint64_t> PrefixBlockKeys(std::span<const int32_t> tokens,
                                      std::span<const float> embeddings, int32_t hidden,
                                      int32_t block_size, std::string_view salt);

// `chain` extended by one embedding row (an input position that is not a token id), hashed by
// its bits: equal floats give equal K/V, and -0.0 vs 0.0 are told apart.
uint64_t HashEmbeddingRow(uint64_t chain, std::span<const float> row);

// The key of one layer's block of a prompt block.
uint64_t LayerBlockKey(uint64_t block_key, int32_t layer);

// How many leading blocks of `keys` (at most `max_blocks`) are cached in every layer.
int32_t CountCachedBlocks(const BlockPool& pool, std::span<const uint64_t> keys,
                          int32_t num_layers, int32_t max_blocks);

// Of the first `num_blocks` cached blocks (every layer), how many sit in the free queue: using
// them takes them out of it.
int32_t CountFreeCachedBlocks(const BlockPool& pool, std::span<const uint64_t> keys,
                              int32_t num_layers, int32_t num_blocks);

// Attaches the first `num_blocks` cached blocks of every layer to `kv`, which must be empty.
void AttachCachedPrefix(BlockPool& pool, std::span<const uint64_t> keys, int32_t num_blocks,
                        SequenceKv& kv);

// Keys blocks [from, to) of every layer of `kv`, which hold those prompt blocks' K/V in order
// (an uncompressed cache), so later prompts can find them.
void PublishPrefixBlocks(BlockPool& pool, std::span<const uint64_t> keys, int32_t from,
                         int32_t to, const SequenceKv& kv);

}  // namespace winnow::cache
