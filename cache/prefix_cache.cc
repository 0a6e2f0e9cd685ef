#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace winnow::cache {

std::vector<uint64_t> PrefixBlockKeys(std::span<const int32_t> tokens,
                                      std::span<const float> embeddings, int32_t hidden,
                                      int32_t block_size, std::string_view salt) {
  std::vector<uint64_t> keys;
  uint64_t chain = absl::HashOf(salt);
  size_t next_row = 0;
  const size_t full_blocks = tokens.size() / block_size;
  for (size_t b = 0; b < full_blocks; ++b) {
    const std::span<const int32_t> ids = tokens.subspan(b * block_size, block_size);
    chain = absl::HashOf(chain, absl::MakeConstSpan(ids.data(), ids.size()));
    for (int32_t id : ids) {
      if (id < 0) chain = HashEmbeddingRow(chain, embeddings.subspan(next_row++ * hidden, hidden));
    }
    keys.push_back(chain);
  }
  return keys;
}

uint64_t HashEmbeddingRow(uint64_t chain, std::span<const float> row) {
  std::vector<uint32_t> bits(row.size());
  std::memcpy(bits.data(), row.data(), row.size_bytes());
  return absl::HashOf(chain, bits);
}

uint64_t LayerBlockKey(uint64_t block_key, int32_t layer) {
  return absl::HashOf(block_key, layer);
}

int32_t CountCachedBlocks(const BlockPool& pool, std::span<const uint64_t> keys,
                          int32_t num_layers, int32_t max_blocks) {
  const int32_t limit = std::min(max_blocks, static_cast<int32_t>(keys.size()));
  for (int32_t b = 0; b < limit; ++b) {
    for (int32_t l = 0; l < num_layers; ++l) {
      if (pool.FindCached(LayerBlockKey(keys[b], l)) < 0) return b;
    }
  }
  return std::max(limit, 0);
}

int32_t CountFreeCachedBlocks(const BlockPool& pool, std::span<const uint64_t> keys,
                              int32_t num_layers, int32_t num_blocks) {
  int32_t free = 0;
  for (int32_t b = 0; b < num_blocks; ++b) {
    for (int32_t l = 0; l < num_layers; ++l) {
      free += pool.references(pool.FindCached(LayerBlockKey(keys[b], l))) == 0 ? 1 : 0;
    }
  }
  return free;
}

void AttachCachedPrefix(BlockPool& pool, std::span<const uint64_t> keys, int32_t num_blocks,
                        SequenceKv& kv) {
  for (int32_t b = 0; b < num_blocks; ++b) {
    for (int32_t l = 0; l < kv.num_layers(); ++l) {
      kv.AppendSharedBlock(pool, l, pool.FindCached(LayerBlockKey(keys[b], l)));
    }
  }
}

void PublishPrefixBlocks(BlockPool& pool, std::span<const uint64_t> keys, int32_t from,
                         int32_t to, const SequenceKv& kv) {
  for (int32_t b = from; b < to; ++b) {
    for (int32_t l = 0; l < kv.num_layers(); ++l) {
      pool.SetKey(kv.block_table(l)[b], LayerBlockKey(keys[b], l));
    }
  }
}

}  // namespace winnow::cache
