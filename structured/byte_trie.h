// A trie over byte strings whose complete strings carry a value: what the grammar uses for an
// object's declared keys and for sets of JSON literals (enum, const, true/false, null).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace winnow::structured {

class ByteTrie {
 public:
  static constexpr int32_t kRoot = 0;
  static constexpr int32_t kNone = -1;

  ByteTrie() : nodes_(1) {}

  // Adds `text` with `value` (>= 0). Values must be added in increasing order; a text added
  // twice keeps its first value.
  void Insert(std::string_view text, int32_t value);

  // The child of `node` along `byte`, or kNone.
  int32_t Child(int32_t node, uint8_t byte) const;
  bool HasChildren(int32_t node) const { return !nodes_[node].children.empty(); }
  // The value of the string ending at `node`, or kNone.
  int32_t Terminal(int32_t node) const { return nodes_[node].terminal; }
  // Whether a string through `node` (ending there or below) has a value in [lo, hi].
  bool HasValueIn(int32_t node, int32_t lo, int32_t hi) const;
  bool empty() const { return nodes_[kRoot].children.empty() && nodes_[kRoot].terminal == kNone; }

 private:
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t terminal = kNone;
    std::vector<int32_t> values_below;  // sorted: the values of strings through this node
  };
  std::vector<TrieNode> nodes_;
};

}  // namespace winnow::structured
