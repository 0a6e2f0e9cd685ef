// Compiled grammars by schema text, shared process-wide: requests that send the same schema
// (an agent's tools, an extraction pipeline's record type) share one grammar and its cached
// token masks, so only the first pays for compiling and for each state's mask.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/constraint.h"

namespace winnow::structured {

// The grammar of a JSON Schema document (Grammar::FromJsonSchema's errors), from the cache
// when the same text was compiled recently. Holds up to kCachedGrammars, least recently used
// out first.
inline constexpr size_t kCachedGrammars = 32;
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(std::string_view schema);

// Calls of `tools` (Grammar::ForToolCalls, Hermes' format unless told), cached like schemas.
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileToolCalls(
    const std::vector<ToolSpec>& tools, bool parallel, const ToolCallFormat& format = {});

// Any JSON object (response_format json_object): one grammar for the process.
std::shared_ptr<const CompiledGrammar> JsonObjectGrammar();

}  // namespace winnow::structured
