// Post-RoPE query rows captured during a forward, for compression policies that score the cache
// with an observation window. Lives in cache/ so that the compression machinery (cache/) and the
// forward (model/) share it without model/ being a dependency of cache/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kernels/cpu/attention.h"

namespace winnow::cache {

class ScoringBackend;
class SequenceKv;

// Query rows a forward on a device holds there (QueryCapture::device_rows), for that device's
// scoring backend.
struct DeviceRows {
  const void* q = nullptr;  // count x num_heads x head_dim in the KV dtype; null: none
  int32_t count = 0;
  // Optional, count x num_heads: each row's log2 of the sum over the keys it sees of
  // 2^(scale * log2(e) * q.k), which the forward's attention computed (FlashInfer's log-sum-exp,
  // kernels/cuda/column_sums.h); null where it did not.
  const float* lse_log2 = nullptr;
  int64_t row_bytes = 0;  // of one row of q (num_heads x head_dim values)
  int32_t num_heads = 0;  // log-sum-exps per row

  // The last n rows (0 <= n <= count).
  DeviceRows Last(int32_t n) const {
    DeviceRows last = *this;
    const int32_t skip = count - n;
    last.count = n;
    if (q != nullptr) last.q = static_cast<const std::byte*>(q) + skip * row_bytes;
    if (lse_log2 != nullptr) last.lse_log2 = lse_log2 + int64_t{skip} * num_heads;
    return last;
  }
};

// Rows of tokens at positions >= first_position are appended, per layer, as num_heads x head_dim
// floats each, in position order (possibly across chunks).
struct QueryCapture {
  int32_t first_position = 0;
  std::vector<std::vector<float>> per_layer;  // resized by the forward to num_layers
  std::vector<int32_t> positions;             // position of each captured row
  // Optional: called by the forward right after it appended `layer`'s rows (that layer's new
  // K/V are already in the cache), so rows can be consumed layer by layer instead of holding
  // every layer's rows of a long chunk at once; `scoring` is the forward's own (where its K/V
  // are). It may shrink per_layer[layer].
  std::function<void(int32_t layer, const SequenceKv& kv, ScoringBackend& scoring)> layer_done;
  // With layer_done: rows at positions before this are consumed by layer_done alone, so a
  // forward that can offer them in device_rows need not copy them to the host.
  int32_t host_from = 0;
  // Set by a forward whose query rows live on a device (the CUDA worker), for the duration of
  // layer_done: this chunk's captured rows of that layer there, in `positions` order, with their
  // log-sum-exps from the layer's attention; per_layer then received only the rows at positions
  // >= host_from. Empty otherwise.
  DeviceRows device_rows;
  // Optional: a plan the device decides and applies while the forward runs
  // (ScoringBackend::CompactToWindowTopK), or the window's scores it leaves for a plan the host
  // makes (ScoringBackend::ColumnSumsDeferred, ValueNormsDeferred). A forward whose query rows
  // live on a device, and
  // whose sequence holds no block shared with another (the compaction is in place), calls it
  // instead of copying rows to the host: once per layer, after that layer's attention has read
  // the whole cache, with device_rows set as for layer_done. Other forwards ignore it and
  // capture rows as usual.
  std::function<void(int32_t layer, const SequenceKv& kv, ScoringBackend& scoring)> device_plan;

  // Optional, with layer_done: the fold (sum or maximum) of the captured rows' attention
  // probabilities on each slot, which layer_done wants. A forward that computes its attention
  // on the host (the CPU worker) folds them while that attention runs
  // (kernels::AttentionSequence::column_fold), wherever it sees every slot before each row (no
  // sliding window or selection cutting a row's view): `folded` then holds num_heads x the
  // layer's slots and folded_layer is that layer when layer_done runs. Elsewhere folded_layer
  // is -1 and layer_done asks the scoring backend, which takes two more passes over the keys.
  std::optional<kernels::ColumnReduce> fold;
  std::vector<float> folded;
  int32_t folded_layer = -1;

  int32_t num_rows() const { return static_cast<int32_t>(positions.size()); }
  void Clear() {
    for (std::vector<float>& rows : per_layer) rows.clear();
    positions.clear();
    folded_layer = -1;
  }
};

}  // namespace winnow::cache
