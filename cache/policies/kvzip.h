// KVzip (Kim et al., 2025, "Query-agnostic KV cache compression with context reconstruction"):
// each key scores the largest attention any single observed row gives it, per query head, then
// the largest over the KV head's group; one ranking over every layer decides how many slots
// each layer keeps (layers whose keys the rows need keep more), and every KV head keeps its own
// best within its layer's count. The rows are meant to be a reconstruction probe's
// (kv_compression.probe "repeat": the context repeated after it), whose every row reads the one
// context token it reproduces: the maximum keeps such one-row targets (the digits of a number
// stated once), which a sum over a thousand rows drowns (docs/compression.md). Without a probe
// the prompt's own last `window` rows are observed the same way.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

// Params: window (the last tokens, kept in every layer and observed without a probe; default
// 8), gqa (max|mean|sum, default max), allocation (global|uniform: one ranking over every
// layer, or budget x prompt per layer; default global), neighbours (each pick brings the tokens
// up to this distance, as composite's; default 0).
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateKvzipPolicy(const PolicyConfig& config,
                                                                     const PolicyContext& context);

}  // namespace winnow::cache::policies
