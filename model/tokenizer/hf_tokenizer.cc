#include "model/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "model/tokenizer/unicode.h"

namespace winnow::model {
namespace {

using nlohmann::json;

constexpr char kError[] = "tokenizer.json: ";

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(kError, path, " ", what));
}

// Special added tokens that end a generation (a subset of llama.cpp's list: the texts the
// supported families use), and the candidates for EOS/BOS when the post-processor names none.
constexpr std::string_view kEndTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
    "<|eom_id|>", "<|end_of_text|>", "<eos>", "<end_of_utterance>"};
constexpr std::string_view kEosTexts[] = {"</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>"};
constexpr std::string_view kBosTexts[] = {"<s>", "<bos>", "<|begin_of_text|>"};

// The code point that ends just before `pos` (valid UTF-8), and where it starts.
std::pair<uint32_t, size_t> PrevCodepoint(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return {DecodeUtf8Lenient(text.substr(start, pos - start)).front(), start};
}

// Rust's regex \w (Alphabetic, marks, decimal digits, connector punctuation, joiners), which
// single_word tokens test their neighbours with. PCRE2's own \w leaves out marks and joiners.
bool IsWordCodepoint(uint32_t cpt) {
  static const HfRegex* word =
      HfRegex::Compile("[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]").value().release();
  std::string utf8;
  AppendUtf8(cpt, &utf8);
  return !word->FindAll(utf8).empty();
}

// Parses the two hex digits of a "<0xNN>" token, or -1.
int ByteTokenValue(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Lowest rank first; on equal ranks the leftmost position (tokenizers' Merge ordering).
struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};
struct MergeAfter {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.pos > b.pos);
  }
};

}  // namespace

// --- added-token matching ------------------------------------------------------------------

std::vector<HfTokenizer::Segment> HfTokenizer::SplitAdded(std::string_view text,
                                                          const ByteTrie& matcher,
                                                          bool parse_special) const {
  std::vector<Segment> segments;
  size_t start_offset = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t index = -1;
    size_t length = 0;
    matcher.ForEachAt(text, pos, [&](int32_t value, size_t n) {  // shortest first: keep the last
      index = value;
      length = n;
    });
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added_[index];
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // a skipped match still consumes its text, as in aho-corasick's iteration
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordCodepoint(PrevCodepoint(text, start).first);
      const bool word_after =
          stop < text.size() && IsWordCodepoint(DecodeUtf8Lenient(text.substr(stop, 4))[0]);
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        const auto [cpt, prev] = PrevCodepoint(text, s);
        if (!IsUnicodeWhitespace(cpt)) break;
        s = prev;
      }
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        const uint32_t cpt = DecodeUtf8Lenient(text.substr(stop, 4))[0];
        if (!IsUnicodeWhitespace(cpt)) break;
        stop += Utf8SequenceLength(static_cast<uint8_t>(text[stop]));
      }
      pos = std::max(pos, stop);
    }
    if (start_offset < start) segments.push_back({-1, start_offset, start});
    segments.push_back({token.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) segments.push_back({-1, start_offset, text.size()});
  return segments;
}

// --- encoding -------------------------------------------------------------------------------

std::vector<int32_t> HfTokenizer::Encode(std::string_view text, bool add_special,
                                         bool parse_special) const {
  std::string replaced;
  if (!IsValidUtf8(text)) {
    replaced = ReplaceInvalidUtf8(text);
    text = replaced;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  for (const Segment& s : SplitAdded(text, raw_matcher_, parse_special)) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      EncodeSegment(text.substr(s.start, s.end - s.start), s.start == 0, parse_special, &out);
    }
  }
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void HfTokenizer::EncodeSegment(std::string_view text, bool at_start, bool parse_special,
                                std::vector<int32_t>* out) const {
  std::string normalized(text);
  normalizer_->Normalize(&normalized);
  std::vector<HfPiece> pieces;
  for (const Segment& s : SplitAdded(normalized, normalized_matcher_, parse_special)) {
    if (s.id >= 0) {
      out->push_back(s.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({normalized.substr(s.start, s.end - s.start), at_start && s.start == 0});
    pre_tokenizer_->PreTokenize(&pieces);
    for (const HfPiece& piece : pieces) EncodeWord(piece.text, out);
  }
}

int32_t HfTokenizer::VocabId(std::string_view text) const {
  // absl::string_view is not std::string_view in this Abseil build.
  auto it = vocab_.find(absl::string_view(text.data(), text.size()));
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<HfTokenizer::Symbol> HfTokenizer::InitialSymbols(std::string_view word) const {
  std::vector<Symbol> symbols;
  auto add = [&](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, false});
  };
  int32_t pending_unk = -1;  // tokenizers holds an unknown back to fuse it with the next one
  std::string s;
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(Utf8SequenceLength(static_cast<uint8_t>(word[i])), word.size() - i);
    s.clear();
    if (i > 0) s += continuing_subword_prefix_;
    s.append(word.substr(i, len));
    i += len;
    if (i == word.size()) s += end_of_word_suffix_;
    if (const int32_t id = VocabId(s); id >= 0) {
      if (pending_unk >= 0) add(std::exchange(pending_unk, -1));
      add(id);
      continue;
    }
    // Byte fallback covers the prefixed/suffixed text, every byte or none (as tokenizers).
    if (byte_fallback_ && std::all_of(s.begin(), s.end(), [&](char c) {
          return byte_ids_[static_cast<uint8_t>(c)] >= 0;
        })) {
      for (char c : s) add(byte_ids_[static_cast<uint8_t>(c)]);
      continue;
    }
    if (unk_id_ < 0) continue;  // no unknown token: the character is dropped
    if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
    pending_unk = unk_id_;
  }
  if (pending_unk >= 0) add(pending_unk);
  if (!symbols.empty()) symbols.back().next = -1;
  return symbols;
}

void HfTokenizer::MergeSymbols(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, MergeAfter> queue;
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A queued pair is stale once either side changed: the pair must still merge to new_id.
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
}

void HfTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t id = VocabId(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<Symbol> symbols = InitialSymbols(word);
  MergeSymbols(&symbols);
  for (const Symbol& s : symbols) {
    if (!s.removed) out->push_back(s.id);
  }
}

std::string HfTokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return {};
  const int32_t index = added_index_[id];
  if (index >= 0 && added_[index].special && !render_special) return {};
  return pieces_[id];
}

// --- loading --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view json_text) {
  json doc = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kError, "not a JSON object (", json_text.size(), " bytes)"));
  }
  // A field of the document, or null; by reference, as the model holds the whole vocabulary.
  auto field = [&doc](const char* key) -> const json& {
    static const json* null = new json();
    auto it = doc.find(key);
    return it == doc.end() ? *null : *it;
  };
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  try {
    WINNOW_RETURN_IF_ERROR(tok->ParseModel(field("model")));
    const json& added = field("added_tokens");
    WINNOW_RETURN_IF_ERROR(tok->ParseAddedTokens(added.is_null() ? json::array() : added));
    WINNOW_ASSIGN_OR_RETURN(tok->normalizer_,
                            HfNormalizer::FromJson(field("normalizer"), "normalizer"));
    WINNOW_ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                            HfPreTokenizer::FromJson(field("pre_tokenizer"), "pre_tokenizer"));
    WINNOW_ASSIGN_OR_RETURN(tok->decoder_, HfDecoder::FromJson(field("decoder"), "decoder"));
    WINNOW_RETURN_IF_ERROR(tok->ParsePostProcessor(field("post_processor"), "post_processor"));
  } catch (const json::exception& e) {
    // A field of an unexpected JSON type deep inside (nlohmann's value()/get<>() throw).
    return absl::InvalidArgumentError(absl::StrCat(kError, e.what()));
  }
  tok->BuildTables();
  tok->BuildMatchers();
  tok->ChooseSpecialIds();
  return tok;
}

absl::Status HfTokenizer::ParseModel(const json& model) {
  if (!model.is_object()) return Invalid("model", "must be an object");
  // Files from before "type" was written hold BPE models recognisable by their merges.
  const std::string type =
      model.contains("type") ? model["type"].get<std::string>() : (model.contains("merges")
                                                                       ? "BPE"
                                                                       : "");
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(
        kError, "model.type '", type, "' is not supported (only BPE models are)"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    return Invalid("model.dropout", "is not supported (BPE dropout is random)");
  }
  static const json* null = new json();
  WINNOW_RETURN_IF_ERROR(ParseVocab(model.contains("vocab") ? model["vocab"] : *null));
  auto optional_string = [&](const char* key) {
    return model.contains(key) && model[key].is_string() ? model[key].get<std::string>() : "";
  };
  continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  end_of_word_suffix_ = optional_string("end_of_word_suffix");
  WINNOW_ASSIGN_OR_RETURN(byte_fallback_, JsonBool(model, "byte_fallback", "model", false));
  WINNOW_ASSIGN_OR_RETURN(fuse_unk_, JsonBool(model, "fuse_unk", "model", false));
  WINNOW_ASSIGN_OR_RETURN(ignore_merges_, JsonBool(model, "ignore_merges", "model", false));
  if (const std::string unk = optional_string("unk_token"); !unk.empty()) {
    unk_id_ = VocabId(unk);
    if (unk_id_ < 0) return Invalid("model.unk_token", absl::StrCat("'", unk, "' is no token"));
  }
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = byte_fallback_ ? VocabId(absl::StrFormat("<0x%02X>", b)) : -1;
  }
  return ParseMerges(model.contains("merges") ? model["merges"] : *null);
}

absl::Status HfTokenizer::ParseVocab(const json& vocab) {
  if (!vocab.is_object()) return Invalid("model.vocab", "must be an object");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat("model.vocab[\"", text, "\"]"), "must be an id");
    }
    vocab_[text] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  tokens_.resize(max_id + 1);
  for (const auto& [text, id] : vocab_) tokens_[id] = text;
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseMerges(const json& merges) {
  if (!merges.is_array()) return Invalid("model.merges", "must be an array");
  merges_.reserve(merges.size());
  size_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string path = absl::StrCat("model.merges[", i, "]");
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      WINNOW_RETURN_IF_ERROR(AddMerge(m[0].get<std::string>(), m[1].get<std::string>(), rank++));
      continue;
    }
    if (!m.is_string()) return Invalid(path, "must be \"a b\" or [a, b]");
    const std::string line = m.get<std::string>();
    if (line.rfind("#version", 0) == 0) continue;  // skipped without taking a rank
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return Invalid(path, "must hold exactly one space");
    }
    WINNOW_RETURN_IF_ERROR(AddMerge(line.substr(0, space), line.substr(space + 1), rank++));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::AddMerge(const std::string& left, const std::string& right,
                                   size_t rank) {
  const int32_t a = VocabId(left);
  const int32_t b = VocabId(right);
  std::string merged = left;
  const std::string_view prefix = continuing_subword_prefix_;
  merged += std::string_view(right).substr(
      !prefix.empty() && std::string_view(right).substr(0, prefix.size()) == prefix
          ? prefix.size()
          : 0);
  const int32_t id = VocabId(merged);
  if (a < 0 || b < 0 || id < 0) {
    return Invalid(absl::StrCat("model.merges[", rank, "]"),
                   absl::StrCat("'", left, " ", right, "' uses or makes a token not in the vocab"));
  }
  // As tokenizers' HashMap: a repeated pair keeps the later rank.
  merges_[PairKey(a, b)] = {static_cast<int32_t>(rank), id};
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseAddedTokens(const json& added) {
  if (!added.is_array()) return Invalid("added_tokens", "must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= (1 << 30)) {
      return Invalid(path, "must be an object with an id");
    }
    AddedToken token;
    token.id = t["id"].get<int32_t>();
    WINNOW_ASSIGN_OR_RETURN(token.content, JsonString(t, "content", path));
    WINNOW_ASSIGN_OR_RETURN(token.special, JsonBool(t, "special", path, false));
    WINNOW_ASSIGN_OR_RETURN(token.single_word, JsonBool(t, "single_word", path, false));
    WINNOW_ASSIGN_OR_RETURN(token.lstrip, JsonBool(t, "lstrip", path, false));
    WINNOW_ASSIGN_OR_RETURN(token.rstrip, JsonBool(t, "rstrip", path, false));
    WINNOW_ASSIGN_OR_RETURN(token.normalized, JsonBool(t, "normalized", path, !token.special));
    if (static_cast<size_t>(token.id) >= tokens_.size()) tokens_.resize(token.id + 1);
    tokens_[token.id] = token.content;
    added_.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParsePostProcessor(const json& post, const std::string& path) {
  if (post.is_null()) return absl::OkStatus();
  WINNOW_ASSIGN_OR_RETURN(const std::string type, JsonType(post, path));
  if (type == "ByteLevel") return absl::OkStatus();  // it only trims offsets
  if (type == "TemplateProcessing") return ParseTemplate(post, path);
  if (type == "Sequence") {
    const json processors = post.value("processors", json());
    if (!processors.is_array()) return Invalid(absl::StrCat(path, ".processors"), "not an array");
    for (size_t i = 0; i < processors.size(); ++i) {
      WINNOW_RETURN_IF_ERROR(
          ParsePostProcessor(processors[i], absl::StrCat(path, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat(kError, path, ".type '", type, "' is not supported"));
}

// TemplateProcessing's "single" template: special tokens around the sequence "A". A later
// processor of a Sequence wraps what the earlier ones produced.
absl::Status HfTokenizer::ParseTemplate(const json& post, const std::string& path) {
  const json single = post.value("single", json());
  const json specials = post.value("special_tokens", json::object());
  if (!single.is_array()) return Invalid(absl::StrCat(path, ".single"), "must be an array");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string item_path = absl::StrCat(path, ".single[", i, "]");
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", "") != "A" || seen_sequence) {
        return Invalid(item_path, "must be the one sequence \"A\"");
      }
      seen_sequence = true;
      continue;
    }
    const std::string name = item.contains("SpecialToken")
                                 ? item["SpecialToken"].value("id", "")
                                 : std::string();
    if (!specials.contains(name)) {
      return Invalid(item_path, absl::StrCat("names '", name, "', not in special_tokens"));
    }
    for (const json& id : specials[name].value("ids", json::array())) {
      const int64_t v = id.get<int64_t>();
      if (v < 0 || v >= (1 << 30)) return Invalid(item_path, "has a bad id");
      (seen_sequence ? after : before).push_back(static_cast<int32_t>(v));
    }
  }
  prefix_ids_.insert(prefix_ids_.begin(), before.begin(), before.end());
  suffix_ids_.insert(suffix_ids_.end(), after.begin(), after.end());
  return absl::OkStatus();
}

// Vocabulary arrays, token types and pieces, once every id is known.
void HfTokenizer::BuildTables() {
  for (int32_t id : prefix_ids_) tokens_.resize(std::max<size_t>(tokens_.size(), id + 1));
  for (int32_t id : suffix_ids_) tokens_.resize(std::max<size_t>(tokens_.size(), id + 1));
  const size_t n = tokens_.size();
  added_index_.assign(n, -1);
  for (size_t i = 0; i < added_.size(); ++i) added_index_[added_[i].id] = static_cast<int32_t>(i);
  token_types_.assign(n, 5);  // ids no token uses: llama.cpp's "unused"
  pieces_.assign(n, std::string());
  for (const auto& [text, id] : vocab_) {
    token_types_[id] = byte_fallback_ && ByteTokenValue(text) >= 0 ? 6 : 1;
    pieces_[id] = text;
    decoder_->Decode(&pieces_[id]);
  }
  // Added tokens render as their content, as transformers and llama.cpp show them.
  for (const AddedToken& t : added_) {
    token_types_[t.id] = t.special ? 3 : 4;
    pieces_[t.id] = t.content;
  }
}

void HfTokenizer::BuildMatchers() {
  // tokenizers orders special tokens before the others; equal patterns keep the first.
  for (bool special : {true, false}) {
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& t = added_[i];
      if (t.special != special) continue;
      if (!t.normalized) {
        raw_matcher_.Add(t.content, static_cast<int32_t>(i));
        continue;
      }
      std::string pattern = t.content;  // matched against normalized text, so normalized too
      normalizer_->Normalize(&pattern);
      normalized_matcher_.Add(pattern, static_cast<int32_t>(i));
    }
  }
}

void HfTokenizer::ChooseSpecialIds() {
  auto find_special = [&](std::span<const std::string_view> texts) {
    for (std::string_view text : texts) {
      for (const AddedToken& t : added_) {
        if (t.special && t.content == text) return t.id;
      }
    }
    return -1;
  };
  add_bos_ = !prefix_ids_.empty();
  add_eos_ = !suffix_ids_.empty();
  bos_id_ = prefix_ids_.size() == 1 ? prefix_ids_[0] : find_special(kBosTexts);
  eos_id_ = suffix_ids_.size() == 1 ? suffix_ids_[0] : find_special(kEosTexts);
  for (const AddedToken& t : added_) {
    if (t.special && std::find(std::begin(kEndTexts), std::end(kEndTexts), t.content) !=
                         std::end(kEndTexts)) {
      eog_ids_.push_back(t.id);
    }
  }
  if (eos_id_ >= 0) eog_ids_.push_back(eos_id_);
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
}

// --- Tokenizer entry points ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(
    std::string_view json_text) {
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tok, HfTokenizer::FromJson(json_text));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJsonFile(
    const std::string& path) {
  std::optional<std::string> text = base::ReadWholeFile(path);
  if (!text) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  return FromTokenizerJson(*text);
}

}  // namespace winnow::model
