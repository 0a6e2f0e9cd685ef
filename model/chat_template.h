// Chat templates as the model ships them: the Jinja text of the GGUF's tokenizer.chat_template
// (or a file the operator names with --chat-template), rendered by jinja2 exactly as Hugging
// Face transformers' apply_chat_template renders it (model/template/jinja.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/template/jinja.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::model {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  std::string role;  // "system", "developer", "user", "assistant", "tool", or the template's own
  std::string content;
  std::vector<ToolCall> tool_calls = {};  // assistant turns that called tools
  std::string tool_call_id = {};          // tool turns
};

// How a model writes tool calls in its replies, as its template teaches it: Hermes'
// <tool_call>{"name", "arguments"}</tool_call> blocks (Qwen, Hermes, and winnow's ChatML tool
// template), or Llama 3.1-3.3's reply that is one {"name", "parameters"} object.
enum class ToolCallSyntax { kHermes, kLlamaJson };

// The special tokens a template may read (bos_token, ...), as text; empty ones are not passed.
struct SpecialTokens {
  std::string bos, eos, unk, pad;
};

class ChatTemplate {
 public:
  // The GGUF's template, or the file at `template_path` when it is not empty, with the GGUF's
  // special tokens. A model without a template is FailedPrecondition asking for a raw prompt;
  // a template that does not compile is InvalidArgument with jinja2's message.
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& file,
                                               const std::string& template_path = "");
  static absl::StatusOr<ChatTemplate> FromTemplateText(const std::string& jinja_text,
                                                       SpecialTokens special = {});

  // Renders the conversation as apply_chat_template would (messages in OpenAI's shape, tool
  // call arguments parsed from their JSON text as vLLM does, `tools` as OpenAI tool objects in
  // JSON text, add_generation_prompt, the special tokens). The template's errors
  // (raise_exception) are InvalidArgument with its message. A request with tools, tool calls or
  // tool results for a template with no tool section is rendered by winnow's ChatML tool
  // template (model/template/chatml_tools.jinja) when the model speaks ChatML, and refused
  // otherwise. "developer" turns are "system" turns for templates that do not know the role.
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages,
                                    bool add_generation_prompt,
                                    const std::vector<std::string>& tools = {}) const;

  // Whether the model's own template has a tool section (it mentions "tool" at all: every
  // template in the test corpus that renders tools, tool calls or tool results does).
  bool renders_tools() const { return renders_tools_; }
  ToolCallSyntax tool_call_syntax() const { return tool_call_syntax_; }

 private:
  ChatTemplate(jinja::Template tmpl, SpecialTokens special)
      : template_(std::move(tmpl)), special_(std::move(special)) {}

  jinja::Template template_;
  SpecialTokens special_;
  bool renders_tools_ = false;
  bool knows_developer_ = false;
  ToolCallSyntax tool_call_syntax_ = ToolCallSyntax::kHermes;
  // ChatML models whose template has no tool section: winnow's tool template, and the system
  // text the model's template inserts into a chat without one.
  std::optional<jinja::Template> chatml_tools_;
  std::string default_system_;
};

// Token ids of a rendered chat prompt. A template that writes the BOS text itself (Llama-3)
// gets no second BOS from tokenisation, as llama.cpp's chat handling does.
std::vector<int32_t> EncodeRenderedChat(const Tokenizer& tokenizer, const std::string& rendered,
                                        bool add_special);

}  // namespace winnow::model
