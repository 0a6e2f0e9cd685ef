// What a compression plan is: which slots every (layer, KV head) keeps, and the geometry it is
// checked against. The policies return plans (cache/policies/policy.h); the compaction applies
// them (cache/compaction.h), on the host or through a device (cache/kv_device.h). Kept apart
// from the policy interface so that the pool and the device seam need not know the policies.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"

// The plan's types live in the policies' namespace, where every policy names them.
namespace winnow::cache::policies {

// Geometry of the model and cache a plan (and a policy) runs against.
struct ModelDims {
  int32_t num_layers = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // KV heads; query head h reads KV head h / (num_heads/num_kv_heads)
  int32_t head_dim = 0;
  int32_t block_size = 0;    // slots per KV block
  float attention_scale = 0.0f;  // the model's softmax scale; 0: 1 / sqrt(head_dim)
  // [layer] the sliding window in slots (0: full attention); empty when no layer slides.
  std::vector<int32_t> windows = {};
  // Whether the cache adds a per-slot logit bias (KvLayout::logit_bias), which a plan's
  // mass-preserving merge (LayerKeep::mass) needs.
  bool logit_bias = false;

  int32_t group_size() const { return num_heads / num_kv_heads; }
  int32_t WindowOf(int32_t layer) const { return windows.empty() ? 0 : windows[layer]; }
  float AttentionScale() const {
    return attention_scale > 0.0f ? attention_scale
                                  : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
};

// Per layer, per KV head: the slots to keep, strictly ascending, the same count for every head
// of a layer (counts may differ between layers). A layer whose `heads` is empty is untouched.
// Optional merging (Elastic Cache): when `merge` is non-empty for a head, kept entry i becomes
// the mean of the K (and of the V) of slots merge[i] instead of a copy of heads[h][i]; the
// sources of consecutive entries must be ascending and disjoint, each containing heads[h][i].
// Optional mass-preserving merge (KeepKV): when `mass` is non-empty, mass[h][s] is the
// attention the observed rows put on slot s of KV head h (any scale common to the head), for
// every slot of the layer. Each evicted slot then joins the kept slot of [absorb_begin,
// absorb_end) whose key is the most similar (cosine) if that cosine is at least
// min_similarity (else it is dropped); that slot keeps its key, its value becomes its group's
// mass-weighted mean and its logit bias gains log(group mass / own mass), so the observed
// rows' attention mass and output are preserved (exactly, for one row, when every evicted
// slot merges). Needs a pool with logit biases (KvLayout::logit_bias); not with `merge`.
struct LayerKeep {
  std::vector<std::vector<int32_t>> heads;               // [kv_head][i] slot kept as entry i
  std::vector<std::vector<std::vector<int32_t>>> merge;  // [kv_head][i] source slots (optional)
  std::vector<std::vector<float>> mass = {};             // [kv_head][slot] (optional)
  int32_t absorb_begin = 0;  // with mass: the kept slots that may absorb evicted ones
  int32_t absorb_end = 0;
  float min_similarity = -1.0f;

  bool untouched() const { return heads.empty(); }
  bool merges_mass() const { return !mass.empty(); }
  int32_t kept() const { return heads.empty() ? -1 : static_cast<int32_t>(heads[0].size()); }
};

struct KeepPlan {
  std::vector<LayerKeep> layers;  // empty, or one per layer

  bool empty() const;  // nothing to do
  // InvalidArgument when a layer's heads are not ascending/unique/in range, differ in count,
  // keep nothing, or merge sources break the rules above. num_slots(layer) gives each layer's
  // current slot count.
  absl::Status Validate(const ModelDims& dims,
                        const std::function<int32_t(int32_t)>& num_slots) const;
};

// Confines every sliding-window layer of a plan to what its next token reads, the layer's last
// window - 1 slots: a plan that keeps at least that many keeps exactly those (the layer then
// attends as the full cache does); one that keeps fewer keeps as many of the newest, so that
// while decoding it never reads further back than its window and reads what the full cache's
// layer reads once it holds window - 1 slots. Merges (of either kind) on such layers are
// dropped. Older slots would be cut from the layer anyway (the blocks behind a window are given
// back), and while they stay they show the layer distances its training never did: Gemma 3
// 270M's replies turn to noise.
// num_slots(layer): the layer's slots before the plan. Applied by the compression session to
// every plan, at prefill and while decoding; a policy that keeps per-slot state (h2o) applies
// KeepSlidingWindow itself before updating it, so the session's pass changes nothing.
void KeepSlidingWindows(KeepPlan& plan, const ModelDims& dims,
                        const std::function<int32_t(int32_t)>& num_slots);
// The same for one layer of num_slots slots whose window is `window` (0: full attention).
void KeepSlidingWindow(LayerKeep& keep, int32_t num_slots, int32_t window);

}  // namespace winnow::cache::policies
