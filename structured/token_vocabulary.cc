#include "structured/token_vocabulary.h"

#include <algorithm>
#include <atomic>
#include <numeric>

namespace winnow::structured {
namespace {

uint64_t NextId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace

TokenVocabulary::TokenVocabulary(const std::vector<std::string>& pieces,
                                 std::vector<int32_t> end_ids)
    : id_(NextId()),
      size_(static_cast<int32_t>(pieces.size())),
      pieces_(pieces),
      end_ids_(std::move(end_ids)) {
  // Tokens sorted by their bytes: a trie is then built in one pass, each token sharing the
  // path of the previous one as far as their common prefix.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size_; ++id) {
    if (!pieces_[id].empty() && !IsEnd(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] < pieces_[b] || (pieces_[a] == pieces_[b] && a < b);
  });
  nodes_.emplace_back();
  std::vector<int32_t> path = {kRoot};  // path[d]: the node for the first d bytes
  std::vector<int32_t> last_child = {-1};
  std::string previous;
  for (const int32_t id : order) {
    const std::string& p = pieces_[id];
    size_t common = 0;
    while (common < p.size() && common < previous.size() && p[common] == previous[common]) {
      ++common;
    }
    path.resize(common + 1);
    last_child.resize(common + 1);
    for (size_t d = common; d < p.size(); ++d) {
      const int32_t parent = path[d];
      const int32_t child = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(TrieNode{.byte = static_cast<uint8_t>(p[d])});
      if (last_child[d] < 0) {
        nodes_[parent].first_child = child;
      } else {
        nodes_[last_child[d]].next_sibling = child;
      }
      last_child[d] = child;
      path.push_back(child);
      last_child.push_back(-1);
    }
    TrieNode& end = nodes_[path.back()];
    if (end.tokens_begin == end.tokens_end) {
      end.tokens_begin = static_cast<int32_t>(token_ids_.size());
      end.tokens_end = end.tokens_begin;
    }
    token_ids_.push_back(id);
    ++end.tokens_end;
    previous = p;
  }
}

bool TokenVocabulary::IsEnd(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

}  // namespace winnow::structured
