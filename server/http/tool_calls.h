// Tool calls in a model's reply, in the syntax its chat template asks for
// (model::ToolCallSyntax). Hermes / Qwen2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n
// </tool_call>, possibly several; the text outside the blocks is the reply's content. Llama 3.x:
// the whole reply is one {"name": ..., "parameters": {...}} (after an optional <|python_tag|>).
// A call whose JSON does not parse (or lacks a name) stays in the content: nothing the model
// wrote is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"

namespace winnow::server::http {

struct ParsedToolCall {
  std::string id;         // "call_" + random hex, unique per call
  std::string name;
  std::string arguments;  // the arguments object as compact JSON text
};

struct ParsedReply {
  std::string content;  // outside the calls, without the whitespace next to them
  std::vector<ParsedToolCall> calls;
};

ParsedReply ParseToolCalls(const std::string& text,
                           model::ToolCallSyntax syntax = model::ToolCallSyntax::kHermes);

// The same, incrementally, for streams: content goes out as soon as it cannot be the start of a
// block, and each call as soon as its block closes.
class ToolCallStream {
 public:
  explicit ToolCallStream(model::ToolCallSyntax syntax = model::ToolCallSyntax::kHermes)
      : syntax_(syntax) {}
  ParsedReply Feed(const std::string& delta);
  // The end of the reply: whatever is held back (an unclosed block) goes out as content.
  ParsedReply Finish();
  int calls_so_far() const { return calls_; }

 private:
  // Appends `text` to `content`, holding back its trailing whitespace: whitespace next to a
  // call is dropped, elsewhere it goes out with the text that follows.
  void Emit(std::string_view text, std::string* content);

  // Llama 3.x: the reply is held while it may be a call (it starts with '{' or the python
  // tag), and goes out as content as soon as it cannot.
  ParsedReply FeedLlama(const std::string& delta);

  model::ToolCallSyntax syntax_;
  bool plain_ = false;      // Llama 3.x: the reply is not a call
  std::string pending_;     // text that may still be (part of) a block
  std::string held_space_;  // whitespace waiting for what follows it
  int calls_ = 0;
};

}  // namespace winnow::server::http
