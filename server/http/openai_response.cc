#include "server/http/openai_response.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace winnow::server::http {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// Token pieces are raw bytes and may be part of a UTF-8 character; Dump() replaces what is
// invalid in the string, and `bytes` keeps the exact bytes (as OpenAI's chat logprobs do).
std::string Piece(const ResponseContext& ctx, int32_t id) {
  return ctx.tokenizer != nullptr ? ctx.tokenizer->TokenToPiece(id, /*render_special=*/true)
                                  : std::string();
}

Json Bytes(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

Json ChatLogprobs(const ResponseContext& ctx, const std::vector<scheduler::TokenLogprob>& lps) {
  Json content = Json::array();
  for (const scheduler::TokenLogprob& lp : lps) {
    const std::string piece = Piece(ctx, lp.id);
    Json top = Json::array();
    for (const auto& [id, logprob] : lp.top) {
      const std::string p = Piece(ctx, id);
      top.push_back({{"token", p}, {"logprob", logprob}, {"bytes", Bytes(p)}});
    }
    content.push_back({{"token", piece},
                       {"logprob", lp.logprob},
                       {"bytes", Bytes(piece)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions logprobs: parallel lists, text_offset counted from the start of the output.
Json CompletionLogprobs(const ResponseContext& ctx,
                        const std::vector<scheduler::TokenLogprob>& lps, int64_t* offset) {
  Json tokens = Json::array(), logprobs = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const scheduler::TokenLogprob& lp : lps) {
    const std::string piece = Piece(ctx, lp.id);
    tokens.push_back(piece);
    // An echoed prompt's first token has no context: null, as OpenAI writes it.
    if (std::isnan(lp.logprob)) {
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      offsets.push_back(*offset);
      *offset += static_cast<int64_t>(piece.size());
      continue;
    }
    logprobs.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [id, logprob] : lp.top) top[Piece(ctx, id)] = logprob;
    tops.push_back(top);
    offsets.push_back(*offset);
    *offset += static_cast<int64_t>(piece.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

Json UsageJson(const scheduler::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          // OpenAI's shape for prompt tokens served from the (prefix) cache.
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}}};
}

// OpenAI's tool_calls entries; streamed ones carry their index among the reply's calls.
Json ToolCallsJson(const std::vector<ParsedToolCall>& calls, int first_index, bool indexed) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = first_index + static_cast<int>(i);
    out.push_back(std::move(call));
  }
  return out;
}

// "tool_calls" when a reply that ended by itself called tools.
const char* FinishReasonWithCalls(scheduler::FinishReason reason, bool called) {
  return called && reason == scheduler::FinishReason::kStop ? "tool_calls"
                                                            : OpenAiFinishReason(reason);
}

Json Envelope(const ResponseContext& ctx, const char* object) {
  return {{"id", ctx.id}, {"object", object}, {"created", ctx.created}, {"model", ctx.model}};
}

}  // namespace

const char* OpenAiFinishReason(scheduler::FinishReason reason) {
  return reason == scheduler::FinishReason::kLength ? "length" : "stop";
}

std::string CompletionBody(const ResponseContext& ctx, const std::vector<ChoiceOutput>& choices,
                           const scheduler::Usage& usage) {
  const bool chat = ctx.endpoint == Endpoint::kChat;
  Json body = Envelope(ctx, chat ? "chat.completion" : "text_completion");
  Json out = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    Json choice = {{"index", i}, {"finish_reason", OpenAiFinishReason(c.reason)}};
    int64_t offset = 0;
    if (chat && ctx.tools) {
      const ParsedReply reply = ParseToolCalls(c.text, ctx.tool_syntax);
      const bool called = !reply.calls.empty();
      choice["message"] = {{"role", "assistant"},
                           {"content", called && reply.content.empty() ? Json()
                                                                       : Json(reply.content)}};
      if (called) choice["message"]["tool_calls"] = ToolCallsJson(reply.calls, 0, false);
      choice["finish_reason"] = FinishReasonWithCalls(c.reason, called);
      choice["logprobs"] = ctx.logprobs ? ChatLogprobs(ctx, c.logprobs) : Json(nullptr);
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = ctx.logprobs ? ChatLogprobs(ctx, c.logprobs) : Json(nullptr);
    } else {
      std::vector<scheduler::TokenLogprob> lps = ctx.echo ? c.prompt.logprobs
                                                          : std::vector<scheduler::TokenLogprob>{};
      if (!ctx.echo_only) lps.insert(lps.end(), c.logprobs.begin(), c.logprobs.end());
      choice["text"] = (ctx.echo ? c.prompt.text : "") + (ctx.echo_only ? "" : c.text);
      choice["logprobs"] = ctx.logprobs ? CompletionLogprobs(ctx, lps, &offset) : Json(nullptr);
    }
    out.push_back(std::move(choice));
  }
  body["choices"] = std::move(out);
  body["usage"] = UsageJson(usage);
  return Dump(body);
}

std::string StreamFormatter::Chunk(int index, const std::string& text,
                                   const std::vector<scheduler::TokenLogprob>& lp,
                                   const char* finish_reason) {
  const bool chat = ctx_.endpoint == Endpoint::kChat;
  Json body = Envelope(ctx_, chat ? "chat.completion.chunk" : "text_completion");
  Json choice = {{"index", index},
                 {"finish_reason", finish_reason != nullptr ? Json(finish_reason) : Json()}};
  if (chat) {
    choice["delta"] = finish_reason != nullptr ? Json::object() : Json{{"content", text}};
    choice["logprobs"] = ctx_.logprobs && !lp.empty() ? ChatLogprobs(ctx_, lp) : Json(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] = ctx_.logprobs && !lp.empty()
                             ? CompletionLogprobs(ctx_, lp, &text_offset_[index])
                             : Json(nullptr);
  }
  body["choices"] = Json::array({choice});
  if (ctx_.include_usage) body["usage"] = nullptr;
  return SseEvent(Dump(body));
}

std::string StreamFormatter::Start(int index) {
  if (ctx_.endpoint != Endpoint::kChat) return "";
  Json body = Envelope(ctx_, "chat.completion.chunk");
  body["choices"] = Json::array({{{"index", index},
                                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}});
  if (ctx_.include_usage) body["usage"] = nullptr;
  return SseEvent(Dump(body));
}

std::string StreamFormatter::Echo(int index, const EchoedPrompt& prompt) {
  return Chunk(index, prompt.text, prompt.logprobs, nullptr);
}

std::string StreamFormatter::Delta(int index, const std::string& text,
                                   const std::vector<scheduler::TokenLogprob>& lp) {
  if (ctx_.echo_only) return "";
  const bool with_logprobs = !lp.empty() && ctx_.logprobs;
  if (!ctx_.tools) return text.empty() && !with_logprobs ? "" : Chunk(index, text, lp, nullptr);
  ToolCallStream& calls = tool_calls_[index];
  const int before = calls.calls_so_far();
  const ParsedReply reply = calls.Feed(text);
  std::string out;
  if (!reply.content.empty() || with_logprobs) out = Chunk(index, reply.content, lp, nullptr);
  if (!reply.calls.empty()) out += ToolCallsChunk(index, reply.calls, before);
  return out;
}

std::string StreamFormatter::ToolCallsChunk(int index, const std::vector<ParsedToolCall>& calls,
                                            int first_call) {
  Json body = Envelope(ctx_, "chat.completion.chunk");
  body["choices"] = Json::array({{{"index", index},
                                  {"delta", {{"tool_calls", ToolCallsJson(calls, first_call,
                                                                          true)}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}});
  if (ctx_.include_usage) body["usage"] = nullptr;
  return SseEvent(Dump(body));
}

std::string StreamFormatter::Finish(int index, scheduler::FinishReason reason) {
  std::string out;
  const char* finish_reason = OpenAiFinishReason(reason);
  if (ctx_.tools) {
    ToolCallStream& calls = tool_calls_[index];
    const int before = calls.calls_so_far();
    // An unclosed block is content; a Llama 3.x call is known only once the reply ends.
    const ParsedReply rest = calls.Finish();
    if (!rest.content.empty()) out += Chunk(index, rest.content, {}, nullptr);
    if (!rest.calls.empty()) out += ToolCallsChunk(index, rest.calls, before);
    finish_reason = FinishReasonWithCalls(reason, calls.calls_so_far() > 0);
  }
  return out + Chunk(index, "", {}, finish_reason);
}

std::string StreamFormatter::Done(const scheduler::Usage& usage) {
  std::string out;
  if (ctx_.include_usage) {
    const bool chat = ctx_.endpoint == Endpoint::kChat;
    Json body = Envelope(ctx_, chat ? "chat.completion.chunk" : "text_completion");
    body["choices"] = Json::array();
    body["usage"] = UsageJson(usage);
    out += SseEvent(Dump(body));
  }
  return out + kSseDone;
}

std::string StreamFormatter::Error(int status, const std::string& message) {
  Json err = {{"error",
               {{"message", message}, {"type", "server_error"}, {"param", nullptr},
                {"code", status}}}};
  return SseEvent(Dump(err)) + kSseDone;
}

std::string ErrorBody(const std::string& message, const std::string& type,
                      const std::string& param, const std::string& code) {
  Json err = {{"message", message},
              {"type", type},
              {"param", param.empty() ? Json() : Json(param)},
              {"code", code.empty() ? Json() : Json(code)}};
  return Dump(Json{{"error", err}});
}

std::string SseEvent(const std::string& payload) { return absl::StrCat("data: ", payload, "\n\n"); }

}  // namespace winnow::server::http
