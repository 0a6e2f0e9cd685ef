// Structured output (structured/): the input is a JSON Schema, a NUL byte, then an output to
// match. The schema is compiled (an error is fine, a crash is not); the output's bytes are fed
// to the matcher until one is rejected. Invariant checked: an output the matcher accepts as
// complete is valid JSON (nlohmann's parser is the reference).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "structured/grammar.h"
#include "structured/json_matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view schema = input.substr(0, nul);
  const std::string_view output = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  auto grammar = winnow::structured::Grammar::FromJsonSchema(schema);
  if (!grammar.ok()) return 0;
  const winnow::structured::JsonMatcher matcher(*grammar);
  winnow::structured::MatchState state = matcher.Initial();
  if (!matcher.FeedAll(state, output)) return 0;
  (void)state.Key();
  if (matcher.CanEnd(state) && !nlohmann::json::accept(output)) std::abort();
  return 0;
}
