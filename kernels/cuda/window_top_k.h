// SnapKV-shaped keep sets decided on the GPU: the window's column sums pooled along the keys,
// folded over each KV head's query heads, and a per-KV-head top-k with the window itself kept,
// as cache/policies/snapkv.cc decides them on the host (PoolRowPrefixes, AggregateGroups,
// TopKWithForced over SinksAndWindow(n, 0, window)). The kept slots then feed CompactLayer
// (compaction.h) directly, so a prompt's plan never waits for the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace winnow::kernels::cuda {

enum class KeyPooling : int32_t { kNone, kAvg, kMax };   // policies::Pooling
enum class HeadFolding : int32_t { kSum, kMean, kMax };  // policies::GroupAggregation

struct WindowScoreShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t num_slots = 0;  // n: keys in the layer
  int32_t prefix = 0;     // keys [0, prefix) are scored; [prefix, n) is the window
  int32_t kernel = 1;     // pooling width 2 * (kernel / 2) + 1, clamped at both ends
  KeyPooling pooling = KeyPooling::kAvg;
  HeadFolding folding = HeadFolding::kMean;
};

// scores[g * prefix + j], j < prefix: the query heads of KV head g (h / (num_heads /
// num_kv_heads) == g) folded (sum, mean or max, in head order) over each head's pooled sums,
// where a head's row is sums[h * num_slots + i] for i < prefix and pooling looks at [j - half,
// j + half] within [0, prefix) (an average divides by the full width, as Pool1d does).
absl::Status PoolAndFoldWindowScores(const float* sums, const WindowScoreShape& shape,
                                     float* scores, cudaStream_t stream);

// kept[g * keep + i], ascending per KV head g: the keep - (n - prefix) best keys of
// scores[g * prefix + .] (ties to the lower slot), then the window [prefix, n); when keep <=
// n - prefix, the last `keep` slots. 1 <= keep <= n. One block per KV head: a radix select of
// the threshold, then an ordered collection, so the result equals the host's TopKWithForced on
// the same scores exactly.
absl::Status TopKWithWindow(const float* scores, int32_t num_kv_heads, int32_t prefix,
                            int32_t num_slots, int32_t keep, int32_t* kept, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
