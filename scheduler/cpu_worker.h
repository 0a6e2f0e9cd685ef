// The CPU worker: model::Model's varlen forward on the engine thread's kernel thread pool, the
// compression hooks, and sampling.
#pragma once

#include <span>
#include <vector>

#include "cache/block_pool.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

class CpuWorker : public Worker {
 public:
  // The model and pool must outlive the worker.
  CpuWorker(model::Model& model, cache::BlockPool& pool) : model_(model), pool_(pool) {}

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override;

 private:
  model::Model& model_;
  cache::BlockPool& pool_;
  // Reused across iterations: a batch's logits (rows x vocabulary floats, 65 MB for 128 rows
  // of a 128k vocabulary) would otherwise be allocated and zeroed every step.
  model::ForwardOutput out_;
};

}  // namespace winnow::scheduler
