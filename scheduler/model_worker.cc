#include "scheduler/model_worker.h"

#include <utility>

#include "model/cpu_forward.h"
#include "scheduler/forward_batch.h"

namespace winnow::scheduler {

ModelWorker::ModelWorker(const model::Model& model, cache::BlockPool& pool,
                         std::unique_ptr<kernels::ThreadPool> threads,
                         std::unique_ptr<model::ForwardBackend> forward)
    : model_(model), pool_(pool), threads_(std::move(threads)), forward_(std::move(forward)) {
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
  const ProbeForward probe = [this](const model::BatchEntry& entry) {
    return forward_->Forward({&entry, 1}, pool_, &probe_out_);
  };
  result.compression_time =
      RunCompressions(chunks, pool_, forward_->Scoring(pool_), probe, result.chunks,
                      result.compression_phases);
  const absl::Time t1 = absl::Now();
  SampleChunks(chunks, out_, *threads_, result.chunks);
  result.sampling_time = absl::Now() - t1;
  return result;
}

std::unique_ptr<ModelWorker> MakeCpuWorker(const model::Model& model, cache::BlockPool& pool,
                                           const WorkerOptions& options) {
  auto threads = std::make_unique<kernels::ThreadPool>(options.num_threads);
  auto forward = std::make_unique<model::CpuForward>(model, *threads, options.cpu_activations);
  return std::make_unique<ModelWorker>(model, pool, std::move(threads), std::move(forward));
}

}  // namespace winnow::scheduler
