// OpenAI response bodies: the whole completion (text_completion / chat.completion), the
// server-sent-event chunks of a stream (text_completion / chat.completion.chunk, then
// "data: [DONE]"), and the error object {"error": {message, type, param, code}}.
// All JSON is written with invalid UTF-8 replaced (token pieces can split characters), so
// formatting never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "scheduler/request.h"
#include "server/http/openai_request.h"
#include "server/http/tool_calls.h"

namespace winnow::server::http {

// What every body of one response repeats.
struct ResponseContext {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;
  bool include_usage = false;  // streams: a last chunk with usage (and "usage": null before)
  bool tools = false;  // chat with tools offered: tool calls in the reply become tool_calls
  const model::Tokenizer* tokenizer = nullptr;  // token text for logprobs
};

// "stop" or "length"; other reasons are errors, not finish reasons.
const char* OpenAiFinishReason(scheduler::FinishReason reason);

// The non-streamed response.
std::string CompletionBody(const ResponseContext& ctx, const std::string& text,
                           const std::vector<scheduler::TokenLogprob>& logprobs,
                           scheduler::FinishReason reason, const scheduler::Usage& usage);

// Streams. `text_offset` (completions logprobs) is where this delta starts in the whole text.
class StreamFormatter {
 public:
  explicit StreamFormatter(ResponseContext ctx) : ctx_(std::move(ctx)) {}
  // Chat streams open with the assistant role; completions have no such chunk ("" then).
  std::string Start();
  std::string Delta(const std::string& text, const std::vector<scheduler::TokenLogprob>& lp);
  // The finish chunk, the usage chunk when asked, and [DONE].
  std::string Finish(scheduler::FinishReason reason, const scheduler::Usage& usage);
  // An error after the stream began (status 200 is already sent): an error event, then [DONE].
  std::string Error(int status, const std::string& message);

 private:
  std::string Chunk(const std::string& text, const std::vector<scheduler::TokenLogprob>& lp,
                    const char* finish_reason);
  // A chat chunk whose delta carries these tool calls.
  std::string ToolCallsChunk(const std::vector<ParsedToolCall>& calls, int first_index);
  ResponseContext ctx_;
  int64_t text_offset_ = 0;
  ToolCallStream tool_calls_;  // with ctx_.tools
};

// {"error": {"message", "type", "param", "code"}}; empty param/code are null.
std::string ErrorBody(const std::string& message, const std::string& type,
                      const std::string& param, const std::string& code);

// SSE framing: "data: <payload>\n\n".
std::string SseEvent(const std::string& payload);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";
// A comment line: clients ignore it; writing it finds out whether the client is still there.
inline constexpr char kSseKeepAlive[] = ": keep-alive\n\n";

}  // namespace winnow::server::http
