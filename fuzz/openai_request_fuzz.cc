// HTTP request bodies -> ParseOpenAiRequest (server/http/openai_request.cc) for both endpoints:
// the first byte picks /v1/completions or /v1/chat/completions, the rest is the body. A parsed
// request's error rewriting (OpenAiFieldMessage) runs on the request_builder field names too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using winnow::server::http::Endpoint;
  if (size == 0) return 0;
  const Endpoint endpoint = (data[0] & 1) ? Endpoint::kChat : Endpoint::kCompletions;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto request = winnow::server::http::ParseOpenAiRequest(endpoint, body);
  if (!request.ok()) return 0;
  std::string param;
  for (const char* message : {"stopping.max_tokens: must be >= 1, got 0",
                              "sampling.temperature: must be finite", "stopping.stop[3]: empty",
                              "compression.params.window: must be > 0", "no field here"}) {
    (void)winnow::server::http::OpenAiFieldMessage(*request, message, &param);
  }
  (void)request->generate.SerializeAsString();
  return 0;
}
