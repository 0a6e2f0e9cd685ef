#include "scheduler/cuda_worker.h"

#include "scheduler/forward_batch.h"

namespace winnow::scheduler {

CudaWorker::CudaWorker(model::Model& model, cache::BlockPool& pool,
                       std::unique_ptr<model::CudaModel> cuda)
    : model_(model), pool_(pool), cuda_(std::move(cuda)) {
  pool_.AttachDevice(&cuda_->kv_device());
}

CudaWorker::~CudaWorker() { pool_.AttachDevice(nullptr); }

WorkerOutput CudaWorker::Execute(std::span<const ScheduledChunk> chunks) {
  WorkerOutput result;
  const std::vector<model::BatchEntry> batch =
      BuildForwardBatch(chunks, model_.config().hidden_size);
  const absl::Time t0 = absl::Now();
  result.status = cuda_->Forward(batch, pool_, &out_);
  result.forward_time = absl::Now() - t0;
  if (!result.status.ok()) return result;

  result.chunks.resize(chunks.size());
  result.compression_time = RunCompressions(chunks, pool_, model_.threads(), result.chunks);
  SampleChunks(chunks, out_, model_.threads(), result.chunks);
  return result;
}

}  // namespace winnow::scheduler
