// Arbitrary bytes -> Encode and Decode with a SentencePiece tokenizer built in memory
// (fuzz_util.cc) and the default model's byte-level BPE tokenizer (WINNOW_FUZZ_MODEL or
// WINNOW_TEST_MODEL; the BPE half is skipped without it). The first byte picks the flags; the
// rest is the text, and also read as token ids for Decode and the streaming detokenizer (ids out
// of range included: both must ignore them, not read outside the vocabulary).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace {

winnow::fuzz::SpmVocab* spm = nullptr;
std::unique_ptr<winnow::model::GgufFile> bpe_file;
std::unique_ptr<winnow::model::Tokenizer> bpe;

void Exercise(const winnow::model::Tokenizer& tok, uint8_t flags, std::string_view text) {
  const std::vector<int32_t> ids = tok.Encode(text, flags & 1, flags & 2);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // Encode must stay in the vocab
  }
  (void)tok.Decode(ids, flags & 4);
  std::vector<int32_t> raw(text.size() / sizeof(int32_t));
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * sizeof(int32_t));
  for (int32_t& id : raw) id %= tok.vocab_size() + 8;  // mostly in range, a few past the end
  (void)tok.Decode(raw, flags & 4);
  winnow::model::StreamingDetokenizer stream(tok, flags & 4);
  for (int32_t id : raw) (void)stream.Append(id);
  (void)stream.Flush();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spm = new winnow::fuzz::SpmVocab(winnow::fuzz::MakeSpmVocab());
  if (spm->tokenizer == nullptr) {
    std::fprintf(stderr, "tokenizer_fuzz: the in-memory SentencePiece vocabulary did not load\n");
    std::abort();
  }
  const std::string path = winnow::fuzz::ModelPath();
  if (path.empty()) {
    std::fprintf(stderr, "tokenizer_fuzz: no WINNOW_FUZZ_MODEL; BPE is not fuzzed\n");
    return 0;
  }
  auto file = winnow::model::GgufFile::Open(path);
  if (!file.ok()) return 0;
  bpe_file = std::move(*file);
  auto tok = winnow::model::Tokenizer::FromGguf(*bpe_file);
  if (tok.ok()) bpe = std::move(*tok);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  Exercise(*spm->tokenizer, data[0], text);
  if (bpe != nullptr) Exercise(*bpe, data[0], text);
  return 0;
}
