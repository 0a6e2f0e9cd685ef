#include "model/chat_template.h"

#include <algorithm>
#include <ctime>
#include <optional>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";
constexpr char kHeaderStart[] = "<|start_header_id|>";
constexpr char kHeaderEnd[] = "<|end_header_id|>";
constexpr char kEotId[] = "<|eot_id|>";

// Undoes the escapes a Jinja string literal may contain.
std::string UnescapeJinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      default: out.push_back(c); break;  // \\, \', \"
    }
  }
  return out;
}

// Python's str.strip(), which Jinja's `trim` filter calls.
bool IsPythonSpace(uint32_t cpt) {
  return IsUnicodeWhitespace(cpt) || (cpt >= 0x1C && cpt <= 0x1F);
}

std::string PythonStrip(const std::string& s) {
  if (!IsValidUtf8(s)) return s;  // content comes from protobuf strings, so this is unreachable
  const std::vector<uint32_t> cpts = DecodeUtf8Lenient(s);
  size_t begin = 0, end = cpts.size();
  while (begin < end && IsPythonSpace(cpts[begin])) ++begin;
  while (end > begin && IsPythonSpace(cpts[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cpts[i], &out);
  return out;
}

// The template scans below were std::regex searches; libstdc++'s matcher recurses once per
// character matched, so a template with a 100 KB system turn overflowed the stack and crashed
// the daemon while loading the model (found with fuzz/chat_template_fuzz.cc). These scans do the
// same matching in loops.

bool IsJinjaSpace(char c) {  // ECMAScript \s over ASCII
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Skips whitespace at `*pos`; false when fewer than `min` characters were skipped.
bool SkipSpaces(std::string_view s, size_t* pos, size_t min) {
  const size_t start = *pos;
  while (*pos < s.size() && IsJinjaSpace(s[*pos])) ++*pos;
  return *pos - start >= min;
}

bool Consume(std::string_view s, size_t* pos, std::string_view word) {
  if (s.substr(*pos, word.size()) != word) return false;
  *pos += word.size();
  return true;
}

bool IsQuote(char c) { return c == '\'' || c == '"'; }

struct DefaultSystem {
  size_t position;        // of its <|im_start|>
  std::string_view text;  // still Jinja-escaped
};

// The first '<|im_start|>system' + ('\\n' or a newline) + text without quotes + '<|im_end|>'.
std::optional<DefaultSystem> FindDefaultSystem(std::string_view t) {
  const std::string_view head = "<|im_start|>system";
  for (size_t at = t.find(head); at != std::string_view::npos; at = t.find(head, at + 1)) {
    size_t pos = at + head.size();
    if (!Consume(t, &pos, "\\n") && !Consume(t, &pos, "\n")) continue;
    const size_t end = t.find(kImEnd, pos);
    if (end == std::string_view::npos) return std::nullopt;  // no later start can end either
    const std::string_view text = t.substr(pos, end - pos);
    if (std::find_if(text.begin(), text.end(), IsQuote) == text.end()) {
      return DefaultSystem{at, text};
    }
  }
  return std::nullopt;
}

// Position of the first '{%' '-'? spaces 'for' spaces 'message' spaces 'in' spaces 'messages'.
size_t FindMessageLoop(std::string_view t) {
  for (size_t at = t.find("{%"); at != std::string_view::npos; at = t.find("{%", at + 1)) {
    size_t pos = at + 2;
    Consume(t, &pos, "-");
    if (SkipSpaces(t, &pos, 0) && Consume(t, &pos, "for") && SkipSpaces(t, &pos, 1) &&
        Consume(t, &pos, "message") && SkipSpaces(t, &pos, 1) && Consume(t, &pos, "in") &&
        SkipSpaces(t, &pos, 1) && Consume(t, &pos, "messages")) {
      return at;
    }
  }
  return std::string_view::npos;
}

// The quoted value of the first 'set' spaces 'date_string' spaces? '=' spaces? quoted string.
std::optional<std::string_view> FindDateString(std::string_view t) {
  for (size_t at = t.find("set"); at != std::string_view::npos; at = t.find("set", at + 1)) {
    size_t pos = at + 3;
    if (!(SkipSpaces(t, &pos, 1) && Consume(t, &pos, "date_string"))) continue;
    SkipSpaces(t, &pos, 0);
    if (!Consume(t, &pos, "=")) continue;
    SkipSpaces(t, &pos, 0);
    if (pos >= t.size() || !IsQuote(t[pos])) continue;
    const size_t begin = pos + 1;
    size_t end = begin;
    while (end < t.size() && !IsQuote(t[end])) ++end;
    if (end < t.size()) return t.substr(begin, end - begin);  // either quote closes, as before
  }
  return std::nullopt;
}

std::string TodayForLlama() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%d %b %Y", &local);
  return buf;
}


using OrderedJson = nlohmann::ordered_json;

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, only '"', '\\'
// and control characters escaped.
void AppendPythonJson(const OrderedJson& v, std::string* out) {
  switch (v.type()) {
    case OrderedJson::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) out->append(", ");
        first = false;
        AppendPythonJson(OrderedJson(key), out);
        out->append(": ");
        AppendPythonJson(value, out);
      }
      out->push_back('}');
      return;
    }
    case OrderedJson::value_t::array: {
      out->push_back('[');
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out->append(", ");
        AppendPythonJson(v[i], out);
      }
      out->push_back(']');
      return;
    }
    default:
      // Scalars: nlohmann writes strings, numbers and literals as json.dumps does, except that
      // it escapes nothing above U+001F either (ensure_ascii=False).
      out->append(v.dump(-1, ' ', /*ensure_ascii=*/false,
                         OrderedJson::error_handler_t::replace));
  }
}

// Qwen2.5's tool preamble, closing the system turn.
constexpr char kToolsIntro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr char kToolsOutro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// An assistant turn with tool calls, as Qwen2.5 writes it.
absl::StatusOr<std::string> AssistantToolCalls(const ChatMessage& m) {
  std::string out = absl::StrCat(kImStart, "assistant");
  if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
  for (size_t j = 0; j < m.tool_calls.size(); ++j) {
    const ToolCall& call = m.tool_calls[j];
    absl::StatusOr<std::string> arguments = PythonJsonDumps(call.arguments);
    if (!arguments.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool_calls[", j, "].arguments: not valid JSON"));
    }
    absl::StrAppend(&out, "\n<tool_call>\n{\"name\": \"", call.name, "\", \"arguments\": ",
                    *arguments, "}\n</tool_call>");
  }
  absl::StrAppend(&out, kImEnd, "\n");
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file) {
  absl::StatusOr<std::string> text = file.GetString("tokenizer.chat_template");
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        "model has no chat template (tokenizer.chat_template); send a raw prompt instead");
  }
  WINNOW_ASSIGN_OR_RETURN(ChatTemplate tmpl, FromTemplateText(*text));
  // The template's bos_token is the model's BOS text.
  absl::StatusOr<int64_t> bos = file.GetInt("tokenizer.ggml.bos_token_id");
  absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (bos.ok() && tokens.ok() && *bos >= 0 && *bos < static_cast<int64_t>(tokens->size())) {
    tmpl.bos_text_ = (*tokens)[*bos];
  }
  return tmpl;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTemplateText(const std::string& jinja_text) {
  ChatTemplate t;
  if (absl::StrContains(jinja_text, kImStart)) {
    t.kind_ = ChatTemplateKind::kChatMl;
    // A system turn written out as a literal is the template's default system message:
    // '<|im_start|>system\n...<|im_end|>' with no quote inside (a quote would mean the content
    // is concatenated from the messages instead).
    if (std::optional<DefaultSystem> system = FindDefaultSystem(jinja_text)) {
      t.default_system_ = UnescapeJinja(system->text);
      const size_t loop = FindMessageLoop(jinja_text);
      t.system_outside_loop_ = loop != std::string_view::npos && system->position < loop;
    }
    return t;
  }
  if (absl::StrContains(jinja_text, kHeaderStart)) {
    t.kind_ = ChatTemplateKind::kLlama3;
    if (absl::StrContains(jinja_text, "Cutting Knowledge Date")) {
      t.llama31_system_ = true;
      if (absl::StrContains(jinja_text, "strftime_now")) {
        t.date_string_ = TodayForLlama();
      } else if (std::optional<std::string_view> date = FindDateString(jinja_text)) {
        t.date_string_ = std::string(*date);
      } else {
        t.date_string_ = "26 Jul 2024";
      }
    }
    return t;
  }
  return absl::FailedPreconditionError(
      "model chat template not recognised (only ChatML and Llama-3 are rendered); send a raw "
      "prompt instead");
}

absl::StatusOr<std::string> ChatTemplate::ApplyChatMl(const std::vector<ChatMessage>& messages,
                                                      bool add_generation_prompt,
                                                      const std::vector<std::string>& tools) const {
  std::string out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    // The system turn carries the tools: the first system message (else the default one),
    // then the tool signatures, one JSON object per line.
    const std::string& system = first_is_system ? messages[0].content : default_system_;
    absl::StrAppend(&out, kImStart, "system\n", system, system.empty() ? "" : "\n\n",
                    kToolsIntro);
    for (size_t i = 0; i < tools.size(); ++i) {
      absl::StatusOr<std::string> tool = PythonJsonDumps(tools[i]);
      if (!tool.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: not valid JSON"));
      }
      absl::StrAppend(&out, "\n", *tool);
    }
    absl::StrAppend(&out, kToolsOutro, kImEnd, "\n");
  } else if (!default_system_.empty() && !first_is_system &&
             (system_outside_loop_ || !messages.empty())) {
    absl::StrAppend(&out, kImStart, "system\n", default_system_, kImEnd, "\n");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && first_is_system && !tools.empty()) continue;  // in the tools turn
    if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      if (i == 0 || messages[i - 1].role != "tool") absl::StrAppend(&out, kImStart, "user");
      absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") {
        absl::StrAppend(&out, kImEnd, "\n");
      }
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      absl::StatusOr<std::string> turn = AssistantToolCalls(m);
      if (!turn.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("[", i, "].", turn.status().message()));
      }
      out += *turn;
    } else {
      absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
    }
  }
  if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const std::vector<std::string>& tools) const {
  bool uses_tools = !tools.empty();
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown chat role '", m.role, "'; expected system, user, assistant or tool"));
    }
    uses_tools = uses_tools || m.role == "tool" || !m.tool_calls.empty();
  }
  if (kind_ == ChatTemplateKind::kChatMl) return ApplyChatMl(messages, add_generation_prompt, tools);
  if (uses_tools) {
    return absl::InvalidArgumentError(
        "the model's chat template (Llama 3) does not render tools, tool calls or tool turns "
        "yet; ChatML models do");
  }
  std::string out;
  // Llama-3: content is trimmed; 3.0 puts bos_token before the first message only, 3.1+ always
  // starts with bos_token and a system turn carrying the knowledge-cutoff and today's dates.
  size_t first = 0;
  if (llama31_system_) {
    if (messages.empty()) {
      return absl::InvalidArgumentError("the model's chat template needs at least one message");
    }
    std::string system;
    if (messages[0].role == "system") {
      system = PythonStrip(messages[0].content);
      first = 1;
    }
    absl::StrAppend(&out, bos_text_, kHeaderStart, "system", kHeaderEnd,
                    "\n\nCutting Knowledge Date: December 2023\nToday Date: ", date_string_,
                    "\n\n", system, kEotId);
  }
  for (size_t i = first; i < messages.size(); ++i) {
    if (i == 0 && !llama31_system_) out += bos_text_;
    absl::StrAppend(&out, kHeaderStart, messages[i].role, kHeaderEnd, "\n\n",
                    PythonStrip(messages[i].content), kEotId);
  }
  if (add_generation_prompt) absl::StrAppend(&out, kHeaderStart, "assistant", kHeaderEnd, "\n\n");
  return out;
}

absl::StatusOr<std::string> PythonJsonDumps(const std::string& json_text) {
  const OrderedJson v = OrderedJson::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  std::string out;
  AppendPythonJson(v, &out);
  return out;
}

std::vector<int32_t> EncodeRenderedChat(const Tokenizer& tokenizer, const std::string& rendered,
                                        bool add_special) {
  const bool template_has_bos =
      tokenizer.bos_id() >= 0 && tokenizer.add_bos() &&
      absl::StartsWith(rendered, tokenizer.TokenText(tokenizer.bos_id()));
  return tokenizer.Encode(rendered, add_special && !template_has_bos, /*parse_special=*/true);
}

}  // namespace winnow::model
