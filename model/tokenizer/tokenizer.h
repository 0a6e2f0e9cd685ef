// Tokenizers built from GGUF metadata: byte-level BPE (tokenizer.ggml.model = "gpt2") and
// SentencePiece-style (tokenizer.ggml.model = "llama"). Behaviour follows llama.cpp's
// llama_tokenize / llama_token_to_piece, the reference for GGUF tokenisation. Tokenizers read
// from a Hugging Face tokenizer.json follow the `tokenizers` library instead.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"

namespace winnow::model {

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // A Hugging Face tokenizer.json, encoding as the `tokenizers` library does (hf_tokenizer.h).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(std::string_view json_text);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJsonFile(const std::string& path);
  virtual ~Tokenizer() = default;

  // add_special: prepend BOS (and append EOS) when the model's metadata asks for it.
  // parse_special: recognise the text of special/control tokens (e.g. "<|im_start|>") as
  // those tokens; otherwise they are tokenised as plain text.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  // The bytes of one token as they appear in text (may be an incomplete UTF-8 sequence).
  // Control tokens decode to their text only when `render_special` is set.
  virtual std::string TokenToPiece(int32_t id, bool render_special) const = 0;

  // Concatenated pieces; for SentencePiece the leading space of the first token is kept as
  // llama.cpp does.
  std::string Decode(std::span<const int32_t> ids, bool render_special) const;
  // TokenToPiece of every id, in id order (what constrained decoding matches bytes against).
  std::vector<std::string> Pieces(bool render_special) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& TokenText(int32_t id) const { return tokens_[id]; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  // End-of-generation tokens: EOS, EOT, and template end markers such as <|im_end|>/<|eot_id|>.
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }
  // Special (control/user-defined) token by exact text, or -1.
  int32_t FindSpecial(std::string_view text) const;

  // For a loader that knows the model's special tokens better than the vocabulary does (a
  // Hugging Face directory's tokenizer_config.json and generation_config.json): BOS and EOS
  // when >= 0, and more end-of-generation ids (out-of-vocabulary ones are ignored).
  void SetSpecialIds(int32_t bos_id, int32_t eos_id, std::span<const int32_t> more_eog_ids);

 protected:
  std::vector<std::string> tokens_;
  std::vector<int32_t> token_types_;  // llama.cpp token types: 1 normal, 2 unknown, 3 control,
                                      // 4 user-defined, 5 unused, 6 byte
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_ids_;
};

// Turns a stream of token ids into text deltas that are always valid UTF-8: bytes of a
// character that spans tokens are held back until the character is complete.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  // Returns the complete UTF-8 text this token finishes (possibly empty).
  std::string Append(int32_t id);
  // Returns whatever is still held back, invalid bytes replaced by U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace winnow::model
