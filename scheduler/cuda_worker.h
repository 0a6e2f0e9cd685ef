// The CUDA worker: the whole forward on one GPU (model/cuda_model.h), the compression hooks with
// their scoring and compaction on the GPU (the pool's attached device, model/cuda_kv_device.h;
// the policies themselves decide on the host), then sampling on the host from the copied
// logits with each sequence's sampler, exactly as the CPU worker samples.
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
  // Attaches the CUDA model's device arena to `pool` until the worker is destroyed.
  CudaWorker(model::Model& model, cache::BlockPool& pool,
             std::unique_ptr<model::CudaModel> cuda);
  ~CudaWorker() override;

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override;

 private:
  model::Model& model_;
  cache::BlockPool& pool_;
  // Reused across iterations; its logits point into the CUDA model's page-locked buffer.
  model::ForwardOutput out_;
  std::unique_ptr<model::CudaModel> cuda_;
};

}  // namespace winnow::scheduler
