// A byte trie over token texts (special or added tokens): which of them start at a position of a
// text, without scanning the text once per token (some vocabularies have thousands).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace winnow::model {

class ByteTrie {
 public:
  // Adds `text` with `value` (>= 0). For equal texts the first value added stays; an empty text
  // is ignored.
  void Add(std::string_view text, int32_t value) {
    if (text.empty()) return;
    first_byte_[static_cast<uint8_t>(text[0])] = true;
    int32_t node = 0;
    for (const char c : text) {
      auto [it, inserted] = edges_.try_emplace(Key(node, c), static_cast<int32_t>(value_.size()));
      if (inserted) value_.push_back(-1);
      node = it->second;
    }
    if (value_[node] == -1) value_[node] = value;
  }

  // Calls match(value, length) for every added text that starts at text[pos], shortest first.
  template <typename Match>
  void ForEachAt(std::string_view text, size_t pos, Match match) const {
    if (pos >= text.size() || !first_byte_[static_cast<uint8_t>(text[pos])]) return;
    int32_t node = 0;
    for (size_t j = pos; j < text.size(); ++j) {
      auto it = edges_.find(Key(node, text[j]));
      if (it == edges_.end()) return;
      node = it->second;
      if (value_[node] >= 0) match(value_[node], j + 1 - pos);
    }
  }

 private:
  static uint64_t Key(int32_t node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
  }

  absl::flat_hash_map<uint64_t, int32_t> edges_;  // node << 8 | byte -> node
  std::vector<int32_t> value_ = {-1};             // node -> the value of a text ending there
  bool first_byte_[256] = {};
};

}  // namespace winnow::model
