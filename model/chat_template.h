// Chat templates recognised from the model's tokenizer.chat_template metadata. Only known
// families are rendered (no Jinja interpreter): ChatML (SmolLM2, Qwen) and Llama-3.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::model {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant turns that called tools
  std::string tool_call_id;          // tool turns
};

enum class ChatTemplateKind { kChatMl, kLlama3 };

class ChatTemplate {
 public:
  // Recognises the family from tokenizer.chat_template. A missing or unrecognised template is
  // FailedPrecondition with a message asking for a raw prompt instead.
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& file);
  static absl::StatusOr<ChatTemplate> FromTemplateText(const std::string& jinja_text);

  ChatTemplateKind kind() const { return kind_; }
  // Renders the conversation exactly as the model's Jinja template would, ending with the
  // assistant header when add_generation_prompt is set. Unknown roles are InvalidArgument.
  // `tools` are OpenAI tool objects ({"type": "function", "function": {...}}) as JSON text.
  // ChatML renders tools, tool calls and tool results as Qwen2.5's template does (Hermes
  // format: <tools>, <tool_call>, <tool_response>), also for ChatML templates that have no tool
  // section of their own (SmolLM2); Llama-3 refuses them (InvalidArgument).
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages,
                                    bool add_generation_prompt,
                                    const std::vector<std::string>& tools = {}) const;

 private:
  absl::StatusOr<std::string> ApplyChatMl(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt,
                                          const std::vector<std::string>& tools) const;

  ChatTemplateKind kind_ = ChatTemplateKind::kChatMl;
  std::string default_system_;  // ChatML templates that insert a system turn (SmolLM2) do so
  // Qwen2.5 emits its default system turn before the message loop, so even for no messages;
  // SmolLM2 does it inside the loop.
  bool system_outside_loop_ = false;
  std::string bos_text_ = "<|begin_of_text|>";  // Llama-3's bos_token
  // Llama-3.1/3.2 always open with a system turn carrying these dates.
  bool llama31_system_ = false;
  std::string date_string_;
};

// Token ids of a rendered chat prompt. A template that writes the BOS text itself (Llama-3)
// gets no second BOS from tokenisation, as llama.cpp's chat handling does.
// JSON as Python's json.dumps writes it by default (", " and ": " separators, non-ASCII kept):
// how Jinja's tojson renders tools and arguments in Hugging Face templates. InvalidArgument for
// text that is not JSON.
absl::StatusOr<std::string> PythonJsonDumps(const std::string& json_text);

std::vector<int32_t> EncodeRenderedChat(const Tokenizer& tokenizer, const std::string& rendered,
                                        bool add_special);

}  // namespace winnow::model
