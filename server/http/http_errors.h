// HTTP statuses and OpenAI error bodies for what goes wrong with a request. One mapping from
// absl status codes (which the gRPC edge maps to gRPC codes the same way) to HTTP:
//   INVALID_ARGUMENT, FAILED_PRECONDITION -> 400; NOT_FOUND -> 404 (unknown model);
//   RESOURCE_EXHAUSTED -> 429 when the queue is full, else 413 (prompt + max_tokens cannot fit
//   the context or the KV pool); a prompt over --max-prompt-tokens -> 413; UNAUTHENTICATED
//   (no or a wrong API key, no client certificate) -> 401; UNAVAILABLE (loading,
//   draining) -> 503; DEADLINE_EXCEEDED -> 504; anything else -> 500.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "httplib.h"

namespace winnow::server::http {

struct HttpError {
  int status = 500;
  std::string type;  // OpenAI's error type, e.g. "invalid_request_error"
  std::string code;  // e.g. "model_not_found", "context_length_exceeded"; may be empty
};

HttpError ClassifyStatus(const absl::Status& status);

// Writes {"error": {...}} with the status.
void SendError(httplib::Response& res, const HttpError& error, const std::string& message,
               const std::string& param);

// The field a validation message starts with ("temperature: must ..." -> "temperature"), or "".
std::string FieldOf(const std::string& message);

}  // namespace winnow::server::http
