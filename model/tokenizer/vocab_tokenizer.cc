#include "model/tokenizer/vocab_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace winnow::model {
namespace {

// DeepSeek's full-width bars and SentencePiece's U+2581, spelled out so hex escapes cannot run
// into the following letters.
#define WINNOW_FWBAR "\xEF\xBD\x9C"
#define WINNOW_SPM_SPACE "\xE2\x96\x81"

// Texts llama.cpp recognises when the metadata does not name the token (llama_vocab::load).
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]",
    "<" WINNOW_FWBAR "end" WINNOW_SPM_SPACE "of" WINNOW_SPM_SPACE "sentence" WINNOW_FWBAR ">",
    "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
    "<" WINNOW_FWBAR "fim" WINNOW_SPM_SPACE "begin" WINNOW_FWBAR ">",
    "<PRE>", WINNOW_SPM_SPACE "<PRE>", "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view kFimSufTexts[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<" WINNOW_FWBAR "fim" WINNOW_SPM_SPACE "hole" WINNOW_FWBAR ">",
    "<SUF>", WINNOW_SPM_SPACE "<SUF>", "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view kFimMidTexts[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<" WINNOW_FWBAR "fim" WINNOW_SPM_SPACE "end" WINNOW_FWBAR ">",
    "<MID>", WINNOW_SPM_SPACE "<MID>", "<|code_middle|>", "<|middle|>"};
constexpr std::string_view kFimPadTexts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" WINNOW_FWBAR "end" WINNOW_SPM_SPACE "of" WINNOW_SPM_SPACE "sentence" WINNOW_FWBAR ">",
    "[e~["};
// gpt-oss channel markers: llama.cpp always renders them.
constexpr std::string_view kAlwaysRenderedTexts[] = {
    "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};

#undef WINNOW_FWBAR
#undef WINNOW_SPM_SPACE

template <size_t N>
bool OneOf(std::string_view text, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), text) != std::end(list);
}

uint32_t AttrFromType(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

constexpr uint32_t kAttrSpecial = kAttrControl | kAttrUserDefined | kAttrUnknown;

}  // namespace

int VocabTokenizer::ByteTokenValue(std::string_view text) {
  // llama.cpp parses the two characters after "<0x" with strtol: leading hex digits only.
  int value = 0;
  for (size_t i = 3; i < text.size() && i < 5; ++i) {
    const char c = text[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      break;
    }
    value = value * 16 + digit;
  }
  return value;
}

int32_t VocabTokenizer::TextToId(std::string_view text) const {
  // absl::string_view is not std::string_view in this Abseil build.
  auto it = text_to_id_.find(absl::string_view(text.data(), text.size()));
  return it == text_to_id_.end() ? -1 : it->second;
}

int32_t VocabTokenizer::FindSpecialToken(std::string_view text) const {
  const int32_t id = TextToId(text);
  if (id < 0 || (attrs_[id] & (kAttrControl | kAttrUserDefined)) == 0) return -1;
  return id;
}

namespace {

absl::StatusOr<std::vector<std::string>> ReadTokenTexts(const GgufFile& file) {
  absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: cannot read tokenizer.ggml.tokens: ", tokens.status().message()));
  }
  const size_t n = tokens->size();
  if (n == 0 || n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: tokenizer.ggml.tokens has ", n, " entries"));
  }
  return tokens;
}

// Scores of the first `n` tokens; all 0 when the file has none (BPE vocabularies).
absl::StatusOr<std::vector<float>> ReadScores(const GgufFile& file, size_t n) {
  if (file.Find("tokenizer.ggml.scores") == nullptr) return std::vector<float>(n, 0.0f);
  WINNOW_ASSIGN_OR_RETURN(const std::vector<double> scores,
                          file.GetFloatArray("tokenizer.ggml.scores"));
  if (scores.size() < n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: tokenizer.ggml.scores has ",
                                                   scores.size(), " entries for ", n, " tokens"));
  }
  return std::vector<float>(scores.begin(), scores.begin() + n);
}

// llama.cpp token types of the first `n` tokens; all 1 (normal) when the file has none.
absl::StatusOr<std::vector<int64_t>> ReadTokenTypes(const GgufFile& file, size_t n) {
  if (file.Find("tokenizer.ggml.token_type") == nullptr) return std::vector<int64_t>(n, 1);
  WINNOW_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                          file.GetIntArray("tokenizer.ggml.token_type"));
  if (types.size() < n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: tokenizer.ggml.token_type has ",
                                                   types.size(), " entries for ", n, " tokens"));
  }
  return std::vector<int64_t>(types.begin(), types.begin() + n);
}

// Overrides `*id` with metadata `key` when that names one of the `n` tokens. Out-of-range values
// are ignored, and a default past the vocabulary becomes -1, as llama.cpp does.
void ReadSpecialId(const GgufFile& file, std::string_view key, size_t n, int32_t* id) {
  if (*id >= static_cast<int32_t>(n)) *id = -1;
  absl::StatusOr<int64_t> v = file.GetInt(key);
  if (!v.ok()) return;
  if (*v < 0 || *v >= static_cast<int64_t>(n)) {
    spdlog::warn("tokenizer: bad special token {} = {}, keeping {}", key, *v, *id);
    return;
  }
  *id = static_cast<int32_t>(*v);
}

}  // namespace

absl::Status VocabTokenizer::LoadVocab(const GgufFile& file, const Defaults& defaults) {
  WINNOW_ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokenTexts(file));
  const size_t n = tokens.size();
  WINNOW_ASSIGN_OR_RETURN(scores_, ReadScores(file, n));
  WINNOW_ASSIGN_OR_RETURN(const std::vector<int64_t> types, ReadTokenTypes(file, n));
  IndexTokens(std::move(tokens), types);

  FimIds fim = ReadSpecialIds(file, defaults);
  ReadAddBosEos(file, defaults);
  DetectSpecialTokensByText(&fim);
  eog_ids_ = EndOfGenerationIds();
  MarkAlwaysRenderedTokens();

  BuildCaches(file);
  return absl::OkStatus();
}

void VocabTokenizer::IndexTokens(std::vector<std::string> tokens,
                                 const std::vector<int64_t>& types) {
  const size_t n = tokens.size();
  tokens_ = std::move(tokens);
  token_types_.resize(n);
  attrs_.resize(n);
  text_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens_[i].empty()) {
      spdlog::warn("tokenizer: empty token at index {}", i);
      tokens_[i] = absl::StrCat("[EMPTY_", i, "]");
    }
    text_to_id_.insert_or_assign(tokens_[i], static_cast<int32_t>(i));
    token_types_[i] = static_cast<int32_t>(types[i]);
    attrs_[i] = AttrFromType(types[i]);
  }
}

// Special ids: the model family's defaults, then metadata. The FIM prefix/suffix/middle ids are
// only needed while loading (to mark their tokens control), so they are returned, not kept.
VocabTokenizer::FimIds VocabTokenizer::ReadSpecialIds(const GgufFile& file,
                                                      const Defaults& defaults) {
  const size_t n = tokens_.size();
  bos_id_ = defaults.bos;
  eos_id_ = defaults.eos;
  unk_id_ = defaults.unk;
  FimIds fim;
  ReadSpecialId(file, "tokenizer.ggml.bos_token_id", n, &bos_id_);
  ReadSpecialId(file, "tokenizer.ggml.eos_token_id", n, &eos_id_);
  ReadSpecialId(file, "tokenizer.ggml.eot_token_id", n, &eot_id_);
  ReadSpecialId(file, "tokenizer.ggml.eom_token_id", n, &eom_id_);
  ReadSpecialId(file, "tokenizer.ggml.unknown_token_id", n, &unk_id_);
  ReadSpecialId(file, "tokenizer.ggml.fim_pre_token_id", n, &fim.pre);
  ReadSpecialId(file, "tokenizer.ggml.fim_suf_token_id", n, &fim.suf);
  ReadSpecialId(file, "tokenizer.ggml.fim_mid_token_id", n, &fim.mid);
  ReadSpecialId(file, "tokenizer.ggml.fim_pad_token_id", n, &fim_pad_id_);
  ReadSpecialId(file, "tokenizer.ggml.fim_rep_token_id", n, &fim_rep_id_);
  ReadSpecialId(file, "tokenizer.ggml.fim_sep_token_id", n, &fim_sep_id_);
  ReadSpecialId(file, "tokenizer.ggml.prefix_token_id", n, &fim.pre);
  ReadSpecialId(file, "tokenizer.ggml.suffix_token_id", n, &fim.suf);
  ReadSpecialId(file, "tokenizer.ggml.middle_token_id", n, &fim.mid);
  return fim;
}

void VocabTokenizer::ReadAddBosEos(const GgufFile& file, const Defaults& defaults) {
  add_bos_ = defaults.add_bos;
  add_eos_ = defaults.add_eos;
  if (absl::StatusOr<bool> b = file.GetBool("tokenizer.ggml.add_bos_token"); b.ok()) add_bos_ = *b;
  if (absl::StatusOr<bool> b = file.GetBool("tokenizer.ggml.add_eos_token"); b.ok()) add_eos_ = *b;
  if (add_bos_ && bos_id_ < 0) {
    spdlog::warn("tokenizer: model asks for BOS but has no BOS token; not adding one");
    add_bos_ = false;
  }
  if (add_eos_ && eos_id_ < 0) add_eos_ = false;
}

// Only the id a text maps to is considered when texts repeat.
bool VocabTokenizer::IsCanonical(int32_t id) const { return TextToId(tokens_[id]) == id; }

void VocabTokenizer::ForceControl(int32_t id) {
  if ((attrs_[id] & kAttrControl) == 0) {
    spdlog::warn("tokenizer: control-looking token {} '{}' was not control-type; treating it as "
                 "control",
                 id, tokens_[id]);
    attrs_[id] |= kAttrControl;
  }
}

// Tokens recognised by text, for the ids the metadata left unset. llama.cpp walks a hash map
// here; walking ids in order makes the choice deterministic when several candidates exist.
void VocabTokenizer::DetectSpecialTokensByText(FimIds* fim) {
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!IsCanonical(id)) continue;
    const std::string& text = tokens_[id];
    auto detect = [&](int32_t* slot, bool matches) {
      if (*slot == -1 && matches) {
        *slot = id;
        ForceControl(id);
      }
    };
    detect(&eot_id_, OneOf(text, kEotTexts));
    detect(&eom_id_, OneOf(text, kEomTexts));
    detect(&fim->pre, OneOf(text, kFimPreTexts));
    detect(&fim->suf, OneOf(text, kFimSufTexts));
    detect(&fim->mid, OneOf(text, kFimMidTexts));
    detect(&fim_pad_id_, OneOf(text, kFimPadTexts));
    detect(&fim_rep_id_, OneOf(text, kFimRepTexts));
    detect(&fim_sep_id_, OneOf(text, kFimSepTexts));
  }
}

// The sorted end-of-generation ids: the FIM pad/repo/separator tokens, every token with an
// end-of-generation text (made control), and the EOS/EOT/EOM tokens.
std::vector<int32_t> VocabTokenizer::EndOfGenerationIds() {
  std::vector<int32_t> eog;
  auto add_eog = [&](int32_t id) {
    if (id >= 0 && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
  };
  add_eog(fim_pad_id_);
  add_eog(fim_rep_id_);
  add_eog(fim_sep_id_);
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsCanonical(id) && OneOf(tokens_[id], kEogTexts)) {
      add_eog(id);
      ForceControl(id);
    }
  }
  add_eog(eos_id_);
  add_eog(eot_id_);
  add_eog(eom_id_);
  DropMessageEnds(&eog);
  std::sort(eog.begin(), eog.end());
  return eog;
}

// Harmony-style vocabularies end a message with <|end|> but a turn with <|return|>/<|call|>;
// likewise </s> is an ordinary token where <|tool_response> or <|plamo:eos|> ends the turn.
void VocabTokenizer::DropMessageEnds(std::vector<int32_t>* eog) {
  auto eog_text = [&](std::string_view t) {
    for (int32_t id : *eog) {
      if (tokens_[id] == t) return id;
    }
    return -1;
  };
  const bool has_call = eog_text("<|call|>") >= 0 || eog_text("<|calls|>") >= 0;
  const int32_t end_id = eog_text("<|end|>");
  if (end_id >= 0 && has_call && (eog_text("<|return|>") >= 0 || eog_text("<|flush|>") >= 0)) {
    eog->erase(std::find(eog->begin(), eog->end(), end_id));
    attrs_[end_id] = kAttrUserDefined;
  }
  const int32_t s_id = eog_text("</s>");
  if (s_id >= 0 && (eog_text("<|tool_response>") >= 0 || eog_text("<|plamo:eos|>") >= 0)) {
    eog->erase(std::find(eog->begin(), eog->end(), s_id));
    attrs_[s_id] = kAttrNormal;
  }
}

// gpt-oss channel markers, which llama.cpp always renders. No end-of-generation, EOT/EOM or FIM
// text is among them, so no other step touches these tokens and the order does not matter.
void VocabTokenizer::MarkAlwaysRenderedTokens() {
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsCanonical(id) && OneOf(tokens_[id], kAlwaysRenderedTexts)) {
      attrs_[id] = kAttrUserDefined;
    }
  }
}

void VocabTokenizer::BuildCaches(const GgufFile& file) {
  const int32_t n = vocab_size();
  special_order_.clear();
  for (int32_t id = 0; id < n; ++id) {
    if (attrs_[id] & kAttrSpecial) special_order_.push_back(id);
  }
  // llama.cpp uses an unstable sort here; ties between equal-length texts only matter when two
  // such texts overlap in the input, and then the lower id wins in winnow.
  std::stable_sort(special_order_.begin(), special_order_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].size() > tokens_[b].size();
  });
  special_rank_.assign(n, -1);
  special_trie_ = ByteTrie();
  for (size_t rank = 0; rank < special_order_.size(); ++rank) {
    const int32_t id = special_order_[rank];
    special_rank_[id] = static_cast<int32_t>(rank);
    special_trie_.Add(tokens_[id], id);
  }

  pieces_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const uint32_t a = attrs_[id];
    if (a & kAttrSpecial) {
      pieces_[id] = tokens_[id];
    } else if (a & kAttrNormal) {
      pieces_[id] = NormalPiece(tokens_[id]);
    } else if (a & kAttrByte) {
      pieces_[id] = std::string(1, static_cast<char>(ByteTokenValue(tokens_[id])));
    }
  }

  // llama.cpp's per-model attribute fix-up that affects tokenisation: Phi-3 strips whitespace
  // after its special tokens.
  if (absl::StatusOr<std::string> name = file.GetString("general.name"); name.ok()) {
    const std::string lower = absl::AsciiStrToLower(*name);
    if (lower.find("phi-3") != std::string::npos || lower.find("phi3") != std::string::npos) {
      for (int32_t id : special_order_) attrs_[id] |= kAttrRstrip;
      if (int32_t id = TextToId("</s>"); id >= 0) attrs_[id] |= kAttrRstrip;
      for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) {
        if (int32_t id = TextToId(t); id >= 0) attrs_[id] &= ~kAttrRstrip;
      }
    }
  }
}

std::vector<int32_t> VocabTokenizer::SpecialsPresent(std::string_view text,
                                                     bool parse_special) const {
  std::vector<int32_t> ranks;
  if (special_order_.empty()) return ranks;
  std::vector<bool> seen(special_order_.size(), false);
  for (size_t i = 0; i < text.size(); ++i) {
    special_trie_.ForEachAt(text, i, [&](int32_t id, size_t /*length*/) {
      if (!parse_special && (attrs_[id] & (kAttrControl | kAttrUnknown))) return;
      const int32_t rank = special_rank_[id];
      if (!seen[rank]) {
        seen[rank] = true;
        ranks.push_back(rank);
      }
    });
  }
  std::sort(ranks.begin(), ranks.end());
  std::vector<int32_t> ids;
  ids.reserve(ranks.size());
  for (int32_t rank : ranks) ids.push_back(special_order_[rank]);
  return ids;
}

std::vector<VocabTokenizer::Fragment> VocabTokenizer::Partition(std::string_view text,
                                                                bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t id : SpecialsPresent(text, parse_special)) {
    const std::string& special = tokens_[id];
    const uint32_t a = attrs_[id];
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t offset = f.offset;
      size_t length = f.length;
      while (true) {
        const size_t match = text.substr(offset, length).find(special);
        if (match == std::string_view::npos) {
          if (length > 0) next.push_back({-1, offset, length});
          break;
        }
        size_t left = match;
        if (a & kAttrLstrip) {
          while (left > 0 && absl::ascii_isspace(text[offset + left - 1])) --left;
        }
        if (left > 0) next.push_back({-1, offset, left});
        next.push_back({id, 0, 0});
        size_t right_offset = offset + match + special.size();
        size_t right_length = length - match - special.size();
        if (right_length == 0) break;
        if (a & kAttrRstrip) {
          while (right_length > 0 && absl::ascii_isspace(text[right_offset])) {
            ++right_offset;
            --right_length;
          }
        }
        offset = right_offset;
        length = right_length;
      }
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> VocabTokenizer::Encode(std::string_view text, bool add_special,
                                            bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_id_);
  bool after_special = true;
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      EncodeFragment(text.substr(f.offset, f.length), after_special, &out);
      after_special = false;
    }
  }
  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

std::string VocabTokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (!render_special && (attrs_[id] & (kAttrUnknown | kAttrControl))) return {};
  return pieces_[id];
}

}  // namespace winnow::model
