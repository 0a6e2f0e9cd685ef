// Helpers shared by the fuzz targets: splitting one input into several fields, finding the
// default model, and a small SentencePiece vocabulary built in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::fuzz {

// Splits the input at every NUL byte: the targets that need several strings (template and
// messages, role and content) read them as fields, so libFuzzer's mutations of the separators
// add and drop fields.
std::vector<std::string_view> SplitFields(const uint8_t* data, size_t size);

// The GGUF model named by WINNOW_FUZZ_MODEL, else WINNOW_TEST_MODEL; empty when neither names an
// existing file (targets that need it then do nothing, so the replay tests pass without it).
std::string ModelPath();

// A vocab-only GGUF image: key/value writers for the types the tokenizers read.
class GgufImage {
 public:
  GgufImage& Str(const std::string& key, const std::string& value);
  GgufImage& U32(const std::string& key, uint32_t value);
  GgufImage& Bool(const std::string& key, bool value);
  GgufImage& StrArray(const std::string& key, const std::vector<std::string>& values);
  GgufImage& F32Array(const std::string& key, const std::vector<float>& values);
  GgufImage& I32Array(const std::string& key, const std::vector<int32_t>& values);
  std::string Bytes() const;

 private:
  void Key(const std::string& key, uint32_t type);
  void PutStr(const std::string& s);
  std::string body_;
  uint64_t count_ = 0;
};

// A SentencePiece tokenizer ("llama") over unknown, BOS, EOS, the 256 byte tokens, U+2581,
// letters and merged pieces, a user-defined and a control special; the GGUF it was read from is
// kept alive beside it.
struct SpmVocab {
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<model::Tokenizer> tokenizer;
};
SpmVocab MakeSpmVocab();

}  // namespace winnow::fuzz
