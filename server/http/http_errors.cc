#include "server/http/http_errors.h"

#include "server/http/openai_response.h"

namespace winnow::server::http {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

HttpError ClassifyStatus(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      // request_builder's prompt-length check (--max-prompt-tokens): too long, not malformed.
      if (StartsWith(message, "input: the prompt has")) {
        return {400, "invalid_request_error", "context_length_exceeded"};
      }
      return {400, "invalid_request_error", ""};
    case absl::StatusCode::kFailedPrecondition:
      return {400, "invalid_request_error", ""};
    case absl::StatusCode::kNotFound:
      return {404, "invalid_request_error", "model_not_found"};
    case absl::StatusCode::kResourceExhausted:
      // The engine's one transient refusal; the others say the request can never fit (400, as
      // OpenAI answers a prompt beyond the context).
      if (StartsWith(message, "request queue is full")) {
        return {429, "rate_limit_error", "queue_full"};
      }
      return {400, "invalid_request_error", "context_length_exceeded"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "invalid_request_error", "invalid_api_key"};
    case absl::StatusCode::kUnavailable:
      return {503, "service_unavailable", ""};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "timeout", ""};
    default:
      return {500, "server_error", ""};
  }
}

void SendError(httplib::Response& res, const HttpError& error, const std::string& message,
               const std::string& param) {
  res.status = error.status;
  res.set_content(ErrorBody(message, error.type, param, error.code), "application/json");
}

std::string FieldOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return "";
  const std::string field = message.substr(0, colon);
  return field.find(' ') == std::string::npos ? field : "";
}

}  // namespace winnow::server::http
