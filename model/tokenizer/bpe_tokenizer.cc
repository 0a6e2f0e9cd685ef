#include "model/tokenizer/bpe_tokenizer.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "model/tokenizer/unicode.h"

namespace winnow::model {
namespace {

// A run of the word's stand-in characters; merged-away symbols have len 0.
struct Symbol {
  uint32_t start;
  uint32_t len;
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t left_len;   // lengths when queued: a bigram is stale once either side changed
  uint32_t right_len;
};

// Lowest rank first; on equal ranks the leftmost pair.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const GgufFile& file) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  std::string pre;
  if (absl::StatusOr<std::string> p = file.GetString("tokenizer.ggml.pre"); p.ok()) pre = *p;
  WINNOW_ASSIGN_OR_RETURN(tok->pre_, PreTokenizer::ForName(pre));

  absl::StatusOr<std::vector<std::string>> merges = file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: BPE model without usable tokenizer.ggml.merges: ", merges.status().message()));
  }
  // The views below point into these strings, so the vector must not change afterwards.
  tok->merge_storage_ = std::move(*merges);
  tok->merge_ranks_.reserve(tok->merge_storage_.size());
  for (size_t i = 0; i < tok->merge_storage_.size(); ++i) {
    std::string_view m = tok->merge_storage_[i];
    // As llama.cpp: split at the first space after the first byte; no space means ("", "").
    std::string_view first, second;
    if (size_t pos = m.find(' ', 1); pos != std::string_view::npos) {
      first = m.substr(0, pos);
      second = m.substr(pos + 1);
    }
    tok->merge_ranks_.try_emplace({first, second}, static_cast<int32_t>(i));  // first rank wins
  }

  Defaults defaults;
  defaults.bos = 11;  // llama.cpp's BPE defaults when the metadata names no BOS/EOS
  defaults.eos = 11;
  defaults.add_bos = tok->pre_->default_add_bos();
  WINNOW_RETURN_IF_ERROR(tok->LoadVocab(file, defaults));
  return tok;
}

int32_t BpeTokenizer::MergeRank(std::string_view left, std::string_view right) const {
  auto it = merge_ranks_.find(std::make_pair(left, right));
  return it == merge_ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::EncodeFragment(std::string_view text, bool /*after_special*/,
                                  std::vector<int32_t>* out) const {
  // The regexes need valid UTF-8. Invalid input is decoded the way llama.cpp does (bad bytes
  // become U+FFFD); surrogates it lets through are matched as a private-use stand-in of the same
  // length while their own bytes are what gets merged.
  std::string owned, match_owned;
  std::string_view bytes = text;
  std::string_view match = text;
  if (!IsValidUtf8(text)) {
    for (uint32_t cpt : DecodeUtf8Lenient(text)) {
      AppendUtf8(cpt, &owned);
      AppendUtf8(cpt >= 0xD800 && cpt <= 0xDFFF ? 0xE000 : cpt, &match_owned);
    }
    bytes = owned;
    match = match_owned;
  }
  std::string scratch;
  size_t offset = 0;
  for (size_t len : pre_->Split(match)) {
    EncodeWord(bytes.substr(offset, len), &scratch, out);
    offset += len;
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, std::string* scratch,
                              std::vector<int32_t>* out) const {
  if (word.empty()) return;
  std::string& mapped = *scratch;
  mapped.clear();
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const std::string& c = ByteToBpeChar(static_cast<uint8_t>(word[i]));
    const int32_t index = static_cast<int32_t>(i);
    symbols.push_back({static_cast<uint32_t>(mapped.size()), static_cast<uint32_t>(c.size()),
                       index - 1, i + 1 == word.size() ? -1 : index + 1});
    mapped += c;
  }
  if (pre_->ignore_merges()) {
    if (int32_t id = TextToId(mapped); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  auto view = [&](const Symbol& s) { return std::string_view(mapped).substr(s.start, s.len); };

  std::priority_queue<Bigram, std::vector<Bigram>, BigramAfter> queue;
  auto add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = MergeRank(view(symbols[left]), view(symbols[right]));
    if (rank < 0) return;
    queue.push({rank, left, right, symbols[left].len, symbols[right].len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.len == 0 || right.len == 0 || left.len != b.left_len || right.len != b.right_len) {
      continue;
    }
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    add_bigram(left.prev, b.left);
    add_bigram(b.left, left.next);
  }

  for (const Symbol& s : symbols) {
    if (s.len == 0) continue;
    const std::string_view text = view(s);
    if (int32_t id = TextToId(text); id >= 0) {
      out->push_back(id);
      continue;
    }
    // No such token: llama.cpp falls back to single bytes of the stand-in text, which rarely
    // exist; whatever does not is dropped.
    for (char c : text) {
      if (int32_t id = TextToId(std::string_view(&c, 1)); id >= 0) out->push_back(id);
    }
  }
}

std::string BpeTokenizer::NormalPiece(const std::string& text) const {
  std::string out;
  out.reserve(text.size());
  for (uint32_t cpt : DecodeUtf8Lenient(text)) {
    const int byte = BpeCodepointToByte(cpt);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    // Not a stand-in character: llama.cpp writes a visible marker instead of dropping it.
    std::string utf8;
    AppendUtf8(cpt, &utf8);
    out += "[UNK_BYTE_0x";
    for (unsigned char c : utf8) absl::StrAppendFormat(&out, "%02x", c);
    out += text;
    out += "]";
  }
  return out;
}

}  // namespace winnow::model
