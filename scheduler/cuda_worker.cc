#include "scheduler/cuda_worker.h"

#include "absl/strings/str_cat.h"
#include "scheduler/forward_batch.h"

namespace winnow::scheduler {

absl::Status CudaWorker::Admits(const GenerationRequest& request) const {
  if (!request.compression.enabled()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "compression.policy '", request.compression.policy, "': KV compression does not run on the CUDA worker (cuda:",
      cuda_->device(), ") yet; send no policy, or serve with --device cpu"));
}

WorkerOutput CudaWorker::Execute(std::span<const ScheduledChunk> chunks) {
  WorkerOutput result;
  const std::vector<model::BatchEntry> batch =
      BuildForwardBatch(chunks, model_.config().hidden_size);
  const absl::Time t0 = absl::Now();
  result.status = cuda_->Forward(batch, pool_, &out_);
  result.forward_time = absl::Now() - t0;
  if (!result.status.ok()) return result;

  result.chunks.resize(chunks.size());
  SampleChunks(chunks, out_, model_.threads(), result.chunks);
  return result;
}

}  // namespace winnow::scheduler
