// H2O (Zhang et al.): heavy hitters by attention accumulated over every query so far (prompt rows
// at prefill, then each decode step), plus the most recent tokens; per KV head; evicts during
// decode to stay within the budget.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Params: recent_fraction (share of the kept slots that is the recent window, default 0.5 =
// H2O's heavy_ratio = recent_ratio); sinks (default 0); gqa (sum|mean|max, default sum);
// normalize (divide a key's sum by the queries that saw it, kvpress's ObservedAttention; default
// false = H2O); decode / evict_every as StreamingLLM.
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateH2oPolicy(const PolicyConfig& config,
                                                                   const PolicyContext& context);

}  // namespace winnow::cache::policies
