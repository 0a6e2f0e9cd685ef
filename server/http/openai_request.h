// The OpenAI-compatible request bodies (POST /v1/completions, POST /v1/chat/completions) mapped
// onto winnow's wire request, v1::GenerateRequest. Only the shape is checked here (types,
// fields winnow cannot honour such as n > 1); every value check stays in one place,
// server/request_builder.cc, whose error messages name the proto field. OpenAiFieldName maps
// those names back to the OpenAI ones, so a client reads the field it sent.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "winnow/v1/inference.pb.h"

namespace winnow::server::http {

enum class Endpoint { kCompletions, kChat };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty: the client did not name one (then any served model is fine)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Which OpenAI field carried the token limit (max_tokens or max_completion_tokens), so that
  // errors about stopping.max_tokens name it.
  std::string max_tokens_field = "max_tokens";
  bool logprobs = false;
  // The request offers tools (and tool_choice is not none): the reply is parsed for tool calls.
  bool tools = false;
  // Choices per prompt (OpenAI's n), and the requests of every choice in choice-index order:
  // each prompt (completions take a list) n times, each with its own seed stream (seed + j for
  // a seeded request's j-th choice). `generate` is what they share (with the first prompt).
  int n = 1;
  // Completions' echo: the reply starts with the prompt (and, with logprobs, its tokens'
  // log-probabilities); echo_only (max_tokens 0): the prompt is all the reply holds.
  bool echo = false;
  bool echo_only = false;
  v1::GenerateRequest generate;
  std::vector<v1::GenerateRequest> choices;
};

inline constexpr int kMaxChoicesPerPrompt = 16;   // n
inline constexpr int kMaxChoicesPerRequest = 64;  // n times the prompts

// Parses and shape-checks a JSON body. Errors are InvalidArgument with a message that starts
// with the OpenAI field name ("temperature: must be a number", "n: only n = 1 is supported").
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, const std::string& body);

// Rewrites a request_builder error ("stopping.max_tokens: must be >= 1, got 0") into the
// request's OpenAI names ("max_tokens: must be >= 1, got 0"), and returns that field name in
// `param` ("" when the message names no field).
std::string OpenAiFieldMessage(const OpenAiRequest& request, const std::string& message,
                               std::string* param);

}  // namespace winnow::server::http
