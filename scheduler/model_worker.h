// The worker: builds the varlen batch of the plan's chunks, runs the forward through a
// backend (the CPU's or a GPU's, model/forward_backend.h), then each sequence's compression
// hooks (scoring through the backend's ScoringBackend) and sampling on the host, the same code
// whichever backend runs the forward. It owns the threads all of that runs on.
#pragma once

#include <memory>
#include <span>

#include "cache/block_pool.h"
#include "kernels/cpu/thread_pool.h"
#include "model/forward_backend.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

class ModelWorker : public Worker {
 public:
  // `model` and `pool` must outlive the worker; `forward` was built over `threads`. While the
  // worker lives, the backend's KV device, if it has one, is attached to `pool`.
  ModelWorker(const model::Model& model, cache::BlockPool& pool,
              std::unique_ptr<kernels::ThreadPool> threads,
              std::unique_ptr<model::ForwardBackend> forward);
  ~ModelWorker() override;
  ModelWorker(const ModelWorker&) = delete;
  ModelWorker& operator=(const ModelWorker&) = delete;

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override;

 private:
  const model::Model& model_;
  cache::BlockPool& pool_;
  // Declared before the backend, which holds a reference to them.
  std::unique_ptr<kernels::ThreadPool> threads_;
  std::unique_ptr<model::ForwardBackend> forward_;
  // Reused across iterations: a batch's logits (rows x vocabulary floats, 65 MB for 128 rows
  // of a 128k vocabulary) would otherwise be allocated and zeroed every step. On a GPU they
  // point into the backend's page-locked buffer.
  model::ForwardOutput out_;
  model::ForwardOutput probe_out_;  // compression probes' (no logits), apart from the batch's
};

// The CPU worker: ModelWorker over CpuForward, on threads of its own.
std::unique_ptr<ModelWorker> MakeCpuWorker(const model::Model& model, cache::BlockPool& pool,
                                           const WorkerOptions& options = {});

}  // namespace winnow::scheduler
