// K/V data that lives on a device. A BlockPool built without a host arena keeps only the books
// (free list, references, prefix index); the worker that holds the data (the CUDA worker's device
// arena, model/cuda_kv_device.h) attaches a KvDevice to the pool, and the cache's own block
// operations on K/V bytes run through it: MakePrivate's block copies (SequenceKv) and
// compaction (ApplyKeepPlan). Scoring is not a block operation: it goes through the forward
// backend's ScoringBackend (cache/scoring_backend.h). The scheduler and the policies never see
// the difference.
//
// Every call is ordered after the forwards that wrote the data and before the next forward.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/keep_plan.h"

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
};

}  // namespace winnow::cache
