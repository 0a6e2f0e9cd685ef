// Where the compression hooks score the K/V: the one seam between the policies' machinery
// (cache/compression.h, the TokenSelect selector) and the device that holds the data. The host
// implementation (cache/host_scoring.h) runs kernels/cpu over the pool's arena on the host
// threads; a GPU forward implements it over its device arena (model/cuda_kv_device.h). The
// forward backend that runs the model hands its own to the worker (model/forward_backend.h),
// so the machinery never asks where the data is, and a policy that needs a new score on the
// device adds one method here and one in each implementation.
//
// Every call is ordered after the forwards that wrote the data and before the next forward;
// results written to host memory are complete when the call returns. Pointers in a ScoreInput,
// like the outputs, are host memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/policies/pooling.h"
#include "cache/query_capture.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache {

// A SnapKV-shaped prompt plan for one layer, decided and applied where the K/V are: the window
// rows' column sums, pooled along the keys and folded over each KV head's query heads, a per-KV-
// head top-k of the keys before the window with the window kept, and the layer compacted to it
// (cache/policies/snapkv.cc decides the same on the host).
struct WindowTopKRequest {
  std::span<const int32_t> block_table;  // the layer's
  int32_t num_slots = 0;                 // keys in the layer: the whole prompt
  // The window's query rows on the device (QueryCapture::device_rows); visible[r] = the row's
  // position + 1.
  DeviceRows device_rows;
  std::span<const int32_t> visible;
  int32_t num_heads = 0;
  float scale = 1.0f;
  int32_t window = 1;  // slots [num_slots - window, num_slots) are kept, the keys before scored
  int32_t kernel = 1;
  policies::Pooling pooling = policies::Pooling::kAvg;
  policies::GroupAggregation folding = policies::GroupAggregation::kMean;
  int32_t keep = 1;  // slots kept per KV head, window included; 1 <= keep < num_slots
  // Host memory for num_kv_heads x keep ints: each KV head's kept slots, ascending. Written by
  // the next Flush(); the device data is compacted to them in stream order before that.
  int32_t* kept_slots = nullptr;
};

class ScoringBackend {
 public:
  virtual ~ScoringBackend() = default;

  // kernels::AttentionProbabilities, kernels::AccumulateAttentionColumns (adds into
  // column_sums) and kernels::ValueNorms over the backend's copy of the data. `device`, when its
  // q is not null, holds the query rows already on the device (QueryCapture::device_rows) and
  // in.q is not read; only a device backend is given one.
  virtual absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                              float* log_normalizer) = 0;
  virtual absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in,
                                                  float* column_sums,
                                                  const DeviceRows& device) = 0;
  // column_sums = (not +=) the column sums AccumulateAttentionColumns adds, num_heads x
  // in.num_slots, without waiting: complete after the next Flush(), which a device forward
  // calls before it returns, so a QueryCapture::layer_done hook may ask and read the result
  // once the forward is done. The host computes it at once.
  virtual absl::Status ColumnSumsDeferred(const kernels::ScoreInput& in, float* column_sums,
                                          const DeviceRows& device) {
    std::fill(column_sums, column_sums + int64_t{in.num_heads} * in.num_slots, 0.0f);
    return AccumulateAttentionColumns(in, column_sums, device);
  }
  virtual absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                                  float* norms) = 0;
  // ValueNorms without waiting, complete after the next Flush() (as ColumnSumsDeferred).
  virtual absl::Status ValueNormsDeferred(std::span<const int32_t> table, int32_t num_slots,
                                          float* norms) {
    return ValueNorms(table, num_slots, norms);
  }
  // TokenSelect's head soft vote (kernels/cpu/token_select_vote.h) over the candidate slots
  // [begin, end) of one layer (`table`) for one query (num_heads x head_dim floats):
  // vote[t - begin] = sum over heads of softmax over the candidates of scale * q_h . k_t, query
  // head h reading KV head h / group, or h % num_kv_heads with `gqa_mod`.
  virtual absl::Status TokenSelectVote(std::span<const int32_t> table,
                                       std::span<const float> query, int32_t num_heads,
                                       int32_t begin, int32_t end, float scale, bool gqa_mod,
                                       float* vote) = 0;

  // WindowTopKRequest on the device, without waiting for it: a backend whose K/V live on a
  // device implements it and a forward on that device calls it (QueryCapture::device_plan);
  // the host backend has the rows on the host and plans there (Unimplemented here).
  virtual absl::Status CompactToWindowTopK(const WindowTopKRequest& request) {
    return absl::UnimplementedError("this scoring backend plans on the host");
  }
  // Waits for the queued device work and completes the host outputs of the calls that defer
  // them (ColumnSumsDeferred, ValueNormsDeferred, CompactToWindowTopK). Nothing to do on the
  // host.
  virtual absl::Status Flush() { return absl::OkStatus(); }

  // The host threads, idle while the hooks run (between forwards, or between a forward's
  // kernels for a selector), for the policies' own work on the scores: per-head pooling and
  // top-k (CompressionPolicy::threads()).
  virtual kernels::ThreadPool& host_threads() = 0;
};

}  // namespace winnow::cache
