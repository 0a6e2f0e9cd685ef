// CUDA graphs of repeated work: the first Run of a key runs `enqueue` eagerly (kernels load and
// libraries set up outside any capture), the second captures what it queues on the stream into
// a graph and instantiates it, and every later Run of that key launches the instance: one
// launch instead of one per kernel. What the work reads and writes must sit at the same device
// addresses on every Run (the graph keeps the pointers and launch sizes it was captured with),
// and `enqueue` must only queue work: no allocation, no wait, no copy from pageable memory.
//
// When capture fails (an operation a graph cannot hold), the work runs eagerly instead, the
// cache turns itself off (every later Run is eager) and capture_error() says why.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "absl/status/status.h"

namespace winnow::kernels::cuda {

class GraphCache {
 public:
  GraphCache() = default;
  ~GraphCache() { Clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Queues `enqueue`'s work on `stream`: eagerly the first time for a key (and for good once
  // capture has failed), captured the second, replayed from the key's graph after that. The
  // status of `enqueue` or of the launch.
  absl::Status Run(int64_t key, cudaStream_t stream,
                   const std::function<absl::Status()>& enqueue);

  // Drops every graph (the addresses they hold are about to change).
  void Clear();

  int64_t size() const { return static_cast<int64_t>(execs_.size()); }
  // Why capture failed; OK while it has not.
  const absl::Status& capture_error() const { return capture_error_; }

 private:
  // Captures `enqueue`'s work into an instantiated graph; nothing runs.
  absl::Status Capture(cudaStream_t stream, const std::function<absl::Status()>& enqueue,
                       cudaGraphExec_t* exec);

  std::unordered_map<int64_t, cudaGraphExec_t> execs_;
  std::unordered_set<int64_t> warmed_up_;  // keys run eagerly once
  absl::Status capture_error_;
};

}  // namespace winnow::kernels::cuda
