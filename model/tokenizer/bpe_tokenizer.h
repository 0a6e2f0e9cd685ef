// Byte-level BPE (tokenizer.ggml.model = "gpt2"): bytes map to printable stand-in characters
// (GPT-2's bytes_to_unicode), a regex pre-tokenizer cuts words, and merges apply by rank within
// each word, lowest rank first, leftmost first on ties (llama.cpp's llm_tokenizer_bpe_session).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/vocab_tokenizer.h"

namespace winnow::model {

class BpeTokenizer final : public VocabTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGguf(const GgufFile& file);

  const PreTokenizer& pre_tokenizer() const { return *pre_; }
  // Merge rank of the pair, or -1.
  int32_t MergeRank(std::string_view left, std::string_view right) const;

 protected:
  void EncodeFragment(std::string_view text, bool after_special,
                      std::vector<int32_t>* out) const override;
  std::string NormalPiece(const std::string& text) const override;

 private:
  BpeTokenizer() = default;
  // Merges one pre-tokenized word (raw bytes) and appends its ids.
  void EncodeWord(std::string_view word, std::string* scratch, std::vector<int32_t>* out) const;

  std::unique_ptr<PreTokenizer> pre_;
  std::vector<std::string> merge_storage_;  // owns the texts merge_ranks_ points into
  absl::flat_hash_map<std::pair<std::string_view, std::string_view>, int32_t> merge_ranks_;
};

}  // namespace winnow::model
