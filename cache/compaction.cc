#include "cache/compaction.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_device.h"
#include "kernels/cpu/kv_dtype.h"

namespace winnow::cache {
namespace {

// The stored row of `slot` for one head: K when `values` is false, V otherwise.
std::byte* Row(BlockPool& pool, const SequenceKv& kv, int32_t layer, int32_t kv_head,
               int32_t slot, bool values) {
  const int32_t block_size = kv.block_size();
  return pool.Row(kv.block_table(layer)[slot / block_size], kv_head, slot % block_size, values);
}

// Gathers each KV head's kept rows of `layer` (or the means of its merge groups) to the front.
// Kept rows are gathered as stored bytes, so a copy never rounds (a q8_0 row keeps its blocks
// bit for bit); only a merged row is computed, in float32 from the decoded sources, and stored
// back in the pool's dtype. Rows go to a scratch buffer first, then back front to back, so any
// valid plan is safe in place.
void CompactLayerOnHost(BlockPool& pool, const SequenceKv& kv, int32_t l,
                        const policies::LayerKeep& keep) {
  const KvLayout& layout = pool.layout();
  const int32_t d = layout.head_dim;
  const int64_t row_bytes = layout.row_bytes();
  const kernels::KvDtype dtype = layout.dtype;
  const int32_t kept = keep.kept();
  std::vector<std::byte> scratch(static_cast<size_t>(kept) * row_bytes);
  std::vector<float> sum(d);
  std::vector<float> row(d);
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
        std::byte* dst = scratch.data() + int64_t{i} * row_bytes;
        if (!merged) {
          std::memcpy(dst, Row(pool, kv, l, h, slots[i], values), row_bytes);
          continue;
        }
        const std::vector<int32_t>& sources = keep.merge[h][i];
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int32_t src : sources) {
          kernels::DecodeKv(dtype, Row(pool, kv, l, h, src, values), d, row.data());
          for (int32_t k = 0; k < d; ++k) sum[k] += row[k];
        }
        const float inv = 1.0f / static_cast<float>(sources.size());
        for (int32_t k = 0; k < d; ++k) sum[k] *= inv;
        kernels::EncodeKv(dtype, sum.data(), d, dst);
      }
      for (int32_t i = in_place; i < kept; ++i) {
        std::memcpy(Row(pool, kv, l, h, i, values), scratch.data() + int64_t{i} * row_bytes,
                    row_bytes);
      }
    }
  }
}

}  // namespace

absl::StatusOr<CompactionStats> ApplyKeepPlan(const policies::KeepPlan& plan, SequenceKv& kv,
                                              BlockPool& pool, bool data_moved) {
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
  for (int32_t l = 0; l < static_cast<int32_t>(plan.layers.size()); ++l) {
    if (!plan.layers[l].untouched() && kv.num_dropped(l) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "compaction: layer ", l, " returned the blocks behind its sliding window"));
    }
  }

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
    if (data_moved) {
      // Nothing to copy.
    } else if (KvDevice* device = pool.device(); device != nullptr) {
      if (absl::Status s = device->CompactLayer(kv.block_table(l), keep); !s.ok()) return s;
    } else {
      CompactLayerOnHost(pool, kv, l, keep);
    }
    kv.Truncate(pool, l, kept);
    stats.slots_removed += before - kept;
    ++stats.layers_changed;
  }
  stats.blocks_freed = used_before - kv.num_blocks_held();
  return stats;
}

}  // namespace winnow::cache
