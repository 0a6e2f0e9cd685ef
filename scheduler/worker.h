// A worker executes an iteration plan on one device: it builds the varlen batch of prefill
// chunks and decode tokens, runs the forward (which writes the new K/V into the reserved
// blocks), runs each sequence's compression hooks, and samples. It decides nothing: which
// sequences run, how many tokens each and where their K/V go were settled by the scheduler.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/cpu_activations.h"
#include "model/sampler.h"
#include "scheduler/engine_observer.h"
#include "scheduler/request.h"
#include "scheduler/scheduler.h"

namespace winnow::scheduler {

// What became of one scheduled chunk.
struct ChunkResult {
  absl::Status status;  // not OK: this sequence failed (e.g. its compression); it must finish
  std::optional<model::SampledToken> token;     // when the chunk samples
  std::optional<CompressionEvent> compression;  // a compaction ran (prefill or decode eviction)
};

struct WorkerOutput {
  // Not OK: the forward failed. The batch's caches may be half written, so none of its
  // sequences can continue; `chunks` is then empty.
  absl::Status status;
  std::vector<ChunkResult> chunks;  // parallel to the plan's chunks
  absl::Duration forward_time;
  absl::Duration sampling_time;     // sampling every chunk that samples (structured-output
                                    // masks included)
  absl::Duration compression_time;  // the compression hooks after the forward
  cache::CompressionPhaseTimes compression_phases;  // their split
};

// The host side of a worker: the threads it owns (the CPU forward's kernels and, on any device,
// the compression hooks' host work and sampling) and the CPU forward's activation precision.
struct WorkerOptions {
  int32_t num_threads = 0;  // 0: one per hardware thread
  model::CpuActivations cpu_activations = model::CpuActivations::kF32;
};

class Worker {
 public:
  virtual ~Worker() = default;
  // Runs the chunks (their blocks are reserved). Updates nothing the scheduler reads except
  // the KV the forward and compaction write; the caller advances num_computed.
  virtual WorkerOutput Execute(std::span<const ScheduledChunk> chunks) = 0;
  // Whether this worker can run `request` as asked; the engine refuses it at Submit otherwise
  // (e.g. compression where the worker has none). Called from the submitting threads: it must
  // read only what does not change after construction.
  virtual absl::Status Admits(const GenerationRequest& request) const {
    return absl::OkStatus();
  }
};

}  // namespace winnow::scheduler
