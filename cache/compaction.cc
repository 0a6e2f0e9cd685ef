#include "cache/compaction.h"

#include <cstring>

namespace winnow::cache {
namespace {

// The float row of `slot` for one head: K when `values` is false, V otherwise.
float* Row(BlockPool& pool, const SequenceKv& kv, int32_t layer, int32_t kv_head, int32_t slot,
           bool values) {
  const int32_t block_size = kv.block_size();
  const int32_t block = kv.block_table(layer)[slot / block_size];
  float* base = values ? pool.Values(block, kv_head) : pool.Keys(block, kv_head);
  return base + int64_t{slot % block_size} * pool.layout().head_dim;
}

}  // namespace

absl::StatusOr<CompactionStats> ApplyKeepPlan(const policies::KeepPlan& plan, SequenceKv& kv,
                                              BlockPool& pool) {
  const KvLayout& layout = pool.layout();
  policies::ModelDims dims;
  dims.num_layers = kv.num_layers();
  dims.num_kv_heads = layout.num_kv_heads;
  dims.num_heads = layout.num_kv_heads;
  dims.head_dim = layout.head_dim;
  dims.block_size = layout.block_size;
  if (absl::Status s = plan.Validate(dims, [&kv](int32_t l) { return kv.num_slots(l); });
      !s.ok()) {
    return s;
  }
  CompactionStats stats;
  if (plan.empty()) return stats;

  const int32_t d = layout.head_dim;
  std::vector<float> scratch;
  const int32_t used_before = kv.num_blocks_held();
  for (int32_t l = 0; l < static_cast<int32_t>(plan.layers.size()); ++l) {
    const policies::LayerKeep& keep = plan.layers[l];
    if (keep.untouched()) continue;
    const int32_t kept = keep.kept();
    const int32_t before = kv.num_slots(l);
    if (kept == before && keep.merge.empty()) {
      // Keeping every slot of an ascending list means the identity: nothing moves.
      continue;
    }
    scratch.resize(static_cast<size_t>(kept) * d);
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      const std::vector<int32_t>& slots = keep.heads[h];
      const bool merged = !keep.merge.empty() && !keep.merge[h].empty();
      // Entries already in place (slot i kept as entry i, unmerged) need no copy. Decode-time
      // eviction (Elastic Cache's fixed point) drops a slot near the end of a long cache every
      // step; skipping the unchanged prefix makes that cost the tail, not the whole layer.
      int32_t in_place = 0;
      while (!merged && in_place < kept && slots[in_place] == in_place) ++in_place;
      for (bool values : {false, true}) {
        for (int32_t i = in_place; i < kept; ++i) {
          float* dst = scratch.data() + int64_t{i} * d;
          if (!merged) {
            std::memcpy(dst, Row(pool, kv, l, h, slots[i], values), d * sizeof(float));
            continue;
          }
          const std::vector<int32_t>& sources = keep.merge[h][i];
          std::fill(dst, dst + d, 0.0f);
          for (int32_t src : sources) {
            const float* row = Row(pool, kv, l, h, src, values);
            for (int32_t k = 0; k < d; ++k) dst[k] += row[k];
          }
          const float inv = 1.0f / static_cast<float>(sources.size());
          for (int32_t k = 0; k < d; ++k) dst[k] *= inv;
        }
        for (int32_t i = in_place; i < kept; ++i) {
          std::memcpy(Row(pool, kv, l, h, i, values), scratch.data() + int64_t{i} * d,
                      d * sizeof(float));
        }
      }
    }
    kv.Truncate(pool, l, kept);
    stats.slots_removed += before - kept;
    ++stats.layers_changed;
  }
  stats.blocks_freed = used_before - kv.num_blocks_held();
  return stats;
}

}  // namespace winnow::cache
