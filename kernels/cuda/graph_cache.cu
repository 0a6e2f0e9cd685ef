#include "kernels/cuda/graph_cache.h"

#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {

absl::Status GraphCache::Capture(cudaStream_t stream,
                                 const std::function<absl::Status()>& enqueue,
                                 cudaGraphExec_t* exec) {
  // Thread-local mode: an unsafe call (cudaMalloc, a synchronous copy) from this thread during
  // the capture fails it instead of being silently left out of the graph.
  if (absl::Status s =
          CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture");
      !s.ok()) {
    return s;
  }
  const absl::Status queued = enqueue();
  cudaGraph_t graph = nullptr;
  // Always end the capture, so that the stream is usable again whatever happened.
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  const absl::Status captured =
      queued.ok() ? CudaStatus(ended, "cudaStreamEndCapture") : queued;
  const absl::Status instantiated =
      captured.ok() ? CudaStatus(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate")
                    : captured;
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // a failed capture's error is not sticky; clear it
  return instantiated;
}

absl::Status GraphCache::Run(int64_t key, cudaStream_t stream,
                             const std::function<absl::Status()>& enqueue) {
  if (!capture_error_.ok()) return enqueue();
  auto it = execs_.find(key);
  if (it == execs_.end() && warmed_up_.insert(key).second) return enqueue();
  if (it == execs_.end()) {
    cudaGraphExec_t exec = nullptr;
    if (absl::Status s = Capture(stream, enqueue, &exec); !s.ok()) {
      capture_error_ = s;
      Clear();
      return enqueue();  // nothing ran during the capture
    }
    it = execs_.emplace(key, exec).first;
  }
  return CudaStatus(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
}

void GraphCache::Clear() {
  for (auto& [key, exec] : execs_) cudaGraphExecDestroy(exec);
  execs_.clear();
  warmed_up_.clear();
}

}  // namespace winnow::kernels::cuda
