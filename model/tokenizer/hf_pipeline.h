// The text stages of a Hugging Face tokenizer.json, as the `tokenizers` library runs them:
// normalizers, pre-tokenizers and (per token) decoders, each built from its JSON object. Every
// component type that is not implemented is refused with the JSON path of its "type".
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/pcre2_regex.h"
#include "nlohmann/json.hpp"

namespace winnow::model {

// A regex from tokenizer.json (written for Oniguruma, which `tokenizers` uses), run with PCRE2.
class HfRegex {
 public:
  // Translates the Oniguruma spellings that mean something else to PCRE2 (\s, \S, \h) and
  // compiles; an unsupported construct is an error.
  static absl::StatusOr<std::unique_ptr<HfRegex>> Compile(std::string_view onig_pattern);
  // A pattern that matches `literal` exactly.
  static std::unique_ptr<HfRegex> Literal(std::string_view literal);
  ~HfRegex();
  HfRegex(const HfRegex&) = delete;
  HfRegex& operator=(const HfRegex&) = delete;

  // Non-overlapping matches, left to right, as [start, end) byte ranges. An empty match is
  // reported unless it ends where the previous match ended (Rust's and onig's iteration rule).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  HfRegex() = default;
  std::string literal_;  // set for Literal(): matched with find(), no regex
  std::unique_ptr<Pcre2Regex> compiled_;
};

// A piece of text between the added-token split and the model. `at_start`: the piece begins at
// offset 0 of the input (Metaspace's prepend_scheme "first" looks at that).
struct HfPiece {
  std::string text;
  bool at_start = false;
};

class HfNormalizer {
 public:
  // `json` may be null (no normalizer). `path` names the object in error messages.
  static absl::StatusOr<std::unique_ptr<HfNormalizer>> FromJson(const nlohmann::json& json,
                                                                const std::string& path);
  virtual ~HfNormalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

class HfPreTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfPreTokenizer>> FromJson(const nlohmann::json& json,
                                                                  const std::string& path);
  virtual ~HfPreTokenizer() = default;
  // Replaces each piece by the pieces it splits into (empty pieces are dropped).
  virtual void PreTokenize(std::vector<HfPiece>* pieces) const = 0;
};

// Decoders applied to one token at a time (winnow decodes token by token). Whole-text steps of
// `tokenizers` (Strip after Fuse, Metaspace's removal of the first token's leading space) are
// not applied: like GGUF SentencePiece pieces, a token keeps its leading space.
class HfDecoder {
 public:
  static absl::StatusOr<std::unique_ptr<HfDecoder>> FromJson(const nlohmann::json& json,
                                                             const std::string& path);
  virtual ~HfDecoder() = default;
  virtual void Decode(std::string* token) const = 0;
};

// Values of a JSON object's fields, with errors that name the path.
absl::StatusOr<std::string> JsonString(const nlohmann::json& obj, const char* key,
                                       const std::string& path);
absl::StatusOr<bool> JsonBool(const nlohmann::json& obj, const char* key,
                              const std::string& path, bool fallback);
// The "type" of a component object, or an error naming path.type.
absl::StatusOr<std::string> JsonType(const nlohmann::json& obj, const std::string& path);

}  // namespace winnow::model
