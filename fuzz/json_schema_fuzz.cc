// Structured output (structured/): the input is a grammar source, a NUL byte, then an output to
// match. The source is a JSON Schema, or, after a 0x01 byte, a JSON array of tools
// ([{"name": ..., "parameters": {...}}], parallel calls when the array has more than one) for
// Grammar::ForToolCalls. It is compiled (an error is fine, a crash is not); the output's bytes
// are fed to the matcher until one is rejected. Invariant checked for schemas: an output the
// matcher accepts as complete is valid JSON (nlohmann's parser is the reference).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "structured/grammar.h"
#include "structured/json_matcher.h"

namespace {

using winnow::structured::Grammar;

absl::StatusOr<std::shared_ptr<const Grammar>> ToolGrammar(std::string_view source) {
  const nlohmann::json tools = nlohmann::json::parse(source, nullptr, false);
  if (!tools.is_array()) return absl::InvalidArgumentError("not a tool list");
  std::vector<winnow::structured::ToolSpec> specs;
  for (const auto& tool : tools) {
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string()) continue;
    specs.push_back({tool["name"].get<std::string>(),
                     tool.contains("parameters") ? tool["parameters"].dump() : ""});
  }
  return Grammar::ForToolCalls(specs, /*parallel=*/specs.size() > 1, {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::string_view source = input.substr(0, nul);
  const std::string_view output = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  const bool tools = !source.empty() && source[0] == '\x01';
  if (tools) source.remove_prefix(1);
  auto grammar = tools ? ToolGrammar(source) : Grammar::FromJsonSchema(source);
  if (!grammar.ok()) return 0;
  const winnow::structured::JsonMatcher matcher(*grammar);
  winnow::structured::MatchState state = matcher.Initial();
  if (!matcher.FeedAll(state, output)) return 0;
  (void)state.Key();
  if (!tools && matcher.CanEnd(state) && !nlohmann::json::accept(output)) std::abort();
  return 0;
}
