// Regex pre-tokenizer of byte-level BPE: cuts text into words before merging. The regex list for
// each tokenizer.ggml.pre value follows llama.cpp (llm_tokenizer_bpe); each regex splits every
// piece left by the previous one, and both matches and the gaps between them become pieces.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/pcre2_regex.h"

namespace winnow::model {

class PreTokenizer {
 public:
  // `pre` is tokenizer.ggml.pre; empty means llama.cpp's "default" list. An unknown name falls back
  // to the GPT-2 regex with a warning (llama.cpp refuses to load such a model instead).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> ForName(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Name of the regex list in use ("gpt2", "llama3", ...), for logs and tests.
  const std::string& kind() const { return kind_; }
  // Whether a word that is already a whole token skips merging (llama.cpp's ignore_merges).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether the model adds BOS unless its metadata says otherwise.
  bool default_add_bos() const { return default_add_bos_; }

  // Splits strictly valid UTF-8 into consecutive pieces; returns their byte lengths (sum equals
  // text.size()). Thread-safe.
  std::vector<size_t> Split(std::string_view text) const;

  // The PCRE2 patterns, in application order.
  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  PreTokenizer() = default;

  std::string kind_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
  std::vector<std::string> patterns_;
  std::vector<std::unique_ptr<Pcre2Regex>> compiled_;
};

}  // namespace winnow::model
