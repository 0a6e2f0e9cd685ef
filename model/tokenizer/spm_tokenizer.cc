#include "model/tokenizer/spm_tokenizer.h"

#include <queue>

#include "base/status_macros.h"
#include "model/tokenizer/unicode.h"
#include "spdlog/spdlog.h"

namespace winnow::model {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581

struct Symbol {
  uint32_t start;
  uint32_t len;
  int32_t prev;
  int32_t next;
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;
};

// Highest score first; on equal scores the leftmost pair.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::FromGguf(const GgufFile& file) {
  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer());
  Defaults defaults;
  defaults.bos = 1;  // llama.cpp's SPM defaults
  defaults.eos = 2;
  defaults.unk = 0;
  defaults.add_bos = true;
  WINNOW_RETURN_IF_ERROR(tok->LoadVocab(file, defaults));
  if (absl::StatusOr<bool> b = file.GetBool("tokenizer.ggml.add_space_prefix"); b.ok()) {
    tok->add_space_prefix_ = *b;
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  int missing = 0;
  for (int b = 0; b < 256; ++b) {
    const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = tok->TextToId(std::string_view(name, 6));
    if (id < 0 && b != 0) {
      const char c = static_cast<char>(b);
      id = tok->TextToId(std::string_view(&c, 1));
    }
    tok->byte_tokens_[b] = id;
    if (id < 0) ++missing;
  }
  if (missing > 0) {
    spdlog::info("tokenizer: {} byte values have no <0xNN> token; they map to the unknown token",
                 missing);
  }
  return tok;
}

void SpmTokenizer::AppendBytes(std::string_view symbol, std::vector<int32_t>* out) const {
  for (char c : symbol) {
    int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    // llama.cpp throws here; the unknown token is the closest thing to what SentencePiece does.
    if (id < 0) id = unk_id_;
    if (id >= 0) out->push_back(id);
  }
}

void SpmTokenizer::EncodeFragment(std::string_view text, bool after_special,
                                  std::vector<int32_t>* out) const {
  std::string s;
  s.reserve(text.size() + 8);
  if (add_space_prefix_ && after_special) s += kSpmSpace;
  for (char c : text) {
    if (c == ' ') {
      s += kSpmSpace;
    } else {
      s.push_back(c);
    }
  }
  if (s.empty()) return;

  std::vector<Symbol> symbols;
  symbols.reserve(s.size());
  for (size_t offset = 0; offset < s.size();) {
    const size_t len = std::min(Utf8SequenceLength(static_cast<uint8_t>(s[offset])),
                                s.size() - offset);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(len), index - 1,
                       offset + len == s.size() ? -1 : index + 1});
    offset += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramAfter> queue;
  auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].len + symbols[right].len;
    const int32_t id = TextToId(std::string_view(s).substr(symbols[left].start, size));
    if (id < 0) return;
    queue.push({scores_[id], left, right, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add_bigram(left.prev, b.left);
    try_add_bigram(b.left, left.next);
  }

  // Every merge formed a token, so a symbol that is no token was never merged: it is one
  // character, emitted as bytes.
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = std::string_view(s).substr(symbols[i].start, symbols[i].len);
    if (int32_t id = TextToId(piece); id >= 0) {
      out->push_back(id);
    } else {
      AppendBytes(piece, out);
    }
  }
}

std::string SpmTokenizer::NormalPiece(const std::string& text) const {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
      out.push_back(' ');
      i += kSpmSpace.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

}  // namespace winnow::model
