#include "cache/compaction.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_device.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/vec.h"

namespace winnow::cache {
namespace {

// The stored row of `slot` for one head: K when `values` is false, V otherwise.
std::byte* Row(BlockPool& pool, const SequenceKv& kv, int32_t layer, int32_t kv_head,
               int32_t slot, bool values) {
  const int32_t block_size = kv.block_size();
  return pool.Row(kv.block_table(layer)[slot / block_size], kv_head, slot % block_size, values);
}

// A merged slot's bias gain is capped: an anchor the observed rows barely saw would otherwise
// get a huge one (and a floor on its own mass keeps the ratio finite).
constexpr float kMaxBiasGain = 3.912f;  // log(50)
constexpr float kMinOwnMass = 1e-6f;    // of the head's largest mass

// KeepKV's groups for one KV head: the evicted slots each kept entry absorbs, each evicted slot
// (below `num_slots`, not kept) joining the absorbing entry whose key is the most similar
// (cosine). Empty when no kept slot lies in the absorbing range.
std::vector<std::vector<int32_t>> GroupByKey(BlockPool& pool, const SequenceKv& kv, int32_t l,
                                             int32_t h, const policies::LayerKeep& keep) {
  const int32_t d = pool.layout().head_dim;
  const std::vector<int32_t>& slots = keep.heads[h];
  std::vector<std::vector<int32_t>> absorbed(slots.size());
  std::vector<int32_t> anchors;  // entry indices
  for (int32_t i = 0; i < static_cast<int32_t>(slots.size()); ++i) {
    if (slots[i] >= keep.absorb_begin && slots[i] < keep.absorb_end) anchors.push_back(i);
  }
  if (anchors.empty()) return absorbed;
  auto unit_key = [&](int32_t slot, float* out) {
    kernels::DecodeKv(pool.layout().dtype, Row(pool, kv, l, h, slot, false), d, out);
    float norm = 0.0f;
    for (int32_t k = 0; k < d; ++k) norm += out[k] * out[k];
    const float inv = norm > 0.0f ? 1.0f / std::sqrt(norm) : 0.0f;
    for (int32_t k = 0; k < d; ++k) out[k] *= inv;
  };
  std::vector<float> anchor_keys(anchors.size() * d);
  for (size_t a = 0; a < anchors.size(); ++a) unit_key(slots[anchors[a]], &anchor_keys[a * d]);
  std::vector<float> key(d);
  size_t next_kept = 0;
  for (int32_t slot = 0; slot < kv.num_slots(l); ++slot) {
    if (next_kept < slots.size() && slots[next_kept] == slot) {
      ++next_kept;
      continue;
    }
    unit_key(slot, key.data());
    size_t best = 0;
    float best_dot = -2.0f;
    for (size_t a = 0; a < anchors.size(); ++a) {
      const float dot = kernels::vec::Dot(key.data(), &anchor_keys[a * d], d);
      if (dot > best_dot) best_dot = dot, best = a;
    }
    if (best_dot >= keep.min_similarity) absorbed[anchors[best]].push_back(slot);
  }
  return absorbed;
}

// One kept entry's new value, decoded: the mean of its merge group's values (Elastic Cache), or
// the mass-weighted mean of its own and its absorbed slots' (KeepKV), into `out`; returns the
// entry's new logit bias (its own, plus log(group mass / own mass) when it absorbed any).
float MergedRow(BlockPool& pool, const SequenceKv& kv, int32_t l, int32_t h, bool values,
                std::span<const int32_t> sources, const float* mass, float own_floor,
                float own_bias, float* row, float* out) {
  const int32_t d = pool.layout().head_dim;
  std::fill(out, out + d, 0.0f);
  float total = 0.0f;
  for (size_t i = 0; i < sources.size(); ++i) {
    const float w = mass == nullptr ? 1.0f
                    : i == 0        ? std::max(mass[sources[0]], own_floor)
                                    : mass[sources[i]];
    kernels::DecodeKv(pool.layout().dtype, Row(pool, kv, l, h, sources[i], values), d, row);
    for (int32_t k = 0; k < d; ++k) out[k] += w * row[k];
    total += w;
  }
  const float inv = 1.0f / total;
  for (int32_t k = 0; k < d; ++k) out[k] *= inv;
  if (mass == nullptr) return own_bias;
  const float own = std::max(mass[sources[0]], own_floor);
  return own_bias + std::min(std::log(total / own), kMaxBiasGain);
}

// Gathers each KV head's kept rows of `layer` (or the merges of its groups) to the front, with
// their logit biases when the pool has them. Kept rows are gathered as stored bytes, so a copy
// never rounds (a q8_0 row keeps its blocks bit for bit); only a merged row is computed, in
// float32 from the decoded sources, and stored back in the pool's dtype. A mass-merged entry
// keeps its own key (only its value and bias change). Rows go to a scratch buffer first, then
// back front to back, so any valid plan is safe in place. The biases of the slots past the new
// end of the last block are zeroed, as a fresh block's are, for the tokens appended there.
void CompactLayerOnHost(BlockPool& pool, const SequenceKv& kv, int32_t l,
                        const policies::LayerKeep& keep) {
  const KvLayout& layout = pool.layout();
  const int32_t d = layout.head_dim;
  const int32_t bs = layout.block_size;
  const int64_t row_bytes = layout.row_bytes();
  const int32_t kept = keep.kept();
  std::vector<std::byte> scratch(static_cast<size_t>(kept) * row_bytes);
  std::vector<float> bias(kept);
  std::vector<float> merged(d);
  std::vector<float> row(d);
  std::vector<int32_t> sources;
  for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
    const std::vector<int32_t>& slots = keep.heads[h];
    const bool mean_merge = !keep.merge.empty() && !keep.merge[h].empty();
    const bool mass_merge = keep.merges_mass();
    const std::vector<std::vector<int32_t>> absorbed =
        mass_merge ? GroupByKey(pool, kv, l, h, keep) : std::vector<std::vector<int32_t>>{};
    const float* mass = mass_merge ? keep.mass[h].data() : nullptr;
    const float own_floor =
        mass_merge ? kMinOwnMass * *std::max_element(keep.mass[h].begin(), keep.mass[h].end())
                   : 0.0f;
    auto head_bias = [&](int32_t slot) -> float& {
      return pool.Bias(kv.block_table(l)[slot / bs], h)[slot % bs];
    };
    // Entries already in place (slot i kept as entry i, unmerged) need no copy. Decode-time
    // eviction (Elastic Cache's fixed point) drops a slot near the end of a long cache every
    // step; skipping the unchanged prefix makes that cost the tail, not the whole layer.
    int32_t in_place = 0;
    while (!mean_merge && !mass_merge && in_place < kept && slots[in_place] == in_place) {
      ++in_place;
    }
    for (int32_t i = in_place; i < kept; ++i) {
      bias[i] = layout.logit_bias ? head_bias(slots[i]) : 0.0f;
    }
    for (bool values : {false, true}) {
      for (int32_t i = in_place; i < kept; ++i) {
        std::byte* dst = scratch.data() + int64_t{i} * row_bytes;
        if (mean_merge) {
          sources = keep.merge[h][i];
        } else if (mass_merge && values && !absorbed[i].empty()) {
          sources.assign(1, slots[i]);
          sources.insert(sources.end(), absorbed[i].begin(), absorbed[i].end());
        } else {
          std::memcpy(dst, Row(pool, kv, l, h, slots[i], values), row_bytes);
          continue;
        }
        const float b = MergedRow(pool, kv, l, h, values, sources, mass, own_floor,
                                  bias[i], row.data(), merged.data());
        if (mass_merge) bias[i] = b;
        kernels::EncodeKv(layout.dtype, merged.data(), d, dst);
      }
      for (int32_t i = in_place; i < kept; ++i) {
        std::memcpy(Row(pool, kv, l, h, i, values), scratch.data() + int64_t{i} * row_bytes,
                    row_bytes);
      }
    }
    if (!layout.logit_bias) continue;
    for (int32_t i = in_place; i < kept; ++i) head_bias(i) = bias[i];
    for (int32_t slot = kept; slot % bs != 0; ++slot) head_bias(slot) = 0.0f;
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

  for (const policies::LayerKeep& keep : plan.layers) {
    if (keep.merges_mass() && (!layout.logit_bias || pool.device() != nullptr || data_moved)) {
      return absl::FailedPreconditionError(
          "compaction: a mass-preserving merge needs a host KV pool with logit biases");
    }
  }

  const int32_t used_before = kv.num_blocks_held();
  for (int32_t l = 0; l < static_cast<int32_t>(plan.layers.size()); ++l) {
    const policies::LayerKeep& keep = plan.layers[l];
    if (keep.untouched()) continue;
    const int32_t kept = keep.kept();
    const int32_t before = kv.num_slots(l);
    if (kept == before && keep.merge.empty() && !keep.merges_mass()) {
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
