// The seam between a worker and the device it runs on: one forward over a varlen batch
// (model/batch.h), on the CPU (model/cpu_forward.h) or on a GPU (model/cuda_model.h), and the
// scoring backend over the K/V it holds. The worker around it (scheduler/model_worker.h) builds
// the batch, runs the compression hooks and samples the same way whichever backend it holds.
#pragma once

#include <span>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "cache/kv_device.h"
#include "cache/scoring_backend.h"
#include "model/batch.h"

namespace winnow::model {

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // Writes the new tokens' K/V into their sequences' blocks, advances their slot counts and
  // fills `out` (logits, captured queries, decode attention). Not thread-safe: one engine thread
  // owns the backend.
  virtual absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                               ForwardOutput* out) = 0;

  // Where the compression hooks score the K/V this backend keeps for `pool`: over the pool's
  // host arena on the host threads, or on the device. Valid while the backend lives.
  virtual cache::ScoringBackend& Scoring(const cache::BlockPool& pool) = 0;

  // Where this backend keeps the K/V data when that is not the pool's host memory: the worker
  // attaches it to the pool while it runs the backend, so that the cache's block operations
  // (copies, compaction) reach the data (cache/kv_device.h). Null: the pool's own host memory.
  virtual cache::KvDevice* KvDeviceToAttach() { return nullptr; }
};

}  // namespace winnow::model
