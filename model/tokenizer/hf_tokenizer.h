// A tokenizer read from a Hugging Face tokenizer.json, encoding as the `tokenizers` library
// (Tokenizer.encode) does: added tokens are split out first, then each remaining segment is
// normalized, split again at normalized added tokens, pre-tokenized and run through BPE, and the
// post-processor's template adds the special tokens around the result. Supported components and
// the invalid-UTF-8 rule are listed in docs/tokenizer.md ("tokenizer.json").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model/tokenizer/byte_trie.h"
#include "model/tokenizer/hf_pipeline.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace winnow::model {

class HfTokenizer final : public Tokenizer {
 public:
  // Errors name the JSON path of what is missing, malformed or not supported.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(std::string_view json_text);

  // Invalid UTF-8 in `text` is first replaced as Python's bytes.decode("utf-8",
  // errors="replace") does (each maximal ill-formed subsequence becomes U+FFFD).
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  // Added tokens give their content (special ones only with render_special); other tokens go
  // through the decoder, one token at a time.
  std::string TokenToPiece(int32_t id, bool render_special) const override;

  // Ids the post-processor puts before and after a single sequence when add_special is set.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }

 private:
  struct AddedToken {
    int32_t id = -1;
    std::string content;
    bool special = false;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
  };
  // A segment of text, or an added token (id >= 0).
  struct Segment {
    int32_t id = -1;
    size_t start = 0;
    size_t end = 0;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool removed;
  };

  HfTokenizer() = default;
  absl::Status ParseModel(const nlohmann::json& model);
  absl::Status ParseVocab(const nlohmann::json& vocab);
  absl::Status ParseMerges(const nlohmann::json& merges);
  absl::Status AddMerge(const std::string& left, const std::string& right, size_t rank);
  absl::Status ParseAddedTokens(const nlohmann::json& added);
  absl::Status ParsePostProcessor(const nlohmann::json& post, const std::string& path);
  absl::Status ParseTemplate(const nlohmann::json& post, const std::string& path);
  void BuildTables();
  void BuildMatchers();
  void ChooseSpecialIds();

  // The split of `text` at added tokens of `matcher`, as AddedVocabulary::find_matches.
  // Leftmost-longest matching (the aho-corasick match kind `tokenizers` uses) of the added
  // texts in `matcher`, whose values index added_.
  std::vector<Segment> SplitAdded(std::string_view text, const ByteTrie& matcher,
                                  bool parse_special) const;
  // Normalizer, normalized added tokens, pre-tokenizer and BPE for one raw segment.
  void EncodeSegment(std::string_view text, bool at_start, bool parse_special,
                     std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // The word's characters as initial symbols (byte fallback and unknown handling included).
  std::vector<Symbol> InitialSymbols(std::string_view word) const;
  void MergeSymbols(std::vector<Symbol>* symbols) const;
  int32_t VocabId(std::string_view text) const;

  // Model vocabulary (without added tokens): text -> id.
  absl::flat_hash_map<std::string, int32_t> vocab_;
  // (left id << 32 | right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> ids when byte_fallback, else -1

  std::vector<AddedToken> added_;
  std::vector<int32_t> added_index_;  // id -> index into added_, or -1
  ByteTrie raw_matcher_;          // tokens with normalized = false, on the input
  ByteTrie normalized_matcher_;   // normalized = true, on the normalized text

  std::unique_ptr<HfNormalizer> normalizer_;
  std::unique_ptr<HfPreTokenizer> pre_tokenizer_;
  std::unique_ptr<HfDecoder> decoder_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  std::vector<std::string> pieces_;  // TokenToPiece(id, true)
};

}  // namespace winnow::model
