#include "model/tokenizer/pre_tokenizer.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/tokenizer/pcre2_regex.h"
#include "model/tokenizer/unicode.h"
#include "spdlog/spdlog.h"

namespace winnow::model {
namespace {

// What `\s` means to llama.cpp: ASCII whitespace plus every non-ASCII code point in its
// whitespace table (those are rewritten to \v before std::regex runs). PCRE2's own \s in UCP mode
// leaves out U+0085, so the patterns below spell the class out.
#define WINNOW_WS \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
  "\\x{205F}\\x{3000}"
#define WINNOW_S "[" WINNOW_WS "]"
#define WINNOW_NOT_S "[^" WINNOW_WS "]"
#define WINNOW_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WINNOW_WS "\\p{L}\\p{N}]+|" WINNOW_S
    "+(?!" WINNOW_NOT_S ")";

// Llama-3 and Qwen2 differ only in how many digits one piece may hold.
#define WINNOW_LLAMA3_LIKE(DIGITS)                                                          \
  WINNOW_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" DIGITS " ?[^" WINNOW_WS       \
                      "\\p{L}\\p{N}]+[\\r\\n]*|" WINNOW_S "*[\\r\\n]+|" WINNOW_S "+(?!" \
                      WINNOW_NOT_S ")|" WINNOW_S "+"
constexpr const char* kLlama3 = WINNOW_LLAMA3_LIKE("{1,3}|");
constexpr const char* kQwen2 = WINNOW_LLAMA3_LIKE("|");

// CJK class of the DeepSeek pre-tokenizers (U+4E00-U+9FA5, U+0800-U+4E00, U+AC00-U+D7FF) with the
// whitespace code points cut out: llama.cpp's std::wregex path rewrites those to \v first, so they
// never match a literal range.
#define WINNOW_DEEPSEEK_CJK                                                                    \
  "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}"               \
  "\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-" \
  "\\x{D7FF}]+"

constexpr const char* kDeepseekLlmLetters =
    WINNOW_S
    "?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-"
    "\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}"
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}"
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}"
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-"
    "\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"
    "\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"
    "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-"
    "\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}"
    "\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-"
    "\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
// U+3000 is left out of the last range for the same reason as in WINNOW_DEEPSEEK_CJK.
constexpr const char* kDeepseekLlmPunct =
    WINNOW_S
    "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+";

struct PreSpec {
  std::string kind;
  std::vector<std::string> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

PreSpec SpecFor(std::string_view kind) {
  if (kind == "default") {
    return {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}};
  }
  if (kind == "gpt2") return {"gpt2", {kGpt2}};
  if (kind == "starcoder") return {"starcoder", {"\\p{N}", kGpt2}};
  if (kind == "falcon") {
    return {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}};
  }
  if (kind == "llama3") return {"llama3", {kLlama3}, /*ignore_merges=*/true, /*add_bos=*/true};
  if (kind == "llama3-regex") return {"llama3-regex", {kLlama3}};
  if (kind == "qwen2") return {"qwen2", {kQwen2}};
  if (kind == "deepseek-llm") {
    return {"deepseek-llm",
            {"[\\r\\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, WINNOW_S "+$",
             WINNOW_DEEPSEEK_CJK, "\\p{N}+"}};
  }
  if (kind == "deepseek-coder") {
    return {"deepseek-coder",
            {"[\\r\\n]", WINNOW_S "?\\p{L}+", WINNOW_S "?\\p{P}+", WINNOW_DEEPSEEK_CJK, "\\p{N}"}};
  }
  if (kind == "deepseek-v3") {
    return {"deepseek-v3",
            {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
             "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
             "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|" WINNOW_S "*[\\r\\n]+|" WINNOW_S
             "+(?!" WINNOW_NOT_S ")|" WINNOW_S "+"}};
  }
  return {};
}

// tokenizer.ggml.pre values llama.cpp knows, mapped to the regex lists above.
std::string_view KindForPre(std::string_view pre) {
  static constexpr std::pair<std::string_view, std::string_view> kTable[] = {
      {"default", "default"},
      {"llama3", "llama3"},
      {"llama-v3", "llama3"},
      {"llama-bpe", "llama3"},
      {"falcon3", "llama3"},
      {"falcon-h1", "llama3"},
      {"pixtral", "llama3"},
      {"midm-2.0", "llama3"},
      {"lfm2", "llama3"},
      {"jina-v5-nano", "llama3"},
      {"dbrx", "llama3-regex"},
      {"smaug-bpe", "llama3-regex"},
      {"deepseek-llm", "deepseek-llm"},
      {"deepseek-coder", "deepseek-coder"},
      {"deepseek-v3", "deepseek-v3"},
      {"falcon", "falcon"},
      {"gpt2", "gpt2"},
      {"gpt-2", "gpt2"},
      {"mpt", "gpt2"},
      {"olmo", "gpt2"},
      {"jais", "gpt2"},
      {"trillion", "gpt2"},
      {"granite-docling", "gpt2"},
      {"phi-2", "gpt2"},
      {"jina-es", "gpt2"},
      {"jina-de", "gpt2"},
      {"gigachat", "gpt2"},
      {"jina-v2-es", "gpt2"},
      {"jina-v2-de", "gpt2"},
      {"jina-v1-en", "gpt2"},
      {"jina-v2-code", "gpt2"},
      {"roberta-bpe", "gpt2"},
      {"a.x-4.0", "gpt2"},
      {"mellum", "gpt2"},
      {"modern-bert", "gpt2"},
      {"exaone4", "gpt2"},
      {"starcoder", "starcoder"},
      {"refact", "starcoder"},
      {"command-r", "starcoder"},
      {"smollm", "starcoder"},
      {"codeshell", "starcoder"},
      {"exaone", "starcoder"},
      {"minerva-7b", "starcoder"},
      {"mellum2", "starcoder"},
      {"qwen2", "qwen2"},
      {"deepseek-r1-qwen", "qwen2"},
      {"kormo", "qwen2"},
      {"f2llmv2", "qwen2"},
      {"stablelm2", "qwen2"},
      {"megrez", "qwen2"},
      {"hunyuan", "qwen2"},
  };
  for (const auto& [name, kind] : kTable) {
    if (name == pre) return kind;
  }
  return {};
}

#undef WINNOW_WS
#undef WINNOW_S
#undef WINNOW_NOT_S
#undef WINNOW_CONTRACTIONS
#undef WINNOW_LLAMA3_LIKE
#undef WINNOW_DEEPSEEK_CJK

}  // namespace

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::ForName(std::string_view pre) {
  std::string_view kind;
  if (pre.empty()) {
    spdlog::warn("tokenizer: missing tokenizer.ggml.pre, using the 'default' pre-tokenizer");
    kind = "default";
  } else {
    kind = KindForPre(pre);
    if (kind.empty()) {
      spdlog::warn("tokenizer: unknown pre-tokenizer '{}', falling back to the GPT-2 regex; "
                   "tokenisation may differ from the model's own",
                   pre);
      kind = "gpt2";
    }
  }
  PreSpec spec = SpecFor(kind);
  std::unique_ptr<PreTokenizer> out(new PreTokenizer());
  out->kind_ = spec.kind;
  out->ignore_merges_ = spec.ignore_merges;
  out->default_add_bos_ = spec.add_bos;
  out->patterns_ = std::move(spec.patterns);
  for (const std::string& pattern : out->patterns_) {
    absl::StatusOr<std::unique_ptr<Pcre2Regex>> regex = Pcre2Regex::Compile(pattern);
    if (!regex.ok()) {
      return absl::InternalError(
          absl::StrCat("pre-tokenizer regex ", regex.status().message()));
    }
    out->compiled_.push_back(*std::move(regex));
  }
  return out;
}

std::vector<size_t> PreTokenizer::Split(std::string_view text) const {
  std::vector<size_t> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text.size());
  std::vector<size_t> next;
  for (const auto& regex : compiled_) {
    Pcre2Regex::Scanner scanner(*regex);
    next.clear();
    next.reserve(pieces.size() * 2);
    size_t base = 0;
    for (const size_t len : pieces) {
      const std::string_view subject = text.substr(base, len);
      size_t pos = 0;
      size_t last_end = 0;
      while (pos < len) {
        const std::optional<std::pair<size_t, size_t>> match = scanner.Find(subject, pos);
        if (!match) break;
        const auto [start, end] = *match;
        if (end <= start) {  // empty match: step over one character
          if (start >= len) break;
          pos = start + Utf8SequenceLength(static_cast<uint8_t>(subject[start]));
          continue;
        }
        if (start > last_end) next.push_back(start - last_end);
        next.push_back(end - start);
        last_end = pos = end;
      }
      if (last_end < len) next.push_back(len - last_end);
      base += len;
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace winnow::model
