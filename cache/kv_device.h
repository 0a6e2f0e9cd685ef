// K/V data that lives on a device. A BlockPool built without a host arena keeps only the books
// (free list, references, prefix index); the worker that holds the data (the CUDA worker's device
// arena, model/cuda_kv_device.h) attaches a KvDevice to the pool, and the cache's own operations
// on K/V bytes run through it: MakePrivate's block copies (SequenceKv), compaction
// (ApplyKeepPlan) and the compression scoring (CompressionSession). The scheduler and the
// policies never see the difference.
//
// Every call is ordered after the forwards that wrote the data and before the next forward;
// results written to host memory are complete when the call returns. Pointers in a ScoreInput,
// like the outputs, are host memory.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/keep_plan.h"
#include "kernels/cpu/attention_scores.h"

namespace winnow::cache {

class KvDevice {
 public:
  virtual ~KvDevice() = default;

  // BlockPool::CopyBlock: a whole block's K and V, bit for bit.
  virtual absl::Status CopyBlock(int32_t from, int32_t to) = 0;
  // The copy step of ApplyKeepPlan for one layer of one sequence: for every KV head h, entry i
  // becomes slot keep.heads[h][i] of the layer, or the float mean of the slots keep.merge[h][i]
  // when the head merges. `table` is the layer's block table before it shrinks; the plan has
  // been validated against it.
  virtual absl::Status CompactLayer(std::span<const int32_t> table,
                                    const policies::LayerKeep& keep) = 0;
  // kernels::AttentionProbabilities, kernels::AccumulateAttentionColumns (adds into
  // column_sums) and kernels::ValueNorms over the device's copy of the data. `device_q`, when
  // not null, holds the query rows already on the device (QueryCapture::device_rows) and
  // in.q is not read.
  virtual absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                              float* log_normalizer) = 0;
  virtual absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in,
                                                  float* column_sums, const void* device_q) = 0;
  virtual absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                                  float* norms) = 0;
  // TokenSelect's head soft vote (policies::TokenSelectSelector::Vote) over the candidate
  // slots [begin, end) of one layer (`table`) for one query (num_heads x head_dim floats):
  // vote[t - begin] = sum over heads of softmax over the candidates of scale * q_h . k_t, query
  // head h reading KV head h / group, or h % num_kv_heads with `gqa_mod`.
  virtual absl::Status TokenSelectVote(std::span<const int32_t> table,
                                       std::span<const float> query, int32_t num_heads,
                                       int32_t begin, int32_t end, float scale, bool gqa_mod,
                                       float* vote) = 0;
};

}  // namespace winnow::cache
