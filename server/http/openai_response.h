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
  model::ToolCallSyntax tool_syntax = model::ToolCallSyntax::kHermes;  // how the model writes them
  bool echo = false;       // completions: each choice starts with its prompt
  bool echo_only = false;  // ... and holds nothing else (max_tokens 0)
  const model::Tokenizer* tokenizer = nullptr;  // token text for logprobs
};

// "stop" or "length"; other reasons are errors, not finish reasons.
const char* OpenAiFinishReason(scheduler::FinishReason reason);

// A choice's prompt, for echo: its text and, when logprobs were asked, its tokens (the first
// with a NaN log-probability: it has no context) with their log-probabilities.
struct EchoedPrompt {
  std::string text;
  std::vector<scheduler::TokenLogprob> logprobs;
};

// One choice's output.
struct ChoiceOutput {
  EchoedPrompt prompt;  // with ResponseContext::echo
  std::string text;
  std::vector<scheduler::TokenLogprob> logprobs;
  scheduler::FinishReason reason = scheduler::FinishReason::kStop;
};

// The non-streamed response: choices[i] has index i.
std::string CompletionBody(const ResponseContext& ctx, const std::vector<ChoiceOutput>& choices,
                           const scheduler::Usage& usage);

// Streams of `choices` choices (n, or several prompts), their chunks interleaved, each
// carrying its choice's index.
class StreamFormatter {
 public:
  StreamFormatter(ResponseContext ctx, int choices)
      : ctx_(std::move(ctx)),
        text_offset_(choices, 0),
        tool_calls_(choices, ToolCallStream(ctx_.tool_syntax)) {}
  // Chat streams open each choice with the assistant role; completions have no such chunk.
  std::string Start(int index);
  std::string Delta(int index, const std::string& text,
                    const std::vector<scheduler::TokenLogprob>& lp);
  // Echo: the choice's prompt, before its first delta.
  std::string Echo(int index, const EchoedPrompt& prompt);
  // The choice's finish chunk.
  std::string Finish(int index, scheduler::FinishReason reason);
  // After every choice finished: the usage chunk when asked, and [DONE].
  std::string Done(const scheduler::Usage& usage);
  // An error after the stream began (status 200 is already sent): an error event, then [DONE].
  std::string Error(int status, const std::string& message);

 private:
  std::string Chunk(int index, const std::string& text,
                    const std::vector<scheduler::TokenLogprob>& lp, const char* finish_reason);
  // A chat chunk whose delta carries these tool calls.
  std::string ToolCallsChunk(int index, const std::vector<ParsedToolCall>& calls,
                             int first_call);
  ResponseContext ctx_;
  std::vector<int64_t> text_offset_;  // per choice: where its next delta starts in its text
  std::vector<ToolCallStream> tool_calls_;  // per choice, with ctx_.tools
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
