// PyramidKV (Cai et al.): SnapKV's scores and per-head selection, with per-layer budgets that
// shrink linearly from the lowest to the highest layer while keeping SnapKV's mean.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Params: SnapKV's (window, kernel, pooling, gqa) and beta (default 20).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePyramidKvPolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
