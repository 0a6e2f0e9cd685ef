#include "server/http/tool_calls.h"

#include <random>
#include <string_view>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace winnow::server::http {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string NewCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("call_%016x", rng());
}

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// The call in a block's body ({"name": ..., "arguments" or "parameters": {...}}), or false.
bool ParseCall(std::string_view body, ParsedToolCall* call) {
  const Json j = Json::parse(Trim(body), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  auto arguments = j.find("arguments");
  if (arguments == j.end()) arguments = j.find("parameters");
  call->id = NewCallId();
  call->name = name->get<std::string>();
  call->arguments = arguments == j.end() ? "{}" : arguments->dump();
  return true;
}

// How many trailing bytes of `text` could begin kOpen: held back until the next delta decides.
size_t PossibleOpenPrefix(std::string_view text) {
  for (size_t n = std::min(text.size(), kOpen.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == kOpen.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ParsedReply ParseToolCalls(const std::string& text, model::ToolCallSyntax syntax) {
  ToolCallStream stream(syntax);
  ParsedReply reply = stream.Feed(text);
  ParsedReply rest = stream.Finish();
  reply.content += rest.content;
  for (ParsedToolCall& call : rest.calls) reply.calls.push_back(std::move(call));
  return reply;
}

void ToolCallStream::Emit(std::string_view text, std::string* content) {
  size_t end = text.size();
  while (end > 0 && IsSpace(text[end - 1])) --end;
  if (end == 0) {  // only whitespace: it waits to see what follows
    held_space_ += text;
    return;
  }
  *content += held_space_;
  held_space_.clear();
  content->append(text.substr(0, end));
  held_space_ = std::string(text.substr(end));
}

ParsedReply ToolCallStream::FeedLlama(const std::string& delta) {
  ParsedReply out;
  if (plain_) {
    out.content = delta;
    return out;
  }
  pending_ += delta;
  const std::string_view start = Trim(pending_);
  // Held while it may be a call: empty so far, an object, or (the start of) the python tag.
  if (kPythonTag.starts_with(start.substr(0, kPythonTag.size())) || start.front() == '{') {
    return out;
  }
  plain_ = true;
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

ParsedReply ToolCallStream::Feed(const std::string& delta) {
  if (syntax_ == model::ToolCallSyntax::kLlamaJson) return FeedLlama(delta);
  pending_ += delta;
  ParsedReply out;
  for (;;) {
    const size_t open = pending_.find(kOpen);
    if (open == std::string::npos) {
      const size_t hold = PossibleOpenPrefix(pending_);
      Emit(std::string_view(pending_).substr(0, pending_.size() - hold), &out.content);
      pending_.erase(0, pending_.size() - hold);
      break;
    }
    Emit(std::string_view(pending_).substr(0, open), &out.content);
    pending_.erase(0, open);
    const size_t close = pending_.find(kClose, kOpen.size());
    if (close == std::string::npos) break;  // the block is still being written
    const size_t end = close + kClose.size();
    ParsedToolCall call;
    if (ParseCall(std::string_view(pending_).substr(kOpen.size(), close - kOpen.size()),
                  &call)) {
      held_space_.clear();  // whitespace around a call separates, it is not content
      out.calls.push_back(std::move(call));
      ++calls_;
    } else {
      Emit(std::string_view(pending_).substr(0, end), &out.content);
    }
    pending_.erase(0, end);
  }
  return out;
}

ParsedReply ToolCallStream::Finish() {
  ParsedReply out;
  if (syntax_ == model::ToolCallSyntax::kLlamaJson) {
    std::string_view body = Trim(pending_);
    if (body.substr(0, kPythonTag.size()) == kPythonTag) body.remove_prefix(kPythonTag.size());
    ParsedToolCall call;
    if (!plain_ && ParseCall(body, &call)) {
      out.calls.push_back(std::move(call));
      ++calls_;
    } else {
      out.content = std::move(pending_);
    }
    pending_.clear();
    return out;
  }
  // Trailing whitespace is the reply's own unless it follows a call.
  if (calls_ == 0 || !pending_.empty()) out.content = held_space_;
  out.content += pending_;
  held_space_.clear();
  pending_.clear();
  return out;
}

}  // namespace winnow::server::http
