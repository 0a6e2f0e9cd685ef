// The seam between a worker and the device it runs on: one forward over a varlen batch, with
// the semantics of Model::Forward (model/model.h), on the CPU (CpuForward, below) or on a GPU
// (CudaModel, model/cuda_model.h). The worker around it (scheduler/model_worker.h) builds the
// batch, runs the compression hooks and samples the same way whichever backend it holds.
#pragma once

#include <span>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "cache/kv_device.h"
#include "model/model.h"

namespace winnow::model {

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // Writes the new tokens' K/V into their sequences' blocks, advances their slot counts and
  // fills `out` (logits, captured queries, decode attention). Not thread-safe: one engine thread
  // owns the backend.
  virtual absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                               ForwardOutput* out) = 0;

  // Where this backend keeps the K/V data when that is not the pool's host memory: the worker
  // attaches it to the pool while it runs the backend, so that compaction and scoring reach
  // the data (cache/kv_device.h). Null: the pool's own host memory.
  virtual cache::KvDevice* KvDeviceToAttach() { return nullptr; }
};

// The CPU forward: Model::Forward on the model's kernel thread pool.
class CpuForward : public ForwardBackend {
 public:
  // The model must outlive the backend.
  explicit CpuForward(Model& model) : model_(model) {}

  absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                       ForwardOutput* out) override {
    return model_.Forward(batch, pool, out);
  }

 private:
  Model& model_;
};

}  // namespace winnow::model
