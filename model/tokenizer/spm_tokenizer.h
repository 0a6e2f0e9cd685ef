// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"), as llama.cpp's
// llm_tokenizer_spm_session: spaces become U+2581, a space is prefixed to text at the start and
// after every special token (add_space_prefix), adjacent symbols merge greedily by the score of
// the token they would form (highest first, leftmost on ties), and symbols that are not tokens
// fall back to <0xNN> byte tokens (or the unknown token).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/tokenizer/vocab_tokenizer.h"

namespace winnow::model {

class SpmTokenizer final : public VocabTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SpmTokenizer>> FromGguf(const GgufFile& file);

  bool add_space_prefix() const { return add_space_prefix_; }

 protected:
  void EncodeFragment(std::string_view text, bool after_special,
                      std::vector<int32_t>* out) const override;
  std::string NormalPiece(const std::string& text) const override;

 private:
  SpmTokenizer() = default;
  void AppendBytes(std::string_view symbol, std::vector<int32_t>* out) const;

  bool add_space_prefix_ = true;
  int32_t byte_tokens_[256];  // id for each byte value, or -1
};

}  // namespace winnow::model
