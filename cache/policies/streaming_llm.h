// StreamingLLM (Xiao et al.): keep the first `sinks` tokens (attention sinks) and the most recent
// ones; no scoring. Also evicts during decode so the cache stays within the budget.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Params: sinks (int, default 4); decode ("relative": keep <= budget x tokens seen, default;
// "fixed": keep <= the prefill's kept count; "off": no decode eviction); evict_every (slots of
// slack before a decode eviction, default: the block size).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateStreamingLlmPolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
