// What every worker does around its forward: the varlen batch for a plan's chunks, and the
// sampled token of a chunk from the forward's logits (on the host, with the sequence's
// sampler: its full parameter set and logprobs).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/sampler.h"
#include "scheduler/scheduler.h"

namespace winnow::scheduler {

// One entry per chunk, in order: its tokens, positions, embedding rows, whether it needs
// logits, and its sequence's compression hooks (query capture while the prompt runs,
// attention probabilities and selection once compressed).
std::vector<model::BatchEntry> BuildForwardBatch(std::span<const ScheduledChunk> chunks,
                                                 int64_t hidden_size);

// Samples chunk `index`'s next token from its logits row in `out`.
absl::StatusOr<model::SampledToken> SampleChunk(const ScheduledChunk& chunk, size_t index,
                                                const model::ForwardOutput& out);

}  // namespace winnow::scheduler
