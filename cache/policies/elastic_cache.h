// Elastic Cache (Liu et al., ECCV 2024; brief specs/elastic-cache.md): "one sequence, two
// policies".
//   - Prefill (once, after the last chunk): importance of each prompt token per layer = the
//     attention probability it receives summed over every prompt query row, averaged over all
//     query heads. The top tokens of each layer become anchors (positions shared by the layer's
//     KV heads); every other token is merged into its nearest anchor by position (ties to the
//     left anchor) as the unweighted mean of the bucket's K and of its V, per KV head. The first
//     `sinks` tokens and the last `protect_last` prompt tokens are kept verbatim.
//   - Decode: no scores. After each step, while the cache is longer than floor(budget x tokens
//     seen), the entry at the fixed logical index fix = kept + fix_offset is evicted, so the
//     cache is a frozen compressed prompt [0, fix) followed by a FIFO of recent entries.
// Decisions on the brief's open points are in docs/compression.md ("## elastic_cache").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Params (all optional):
//   sinks        (1)   leading tokens kept verbatim, never merged or evicted;
//   protect_last (1)   last prompt tokens kept verbatim at prefill (FIFO material at decode);
//   fix_offset   (-25) the paper's P: fix = kept + P when negative, the absolute index P when >= 0;
//   merge        (true) false = plain eviction of the non-anchors (the Table 3b ablation);
//   decode       (fixed_point|off) decode-time eviction;
//   evict_every  (1)   evict once the cache is this many entries over the cap (1 = the paper's
//                      one entry per step; larger values batch the compactions).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateElasticCachePolicy(
    const PolicyConfig& config, const PolicyContext& context);

// One layer's prefill plan, exposed for tests: `scores` (one per prompt token, higher = more
// important), `keep` entries in all. Returns the kept slots (sinks, anchors, protected tail,
// ascending) and, per kept slot, the ascending source slots merged into it. When `keep` leaves
// no room for an anchor besides the protected tokens, nothing is protected and all `keep`
// entries are anchors. keep >= n returns every slot unmerged.
struct ElasticLayerPlan {
  std::vector<int32_t> kept;
  std::vector<std::vector<int32_t>> groups;
};
ElasticLayerPlan PlanElasticLayer(const std::vector<float>& scores, int32_t keep, int32_t sinks,
                                  int32_t protect_last);

}  // namespace winnow::cache::policies
