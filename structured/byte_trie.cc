#include "structured/byte_trie.h"

#include <algorithm>

namespace winnow::structured {

void ByteTrie::Insert(std::string_view text, int32_t value) {
  int32_t node = kRoot;
  std::vector<int32_t> path = {node};
  for (const char c : text) {
    const uint8_t byte = static_cast<uint8_t>(c);
    int32_t next = Child(node, byte);
    if (next == kNone) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[node].children;
      children.insert(std::lower_bound(children.begin(), children.end(),
                                       std::pair<uint8_t, int32_t>(byte, 0)),
                      {byte, next});
    }
    node = next;
    path.push_back(node);
  }
  if (nodes_[node].terminal != kNone) return;
  nodes_[node].terminal = value;
  for (const int32_t n : path) nodes_[n].values_below.push_back(value);  // increasing order
}

int32_t ByteTrie::Child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  const auto it = std::lower_bound(children.begin(), children.end(),
                                   std::pair<uint8_t, int32_t>(byte, 0));
  return it != children.end() && it->first == byte ? it->second : kNone;
}

bool ByteTrie::HasValueIn(int32_t node, int32_t lo, int32_t hi) const {
  const auto& values = nodes_[node].values_below;
  const auto it = std::lower_bound(values.begin(), values.end(), lo);
  return it != values.end() && *it <= hi;
}

}  // namespace winnow::structured
