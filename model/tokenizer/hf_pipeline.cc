#include "model/tokenizer/hf_pipeline.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/tokenizer/pcre2_regex.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc.h"

namespace winnow::model {
namespace {

using nlohmann::json;

// Oniguruma's \s in Unicode mode: U+0009-U+000D, U+0085 and the Z separators. PCRE2's \s in UCP
// mode leaves out U+0085, so the class is spelled out.
constexpr char kWhitespaceClass[] =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// Oniguruma's \h is a hexadecimal digit (PCRE2's is horizontal space).
constexpr char kHexClass[] = "0-9a-fA-F";

// The GPT-2 split of the ByteLevel pre-tokenizer (use_regex).
constexpr std::string_view kByteLevelPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

constexpr char kError[] = "tokenizer.json: ";

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(kError, path, " ", what));
}

absl::Status Unsupported(const std::string& path, const std::string& type) {
  return absl::UnimplementedError(
      absl::StrCat(kError, path, ".type '", type, "' is not supported"));
}

// Rewrites one escape (`c` follows the backslash) for PCRE2; false if it has no translation.
bool TranslateEscape(char c, bool in_class, std::string* out) {
  switch (c) {
    case 's':
      absl::StrAppend(out, in_class ? "" : "[", kWhitespaceClass, in_class ? "" : "]");
      return true;
    case 'S':
      if (in_class) return false;  // PCRE2 cannot subtract a class inside a class
      absl::StrAppend(out, "[^", kWhitespaceClass, "]");
      return true;
    case 'h':
      absl::StrAppend(out, in_class ? "" : "[", kHexClass, in_class ? "" : "]");
      return true;
    case 'H':
      if (in_class) return false;
      absl::StrAppend(out, "[^", kHexClass, "]");
      return true;
    default:
      out->push_back('\\');
      out->push_back(c);
      return true;
  }
}

absl::StatusOr<std::string> OnigToPcre2(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;  // index just past '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      if (!TranslateEscape(pattern[++i], in_class, &out)) {
        return absl::UnimplementedError(absl::StrCat("'\\", std::string(1, pattern[i]),
                                                     "' inside a character class"));
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && (i + 1 >= pattern.size() || pattern[i + 1] != ':')) {
      return absl::UnimplementedError("nested character classes");
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

HfRegex::~HfRegex() = default;

absl::StatusOr<std::unique_ptr<HfRegex>> HfRegex::Compile(std::string_view onig_pattern) {
  WINNOW_ASSIGN_OR_RETURN(const std::string pattern, OnigToPcre2(onig_pattern));
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<Pcre2Regex> compiled, Pcre2Regex::Compile(pattern));
  std::unique_ptr<HfRegex> regex(new HfRegex());
  regex->compiled_ = std::move(compiled);
  return regex;
}

std::unique_ptr<HfRegex> HfRegex::Literal(std::string_view literal) {
  std::unique_ptr<HfRegex> regex(new HfRegex());
  regex->literal_ = std::string(literal);
  return regex;
}

std::vector<std::pair<size_t, size_t>> HfRegex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  if (!compiled_) {
    if (literal_.empty()) return matches;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      matches.emplace_back(pos, pos + literal_.size());
    }
    return matches;
  }
  Pcre2Regex::Scanner scanner(*compiled_);
  size_t pos = 0;
  size_t last_match_end = std::string_view::npos;
  while (pos <= text.size()) {
    const std::optional<std::pair<size_t, size_t>> match = scanner.Find(text, pos);
    if (!match) break;
    const auto [start, end] = *match;
    if (start == end && end == last_match_end) {
      // An empty match where the last one ended: step over one character and search again.
      pos += pos < text.size() ? Utf8SequenceLength(static_cast<uint8_t>(text[pos])) : 1;
      continue;
    }
    matches.emplace_back(start, end);
    pos = last_match_end = end;
  }
  return matches;
}

// --- JSON helpers ------------------------------------------------------------------------------

absl::StatusOr<std::string> JsonString(const json& obj, const char* key,
                                       const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return Invalid(absl::StrCat(path, ".", key), "must be a string");
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> JsonBool(const json& obj, const char* key, const std::string& path,
                              bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(absl::StrCat(path, ".", key), "must be true or false");
  return it->get<bool>();
}

absl::StatusOr<std::string> JsonType(const json& obj, const std::string& path) {
  if (!obj.is_object()) return Invalid(path, "must be an object");
  return JsonString(obj, "type", path);
}

namespace {

// A {"String": s} or {"Regex": r} pattern object.
absl::StatusOr<std::unique_ptr<HfRegex>> PatternFromJson(const json& obj, const std::string& path) {
  if (obj.is_object() && obj.contains("String") && obj["String"].is_string()) {
    return HfRegex::Literal(obj["String"].get<std::string>());
  }
  if (obj.is_object() && obj.contains("Regex") && obj["Regex"].is_string()) {
    absl::StatusOr<std::unique_ptr<HfRegex>> regex =
        HfRegex::Compile(obj["Regex"].get<std::string>());
    if (!regex.ok()) {
      return absl::Status(regex.status().code(), absl::StrCat(kError, path, ".Regex ",
                                                              regex.status().message()));
    }
    return regex;
  }
  return Invalid(path, "must be {\"String\": ...} or {\"Regex\": ...}");
}

// Every match replaced by `content`.
std::string ReplaceAll(const HfRegex& pattern, const std::string& content, std::string_view text) {
  std::string out;
  size_t last = 0;
  for (const auto& [start, end] : pattern.FindAll(text)) {
    out.append(text.substr(last, start - last));
    out += content;
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

// A (sub)range of a piece and whether it is a match (or, after a behaviour, to be removed).
struct Span {
  size_t start;
  size_t end;
  bool flag;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> BehaviorFromName(const std::string& name,
                                               const std::string& path) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Invalid(absl::StrCat(path, ".behavior"), absl::StrCat("'", name, "' is not known"));
}

// The text cut at the matches: matches and the gaps between them, in order.
std::vector<Span> MatchSpans(const HfRegex& pattern, std::string_view text, bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0;
  for (const auto& [start, end] : pattern.FindAll(text)) {
    if (prev != start) spans.push_back({prev, start, invert});
    spans.push_back({start, end, !invert});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

// Merges a match into the span before (or, walking backwards, after) it, as `tokenizers`'
// NormalizedString::split does; the result's flag means "remove".
std::vector<Span> MergeMatches(const std::vector<Span>& spans, bool with_next) {
  std::vector<Span> acc;
  bool previous_match = false;
  auto step = [&](const Span& s) {
    if (s.flag && !previous_match && !acc.empty()) {
      (with_next ? acc.back().start : acc.back().end) = with_next ? s.start : s.end;
    } else {
      acc.push_back({s.start, s.end, false});
    }
    previous_match = s.flag;
  };
  if (with_next) {
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) step(*it);
    std::reverse(acc.begin(), acc.end());
  } else {
    for (const Span& s : spans) step(s);
  }
  return acc;
}

std::vector<Span> ApplyBehavior(std::vector<Span> spans, SplitBehavior behavior) {
  switch (behavior) {
    case SplitBehavior::kRemoved:
      return spans;
    case SplitBehavior::kIsolated:
      for (Span& s : spans) s.flag = false;
      return spans;
    case SplitBehavior::kMergedWithPrevious:
      return MergeMatches(spans, /*with_next=*/false);
    case SplitBehavior::kMergedWithNext:
      return MergeMatches(spans, /*with_next=*/true);
    case SplitBehavior::kContiguous: {
      std::vector<Span> acc;
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.flag == previous_match && !acc.empty()) {
          acc.back().end = s.end;
        } else {
          acc.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      return acc;
    }
  }
  return spans;
}

// Splits every piece with `pattern` and `behavior`; empty pieces disappear.
void SplitPieces(const HfRegex& pattern, SplitBehavior behavior, bool invert,
                 std::vector<HfPiece>* pieces) {
  std::vector<HfPiece> out;
  out.reserve(pieces->size());
  for (HfPiece& piece : *pieces) {
    for (const Span& s : ApplyBehavior(MatchSpans(pattern, piece.text, invert), behavior)) {
      if (s.flag || s.end == s.start) continue;
      out.push_back({piece.text.substr(s.start, s.end - s.start), piece.at_start && s.start == 0});
    }
  }
  pieces->swap(out);
}

// --- normalizers ----------------------------------------------------------------------------

class NfcNormalizer final : public HfNormalizer {
 public:
  void Normalize(std::string* text) const override { *text = NormalizeNfc(*text); }
};

class PrependNormalizer final : public HfNormalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Replace serves as a normalizer and as a decoder: every match becomes `content`.
class ReplaceStep final : public HfNormalizer, public HfDecoder {
 public:
  ReplaceStep(std::unique_ptr<HfRegex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    *text = ReplaceAll(*pattern_, content_, *text);
  }
  void Decode(std::string* token) const override { Normalize(token); }

 private:
  std::unique_ptr<HfRegex> pattern_;
  std::string content_;
};

// A null component, and a decoder step that has nothing to do per token.
class NoOp final : public HfNormalizer, public HfPreTokenizer, public HfDecoder {
 public:
  void Normalize(std::string*) const override {}
  void PreTokenize(std::vector<HfPiece>*) const override {}
  void Decode(std::string*) const override {}
};

class SequenceNormalizer final : public HfNormalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<HfNormalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<HfNormalizer>> steps_;
};

// --- pre-tokenizers -------------------------------------------------------------------------

class SplitPreTokenizer final : public HfPreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<HfRegex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<HfPiece>* pieces) const override {
    SplitPieces(*pattern_, behavior_, invert_, pieces);
  }

 private:
  std::unique_ptr<HfRegex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public HfPreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<HfRegex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<HfPiece>* pieces) const override {
    if (add_prefix_space_) {
      for (HfPiece& piece : *pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') {
          piece.text.insert(piece.text.begin(), ' ');
        }
      }
    }
    if (regex_) SplitPieces(*regex_, SplitBehavior::kIsolated, false, pieces);
    for (HfPiece& piece : *pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += ByteToBpeChar(static_cast<uint8_t>(c));
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<HfRegex> regex_;  // null without use_regex
};

class MetaspacePreTokenizer final : public HfPreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        pattern_(HfRegex::Literal(replacement_)) {}
  void PreTokenize(std::vector<HfPiece>* pieces) const override {
    static const auto* space = HfRegex::Literal(" ").release();
    for (HfPiece& piece : *pieces) {
      piece.text = ReplaceAll(*space, replacement_, piece.text);
      const bool starts = piece.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::kAlways ||
                      (prepend_ == Prepend::kFirst && piece.at_start))) {
        piece.text.insert(0, replacement_);
      }
    }
    if (split_) SplitPieces(*pattern_, SplitBehavior::kMergedWithNext, false, pieces);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  std::unique_ptr<HfRegex> pattern_;
};

class SequencePreTokenizer final : public HfPreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<HfPreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<HfPiece>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<HfPreTokenizer>> steps_;
};

// --- decoders -------------------------------------------------------------------------------

class ByteLevelDecoder final : public HfDecoder {
 public:
  // Characters outside the byte map leave the whole token as it is, as in `tokenizers`.
  void Decode(std::string* token) const override {
    std::string out;
    for (uint32_t cpt : DecodeUtf8Lenient(*token)) {
      const int byte = BpeCodepointToByte(cpt);
      if (byte < 0) return;
      out.push_back(static_cast<char>(byte));
    }
    *token = std::move(out);
  }
};

class ByteFallbackDecoder final : public HfDecoder {
 public:
  void Decode(std::string* token) const override {
    const std::string& t = *token;
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return;
    int value = 0;
    for (size_t i = 3; i < 5; ++i) {
      const int digit = HexDigit(t[i]);
      if (digit < 0) return;
      value = value * 16 + digit;
    }
    *token = std::string(1, static_cast<char>(value));
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
};

// Strip of up to `start`/`stop` copies of one character at the ends of each token.
class StripDecoder final : public HfDecoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void Decode(std::string* token) const override {
    size_t begin = 0;
    for (size_t i = 0; i < start_ && token->compare(begin, content_.size(), content_) == 0; ++i) {
      begin += content_.size();
    }
    size_t end = token->size();
    for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                       token->compare(end - content_.size(), content_.size(), content_) == 0;
         ++i) {
      end -= content_.size();
    }
    *token = token->substr(begin, end - begin);
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

class SequenceDecoder final : public HfDecoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<HfDecoder>> steps)
      : steps_(std::move(steps)) {}
  void Decode(std::string* token) const override {
    for (const auto& step : steps_) step->Decode(token);
  }

 private:
  std::vector<std::unique_ptr<HfDecoder>> steps_;
};

std::string Item(const std::string& path, const char* key, size_t i) {
  return absl::StrCat(path, ".", key, "[", i, "]");
}

// The array `key` of a Sequence object.
absl::StatusOr<const json*> SequenceItems(const json& obj, const char* key,
                                          const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) {
    return Invalid(absl::StrCat(path, ".", key), "must be an array");
  }
  return &*it;
}

// A Sequence's components, each read by `parse(item, its path)`.
template <typename T, typename Parse>
absl::StatusOr<std::vector<std::unique_ptr<T>>> SequenceSteps(const json& obj, const char* key,
                                                              const std::string& path,
                                                              Parse parse) {
  WINNOW_ASSIGN_OR_RETURN(const json* items, SequenceItems(obj, key, path));
  std::vector<std::unique_ptr<T>> steps;
  for (size_t i = 0; i < items->size(); ++i) {
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<T> step, parse((*items)[i], Item(path, key, i)));
    steps.push_back(std::move(step));
  }
  return steps;
}

// A Replace normalizer or decoder: the same step.
absl::StatusOr<std::unique_ptr<ReplaceStep>> ReplaceFromJson(const json& obj,
                                                             const std::string& path) {
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<HfRegex> pattern,
                          PatternFromJson(obj.value("pattern", json()),
                                          absl::StrCat(path, ".pattern")));
  WINNOW_ASSIGN_OR_RETURN(std::string content, JsonString(obj, "content", path));
  return std::make_unique<ReplaceStep>(std::move(pattern), std::move(content));
}

absl::StatusOr<std::unique_ptr<HfPreTokenizer>> MetaspaceFromJson(const json& obj,
                                                                  const std::string& path) {
  WINNOW_ASSIGN_OR_RETURN(const std::string replacement,
                          JsonString(obj, "replacement", path));
  if (replacement.empty()) return Invalid(absl::StrCat(path, ".replacement"), "is empty");
  using Prepend = MetaspacePreTokenizer::Prepend;
  Prepend prepend = Prepend::kAlways;
  if (obj.contains("prepend_scheme")) {
    WINNOW_ASSIGN_OR_RETURN(const std::string scheme, JsonString(obj, "prepend_scheme", path));
    if (scheme == "first") {
      prepend = Prepend::kFirst;
    } else if (scheme == "never") {
      prepend = Prepend::kNever;
    } else if (scheme != "always") {
      return Invalid(absl::StrCat(path, ".prepend_scheme"), absl::StrCat("'", scheme, "'"));
    }
  } else {
    // Files written before prepend_scheme existed say add_prefix_space instead.
    WINNOW_ASSIGN_OR_RETURN(const bool add, JsonBool(obj, "add_prefix_space", path, true));
    prepend = add ? Prepend::kAlways : Prepend::kNever;
  }
  WINNOW_ASSIGN_OR_RETURN(const bool split, JsonBool(obj, "split", path, true));
  return std::make_unique<MetaspacePreTokenizer>(replacement, prepend, split);
}

absl::StatusOr<std::unique_ptr<HfPreTokenizer>> SplitFromJson(const json& obj,
                                                              const std::string& path) {
  if (!obj.contains("pattern")) return Invalid(absl::StrCat(path, ".pattern"), "is missing");
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<HfRegex> pattern,
                          PatternFromJson(obj["pattern"], absl::StrCat(path, ".pattern")));
  WINNOW_ASSIGN_OR_RETURN(const std::string behavior_name, JsonString(obj, "behavior", path));
  WINNOW_ASSIGN_OR_RETURN(const SplitBehavior behavior, BehaviorFromName(behavior_name, path));
  WINNOW_ASSIGN_OR_RETURN(const bool invert, JsonBool(obj, "invert", path, false));
  return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfNormalizer>> HfNormalizer::FromJson(const json& obj,
                                                                    const std::string& path) {
  if (obj.is_null()) return std::make_unique<NoOp>();
  WINNOW_ASSIGN_OR_RETURN(const std::string type, JsonType(obj, path));
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") {
    WINNOW_ASSIGN_OR_RETURN(std::string prefix, JsonString(obj, "prepend", path));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") return ReplaceFromJson(obj, path);
  if (type == "Sequence") {
    WINNOW_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<HfNormalizer>> steps,
                            SequenceSteps<HfNormalizer>(obj, "normalizers", path, FromJson));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  return Unsupported(path, type);
}

absl::StatusOr<std::unique_ptr<HfPreTokenizer>> HfPreTokenizer::FromJson(const json& obj,
                                                                        const std::string& path) {
  if (obj.is_null()) return std::make_unique<NoOp>();
  WINNOW_ASSIGN_OR_RETURN(const std::string type, JsonType(obj, path));
  if (type == "ByteLevel") {
    WINNOW_ASSIGN_OR_RETURN(const bool add_prefix_space,
                            JsonBool(obj, "add_prefix_space", path, true));
    WINNOW_ASSIGN_OR_RETURN(const bool use_regex, JsonBool(obj, "use_regex", path, true));
    std::unique_ptr<HfRegex> regex;
    if (use_regex) {
      WINNOW_ASSIGN_OR_RETURN(regex, HfRegex::Compile(kByteLevelPattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Split") return SplitFromJson(obj, path);
  if (type == "Digits") {
    WINNOW_ASSIGN_OR_RETURN(const bool individual,
                            JsonBool(obj, "individual_digits", path, false));
    // Rust's char::is_numeric is the N category; a contiguous run is one piece unless
    // individual_digits.
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<HfRegex> digits,
                            HfRegex::Compile(individual ? "\\p{N}" : "\\p{N}+"));
    return std::make_unique<SplitPreTokenizer>(std::move(digits), SplitBehavior::kIsolated,
                                               false);
  }
  if (type == "Metaspace") return MetaspaceFromJson(obj, path);
  if (type == "Sequence") {
    WINNOW_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<HfPreTokenizer>> steps,
                            SequenceSteps<HfPreTokenizer>(obj, "pretokenizers", path, FromJson));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return Unsupported(path, type);
}

namespace {

// One decoder; `fused` says a Fuse came earlier in the enclosing Sequence, after which Strip
// works on the whole text rather than on each token, so it is left out here.
absl::StatusOr<std::unique_ptr<HfDecoder>> DecoderFromJson(const json& obj, const std::string& path,
                                                           bool* fused) {
  if (obj.is_null()) return std::make_unique<NoOp>();
  WINNOW_ASSIGN_OR_RETURN(const std::string type, JsonType(obj, path));
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") {
    *fused = true;
    return std::make_unique<NoOp>();
  }
  if (type == "Metaspace") {
    WINNOW_ASSIGN_OR_RETURN(std::string replacement, JsonString(obj, "replacement", path));
    return std::make_unique<ReplaceStep>(HfRegex::Literal(replacement), " ");
  }
  if (type == "Replace") return ReplaceFromJson(obj, path);
  if (type == "Strip") {
    WINNOW_ASSIGN_OR_RETURN(std::string content, JsonString(obj, "content", path));
    const size_t start = obj.value("start", 0u);
    const size_t stop = obj.value("stop", 0u);
    if (*fused) return std::make_unique<NoOp>();
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  if (type == "Sequence") {
    WINNOW_ASSIGN_OR_RETURN(
        std::vector<std::unique_ptr<HfDecoder>> steps,
        SequenceSteps<HfDecoder>(obj, "decoders", path,
                                 [fused](const json& item, const std::string& item_path) {
                                   return DecoderFromJson(item, item_path, fused);
                                 }));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  return Unsupported(path, type);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfDecoder>> HfDecoder::FromJson(const json& obj,
                                                               const std::string& path) {
  bool fused = false;
  return DecoderFromJson(obj, path, &fused);
}

}  // namespace winnow::model
