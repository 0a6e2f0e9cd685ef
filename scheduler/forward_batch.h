// What every worker does around its forward: the varlen batch for a plan's chunks, and the
// sampled token of a chunk from the forward's logits (on the host, with the sequence's
// sampler: its full parameter set and logprobs).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/block_pool.h"
#include "cache/scoring_backend.h"
#include "kernels/cpu/thread_pool.h"
#include "model/batch.h"
#include "model/sampler.h"
#include "scheduler/scheduler.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

// One entry per chunk, in order: its tokens, positions, embedding rows, whether it needs
// logits, and its sequence's compression hooks (query capture while the prompt runs,
// attention probabilities and selection once compressed).
std::vector<model::BatchEntry> BuildForwardBatch(std::span<const ScheduledChunk> chunks,
                                                 int64_t hidden_size);

// A forward of one more entry outside the plan's batch (a compression probe, which writes K/V
// and captures rows but returns no logits), through the worker's own forward.
using ProbeForward = std::function<absl::Status(const model::BatchEntry& entry)>;

// After the forward: each chunk's compression hooks into results[i] (prefill capture
// bookkeeping, a context's probe then compression once it is complete, or decode-time
// eviction), scoring through the forward backend's `scoring` (where the K/V are) and running
// probes through `probe`. Before sampling: the first
// token comes from the full cache's logits (already computed), and a sequence that finishes on
// it must not be compressed after its blocks are gone. A failure fails that chunk's sequence
// only. Returns the time the hooks took (zero when no chunk's sequence compresses) and adds
// its split by phase into `phases`.
absl::Duration RunCompressions(std::span<const ScheduledChunk> chunks, cache::BlockPool& pool,
                               cache::ScoringBackend& scoring, const ProbeForward& probe,
                               std::span<ChunkResult> results,
                               cache::CompressionPhaseTimes& phases);

// Samples chunk `index`'s next token from its logits row in `out`.
absl::StatusOr<model::SampledToken> SampleChunk(const ScheduledChunk& chunk, size_t index,
                                                const model::ForwardOutput& out);

// Samples every chunk that samples and has not failed (results[i].status OK) into results[i],
// spread over `threads`: each sequence has its own sampler, and on a large vocabulary the
// log-normaliser of every row is the engine thread's largest cost after the forward.
void SampleChunks(std::span<const ScheduledChunk> chunks, const model::ForwardOutput& out,
                  kernels::ThreadPool& threads, std::span<ChunkResult> results);

}  // namespace winnow::scheduler
