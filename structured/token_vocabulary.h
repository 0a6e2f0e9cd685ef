// The model's vocabulary as the constrained decoder sees it: each token's bytes in a trie, so
// that a token mask is one walk that shares every prefix (a byte the grammar rejects prunes
// all the tokens below it), and the end-of-generation ids the grammar allows once the output
// is complete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace winnow::structured {

class TokenVocabulary {
 public:
  struct TrieNode {
    uint8_t byte = 0;
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t tokens_begin = 0;  // [tokens_begin, tokens_end) of token_ids(): tokens ending here
    int32_t tokens_end = 0;
  };

  // pieces[id]: the bytes token `id` adds to the text; an empty piece (control tokens) is
  // never allowed. end_ids: tokens that end generation.
  TokenVocabulary(const std::vector<std::string>& pieces, std::vector<int32_t> end_ids);

  int32_t size() const { return size_; }
  // Unique per vocabulary built in this process: part of the mask cache's key (an address could
  // be reused by a later vocabulary).
  uint64_t id() const { return id_; }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool IsEnd(int32_t id) const;

  const TrieNode& node(int32_t i) const { return nodes_[i]; }
  static constexpr int32_t kRoot = 0;
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

 private:
  uint64_t id_;
  int32_t size_ = 0;
  std::vector<std::string> pieces_;
  std::vector<int32_t> end_ids_;
  std::vector<TrieNode> nodes_;
  std::vector<int32_t> token_ids_;  // grouped by the trie node they end at
};

}  // namespace winnow::structured
