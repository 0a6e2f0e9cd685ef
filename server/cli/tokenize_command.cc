// `winnow tokenize`: token ids of a text as llama_tokenize(text, add_special, parse_special) would
// give them, plus the batch and decode modes the tokenizer tests use.
//
//   --text TEXT | --text-file F      one JSON array of ids
//   --jsonl F                        one JSON string per input line -> one JSON array per line
//                                    (with --round-trip: {"ids": [...], "text": decoded})
//   --decode-ids '[1,2,3]'           the decoded bytes, verbatim
//   --chat F                         F holds messages (a JSON array, or {"messages": [...],
//                                    "tools": [...], "add_generation_prompt": bool}); prints
//                                    {"prompt", "ids"}, rendered as the daemon renders chats
//   --chat-jsonl F                   one such chat per line -> {"prompt", "ids"} or {"error"}
//   --chat-template T                (with either) render with the Jinja file T instead
//   --tokenizer-json PATH            use a Hugging Face tokenizer.json instead of the model's
//                                    tokenizer (encoding as the `tokenizers` library); not with
//                                    --chat / --chat-jsonl, which need a model's template
// --model takes a GGUF file or a Hugging Face directory (its tokenizer and special tokens as
// the daemon loads them).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"

namespace winnow::cli {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::optional<std::string> bytes = base::ReadWholeFile(path);
  if (!bytes) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  return *std::move(bytes);
}

std::string IdsJson(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, ids[i]);
  }
  out += "]";
  return out;
}

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
}

absl::Status RunJsonl(const model::Tokenizer& tok, const std::string& path, bool add_special,
                      bool parse_special, bool round_trip) {
  WINNOW_ASSIGN_OR_RETURN(const std::string data, ReadFile(path));
  std::istringstream lines(data);
  std::string line;
  std::string out;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty()) continue;
    json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected one JSON string per line"));
    }
    const std::string text = value.get<std::string>();
    const std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
    if (round_trip) {
      json obj;
      obj["ids"] = ids;
      obj["text"] = tok.Decode(ids, /*render_special=*/true);
      out += DumpJson(obj);
    } else {
      out += IdsJson(ids);
    }
    out += "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return absl::OkStatus();
}

// One chat of --chat / --chat-jsonl: messages (a JSON array, or {"messages", "tools",
// "add_generation_prompt"}) rendered with `tmpl` and tokenized; {"prompt", "ids"}.
absl::StatusOr<json> RenderChat(const model::ChatTemplate& tmpl, const model::Tokenizer& tok,
                                const std::string& text, bool add_special) {
  // Ordered: tools are rendered with their keys in the order sent, as Python's json.dumps does.
  using ordered = nlohmann::ordered_json;
  ordered doc = ordered::parse(text, nullptr, /*allow_exceptions=*/false);
  bool add_generation_prompt = true;
  ordered messages = doc;
  std::vector<std::string> tools;
  if (doc.is_object()) {
    messages = doc.value("messages", ordered::array());
    add_generation_prompt = doc.value("add_generation_prompt", true);
    for (const ordered& tool : doc.value("tools", ordered::array())) tools.push_back(tool.dump());
  }
  if (!messages.is_array()) return absl::InvalidArgumentError("expected a message list");
  std::vector<model::ChatMessage> chat;
  for (const ordered& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError("each message needs a string role");
    }
    const ordered content = m.value("content", ordered());
    model::ChatMessage message{m["role"].get<std::string>(),
                               content.is_string() ? content.get<std::string>() : ""};
    message.tool_call_id = m.value("tool_call_id", "");
    // OpenAI's shape: {"id", "type": "function", "function": {"name", "arguments"}}.
    for (const ordered& call : m.value("tool_calls", ordered::array())) {
      const ordered function = call.value("function", ordered::object());
      const ordered arguments = function.value("arguments", ordered::object());
      message.tool_calls.push_back({call.value("id", ""), function.value("name", ""),
                                    arguments.is_string() ? arguments.get<std::string>()
                                                          : arguments.dump()});
    }
    chat.push_back(std::move(message));
  }
  WINNOW_ASSIGN_OR_RETURN(const std::string prompt,
                          tmpl.Apply(chat, add_generation_prompt, tools));
  json obj;
  obj["prompt"] = prompt;
  obj["ids"] = model::EncodeRenderedChat(tok, prompt, add_special);
  return obj;
}

// RenderChat, with a field of the wrong type (nlohmann's value() throws) an error too.
absl::StatusOr<json> TryRenderChat(const model::ChatTemplate& tmpl, const model::Tokenizer& tok,
                                   const std::string& text, bool add_special) {
  try {
    return RenderChat(tmpl, tok, text, add_special);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

// --chat F: one chat, an error fails the command. --chat-jsonl F: one chat per line, one
// {"prompt", "ids"} or {"error"} per line.
absl::Status RunChat(const model::ChatTemplate& tmpl, const model::Tokenizer& tok,
                     const std::string& path, bool add_special, bool per_line) {
  WINNOW_ASSIGN_OR_RETURN(const std::string data, ReadFile(path));
  std::string out;
  if (!per_line) {
    WINNOW_ASSIGN_OR_RETURN(const json obj, TryRenderChat(tmpl, tok, data, add_special));
    out = DumpJson(obj) + "\n";
  } else {
    std::istringstream lines(data);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      const absl::StatusOr<json> obj = TryRenderChat(tmpl, tok, line, add_special);
      out += DumpJson(obj.ok() ? *obj : json{{"error", std::string(obj.status().message())}});
      out += "\n";
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return absl::OkStatus();
}

struct TokenizeFlags {
  CommonFlags common;
  std::string text, text_file, jsonl, decode_ids, chat, chat_jsonl, tokenizer_json;
  bool no_special = false;
  bool no_parse_special = false;
  bool round_trip = false;
  bool render_special = false;
};

absl::Status DecodeIds(const model::Tokenizer& tok, const std::string& list, bool render_special) {
  json ids = json::parse(list, nullptr, /*allow_exceptions=*/false);
  if (!ids.is_array()) return absl::InvalidArgumentError("--decode-ids: expected a JSON array");
  std::vector<int32_t> values;
  for (const json& v : ids) {
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError("--decode-ids: ids must be integers");
    }
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= tok.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("--decode-ids: id ", id,
                                                     " is outside the vocabulary of ",
                                                     tok.vocab_size()));
    }
    values.push_back(static_cast<int32_t>(id));
  }
  const std::string text = tok.Decode(values, render_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return absl::OkStatus();
}

absl::Status RunTextModes(const TokenizeFlags& f, const std::string& mode,
                          const model::Tokenizer& tok);

// `mode` is the one input flag given.
absl::Status Run(const TokenizeFlags& f, const std::string& mode) {
  const bool add_special = !f.no_special;
  const bool chat = mode == "--chat" || mode == "--chat-jsonl";
  if (!f.tokenizer_json.empty()) {
    if (chat) {
      return absl::InvalidArgumentError(
          "--tokenizer-json: chats need a model's chat template; use --model");
    }
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tok,
                            model::Tokenizer::FromTokenizerJsonFile(f.tokenizer_json));
    return RunTextModes(f, mode, *tok);
  }
  const std::string& chat_path = mode == "--chat-jsonl" ? f.chat_jsonl : f.chat;
  if (std::filesystem::is_directory(f.common.model)) {
    // A Hugging Face directory: its tokenizer and template as the daemon loads them (the
    // weights are only mapped).
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m,
                            model::Model::Load(f.common.model, f.common.chat_template));
    if (!chat) return RunTextModes(f, mode, m->tokenizer());
    WINNOW_RETURN_IF_ERROR(m->chat_template().status());
    return RunChat(*m->chat_template(), m->tokenizer(), chat_path, add_special,
                   mode == "--chat-jsonl");
  }
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file,
                          model::GgufFile::Open(f.common.model));
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tok,
                          model::Tokenizer::FromGguf(*file));
  if (!chat) return RunTextModes(f, mode, *tok);
  WINNOW_ASSIGN_OR_RETURN(const model::ChatTemplate tmpl,
                          model::ChatTemplate::FromGguf(*file, f.common.chat_template));
  return RunChat(tmpl, *tok, chat_path, add_special, mode == "--chat-jsonl");
}

// The modes that need only a tokenizer: --jsonl, --decode-ids, --text, --text-file.
absl::Status RunTextModes(const TokenizeFlags& f, const std::string& mode,
                          const model::Tokenizer& tok) {
  const bool add_special = !f.no_special;
  const bool parse_special = !f.no_parse_special;
  if (mode == "--jsonl") return RunJsonl(tok, f.jsonl, add_special, parse_special, f.round_trip);
  if (mode == "--decode-ids") return DecodeIds(tok, f.decode_ids, f.render_special);
  std::string text = f.text;
  if (mode == "--text-file") {
    WINNOW_ASSIGN_OR_RETURN(text, ReadFile(f.text_file));
  }
  const std::string out = IdsJson(tok.Encode(text, add_special, parse_special)) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return absl::OkStatus();
}

}  // namespace

int RunTokenize(const std::vector<std::string>& args) {
  CLI::App app("Token ids of a text (JSON), and the batch, chat and decode modes the tokenizer "
               "tests use.",
               "winnow tokenize");
  TokenizeFlags f;
  AddCommonFlags(app, &f.common);
  const std::vector<CLI::Option*> modes = {
      app.add_option("--text", f.text, "text to tokenize; prints one JSON array of ids"),
      app.add_option("--text-file", f.text_file, "file (- for stdin) to tokenize"),
      app.add_option("--jsonl", f.jsonl,
                     "file with one JSON string per line; prints one id array per line"),
      app.add_option("--decode-ids", f.decode_ids, "JSON array of ids; prints their text"),
      app.add_option("--chat", f.chat,
                     "JSON file of messages (or {\"messages\", \"add_generation_prompt\"}); "
                     "prints {\"prompt\", \"ids\"}"),
      app.add_option("--chat-jsonl", f.chat_jsonl,
                     "one chat per line, as --chat; prints {\"prompt\", \"ids\"} or "
                     "{\"error\"} per line"),
  };
  app.add_option("--tokenizer-json", f.tokenizer_json,
                 "Hugging Face tokenizer.json to use instead of the model's tokenizer");
  app.add_flag("--no-special", f.no_special, "no BOS/EOS added");
  app.add_flag("--no-parse-special", f.no_parse_special,
               "special-token text (<|im_start|>) is plain text");
  app.add_flag("--round-trip", f.round_trip, "--jsonl: print {\"ids\", \"text\"} per line");
  app.add_flag("--render-special", f.render_special, "--decode-ids: include control tokens' text");
  if (std::optional<int> exit = base::ParseCommandLine(app, args)) return *exit;

  std::vector<std::string> given;
  for (const CLI::Option* mode : modes) {
    if (*mode) given.push_back(mode->get_name());
  }
  absl::Status status =
      given.size() == 1
          ? Run(f, given.front())
          : absl::InvalidArgumentError(
                "give exactly one of --text, --text-file, --jsonl, --decode-ids, --chat or "
                "--chat-jsonl");
  if (!status.ok()) {
    std::fprintf(stderr, "winnow tokenize: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace winnow::cli
