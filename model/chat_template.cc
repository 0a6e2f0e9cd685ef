#include "model/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/template/chatml_tools_jinja.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";

// Text of the token `key` names in the GGUF's vocabulary, or "" when it has none.
std::string TokenText(const GgufFile& file, const char* key) {
  const absl::StatusOr<int64_t> id = file.GetInt(key);
  const absl::StatusOr<std::vector<std::string>> tokens =
      file.GetStringArray("tokenizer.ggml.tokens");
  if (!id.ok() || !tokens.ok() || *id < 0 || *id >= static_cast<int64_t>(tokens->size())) {
    return "";
  }
  return (*tokens)[*id];
}

absl::StatusOr<std::string> ReadTemplateFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--chat-template ", path, ": cannot read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenAI's message shape, as clients send it and templates read it: tool calls as
// {"id", "type": "function", "function": {"name", "arguments": <object>}} (arguments parsed
// from their JSON text, as vLLM does before rendering) and a null content beside them.
absl::StatusOr<Json> MessageJson(const ChatMessage& m, size_t index, bool map_developer) {
  Json out = {{"role", map_developer && m.role == "developer" ? "system" : m.role}};
  if (m.content.empty() && !m.tool_calls.empty()) {
    out["content"] = nullptr;
  } else {
    out["content"] = m.content;
  }
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      const ToolCall& call = m.tool_calls[j];
      Json arguments = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      if (arguments.is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat("[", index, "].tool_calls[", j, "].arguments: not valid JSON"));
      }
      calls.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", std::move(arguments)}}}});
    }
    out["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) out["tool_call_id"] = m.tool_call_id;
  return out;
}

bool UsesTools(const std::vector<ChatMessage>& messages, const std::vector<std::string>& tools) {
  if (!tools.empty()) return true;
  for (const ChatMessage& m : messages) {
    if (m.role == "tool" || !m.tool_calls.empty()) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file,
                                                    const std::string& template_path) {
  std::string text;
  if (!template_path.empty()) {
    WINNOW_ASSIGN_OR_RETURN(text, ReadTemplateFile(template_path));
  } else {
    absl::StatusOr<std::string> stored = file.GetString("tokenizer.chat_template");
    if (!stored.ok()) {
      return absl::FailedPreconditionError(
          "model has no chat template (tokenizer.chat_template); send a raw prompt instead, or "
          "serve with --chat-template FILE");
    }
    text = *std::move(stored);
  }
  SpecialTokens special{TokenText(file, "tokenizer.ggml.bos_token_id"),
                        TokenText(file, "tokenizer.ggml.eos_token_id"),
                        TokenText(file, "tokenizer.ggml.unknown_token_id"),
                        TokenText(file, "tokenizer.ggml.padding_token_id")};
  absl::StatusOr<ChatTemplate> tmpl = FromTemplateText(text, std::move(special));
  if (!tmpl.ok() && !template_path.empty()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat("--chat-template ", template_path, ": ",
                                     tmpl.status().message()));
  }
  return tmpl;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTemplateText(const std::string& jinja_text,
                                                            SpecialTokens special) {
  WINNOW_ASSIGN_OR_RETURN(jinja::Template compiled, jinja::Template::Compile(jinja_text));
  ChatTemplate t(std::move(compiled), std::move(special));
  t.renders_tools_ = absl::StrContains(jinja_text, "tool");
  t.knows_developer_ = absl::StrContains(jinja_text, "developer");
  // Llama 3.x's templates ask for {"name": ..., "parameters": ...} and write past calls so.
  if (t.renders_tools_ && !absl::StrContains(jinja_text, "<tool_call>") &&
      absl::StrContains(jinja_text, "<|start_header_id|>") &&
      absl::StrContains(jinja_text, "\"parameters\": ")) {
    t.tool_call_syntax_ = ToolCallSyntax::kLlamaJson;
  }
  if (!t.renders_tools_ && absl::StrContains(jinja_text, kImStart)) {
    WINNOW_ASSIGN_OR_RETURN(jinja::Template tools, jinja::Template::Compile(kChatMlToolsJinja));
    t.chatml_tools_ = std::move(tools);
    // What the model's template writes before a lone user turn, if it is a system turn.
    ChatMessage user;
    user.role = "user";
    const absl::StatusOr<std::string> lone = t.Apply({user}, false);
    const std::string head = absl::StrCat(kImStart, "system\n");
    if (lone.ok() && absl::StartsWith(*lone, head)) {
      const size_t end = lone->find(kImEnd);
      if (end != std::string::npos) {
        t.default_system_ = lone->substr(head.size(), end - head.size());
      }
    }
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const std::vector<std::string>& tools) const {
  const bool tool_fallback = UsesTools(messages, tools) && !renders_tools_;
  if (tool_fallback && !chatml_tools_.has_value()) {
      return absl::InvalidArgumentError(
          "the model's chat template does not render tools, tool calls or tool results; serve "
          "the model with --chat-template FILE naming a template that does");
  }
  Json vars = Json::object();
  vars["messages"] = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    WINNOW_ASSIGN_OR_RETURN(Json message, MessageJson(messages[i], i, !knows_developer_));
    vars["messages"].push_back(std::move(message));
  }
  vars["tools"] = nullptr;
  if (!tools.empty()) {
    vars["tools"] = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      Json tool = Json::parse(tools[i], nullptr, /*allow_exceptions=*/false);
      if (tool.is_discarded()) {
        return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: not valid JSON"));
      }
      vars["tools"].push_back(std::move(tool));
    }
  }
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  const std::pair<const char*, const std::string*> special[] = {
      {"bos_token", &special_.bos}, {"eos_token", &special_.eos},
      {"unk_token", &special_.unk}, {"pad_token", &special_.pad}};
  for (const auto& [name, text] : special) {
    if (!text->empty()) vars[name] = *text;
  }
  if (!tool_fallback) return template_.Render(vars);
  vars["default_system"] = default_system_;
  return chatml_tools_->Render(vars);
}

std::vector<int32_t> EncodeRenderedChat(const Tokenizer& tokenizer, const std::string& rendered,
                                        bool add_special) {
  const bool template_has_bos =
      tokenizer.bos_id() >= 0 && tokenizer.add_bos() &&
      absl::StartsWith(rendered, tokenizer.TokenText(tokenizer.bos_id()));
  return tokenizer.Encode(rendered, add_special && !template_has_bos, /*parse_special=*/true);
}

}  // namespace winnow::model
