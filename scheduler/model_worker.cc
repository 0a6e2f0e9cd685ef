#include "scheduler/model_worker.h"

#include <utility>

#include "scheduler/forward_batch.h"

namespace winnow::scheduler {

ModelWorker::ModelWorker(model::Model& model, cache::BlockPool& pool,
                         std::unique_ptr<model::ForwardBackend> forward)
    : model_(model), pool_(pool), forward_(std::move(forward)) {
  if (cache::KvDevice* device = forward_->KvDeviceToAttach()) pool_.AttachDevice(device);
}

ModelWorker::~ModelWorker() {
  if (forward_->KvDeviceToAttach() != nullptr) pool_.AttachDevice(nullptr);
}

WorkerOutput ModelWorker::Execute(std::span<const ScheduledChunk> chunks) {
  WorkerOutput result;
  const std::vector<model::BatchEntry> batch =
      BuildForwardBatch(chunks, model_.config().hidden_size);
  const absl::Time t0 = absl::Now();
  result.status = forward_->Forward(batch, pool_, &out_);
  result.forward_time = absl::Now() - t0;
  if (!result.status.ok()) return result;

  result.chunks.resize(chunks.size());
  result.compression_time = RunCompressions(chunks, pool_, model_.threads(), result.chunks);
  SampleChunks(chunks, out_, model_.threads(), result.chunks);
  return result;
}

std::unique_ptr<ModelWorker> MakeCpuWorker(model::Model& model, cache::BlockPool& pool) {
  return std::make_unique<ModelWorker>(model, pool, std::make_unique<model::CpuForward>(model));
}

}  // namespace winnow::scheduler
