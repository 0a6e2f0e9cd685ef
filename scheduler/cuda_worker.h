// The CUDA worker: the whole forward on one GPU (model/cuda_model.h), then sampling on the
// host from the copied logits with each sequence's sampler, exactly as the CPU worker samples.
// KV compression does not run on the GPU yet: requests that ask for it are refused at Submit
// (Admits), so none reaches Execute.
#pragma once

#include <memory>
#include <span>

#include "cache/block_pool.h"
#include "model/cuda_model.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

class CudaWorker : public Worker {
 public:
  // The model and the pool (which keeps the books of cuda's device arena) must outlive it.
  CudaWorker(model::Model& model, cache::BlockPool& pool,
             std::unique_ptr<model::CudaModel> cuda)
      : model_(model), pool_(pool), cuda_(std::move(cuda)) {}

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override;
  // FailedPrecondition naming compression.policy for a request with a compression policy.
  absl::Status Admits(const GenerationRequest& request) const override;

 private:
  model::Model& model_;
  cache::BlockPool& pool_;
  // Reused across iterations; its logits point into the CUDA model's page-locked buffer.
  model::ForwardOutput out_;
  std::unique_ptr<model::CudaModel> cuda_;
};

}  // namespace winnow::scheduler
