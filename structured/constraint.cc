#include "structured/constraint.h"

#include "absl/strings/str_cat.h"

namespace winnow::structured {
namespace {

// Depth-first over the vocabulary trie: a child is visited only when the grammar takes its
// byte, so a rejected prefix prunes every token below it.
void Visit(const JsonMatcher& matcher, const TokenVocabulary& vocab, int32_t node,
           const MatchState& state, TokenMask& mask) {
  MatchState next;
  for (int32_t c = vocab.node(node).first_child; c >= 0; c = vocab.node(c).next_sibling) {
    const TokenVocabulary::TrieNode& child = vocab.node(c);
    if (!matcher.Feed(state, child.byte, &next)) continue;
    for (int32_t i = child.tokens_begin; i < child.tokens_end; ++i) {
      const int32_t id = vocab.token_ids()[i];
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    }
    if (child.first_child >= 0) Visit(matcher, vocab, c, next, mask);
  }
}

}  // namespace

TokenMask ComputeTokenMask(const JsonMatcher& matcher, const TokenVocabulary& vocab,
                           const MatchState& state) {
  TokenMask mask((vocab.size() + 63) / 64, 0);
  Visit(matcher, vocab, TokenVocabulary::kRoot, state, mask);
  if (matcher.CanEnd(state)) {
    for (const int32_t id : vocab.end_ids()) mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
  return mask;
}

std::shared_ptr<const TokenMask> MaskCache::Find(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  const auto it = masks_.find(key);
  return it == masks_.end() ? nullptr : it->second;
}

void MaskCache::Insert(const std::string& key, std::shared_ptr<const TokenMask> mask) {
  absl::MutexLock lock(&mu_);
  if (masks_.size() >= kCapacity) masks_.clear();
  masks_.emplace(key, std::move(mask));
}

Constraint::Constraint(std::shared_ptr<const CompiledGrammar> grammar,
                       std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)),
      state_(grammar_->matcher.Initial()) {}

const TokenMask& Constraint::Allowed() {
  if (mask_ != nullptr) return *mask_;
  // The vocabulary is part of the key: a grammar shared by two models keeps their masks apart.
  const uint64_t vocab_id = vocab_->id();
  std::string key(reinterpret_cast<const char*>(&vocab_id), sizeof(vocab_id));
  key += state_.Key();
  mask_ = grammar_->masks.Find(key);
  if (mask_ == nullptr) {
    mask_ = std::make_shared<const TokenMask>(
        ComputeTokenMask(grammar_->matcher, *vocab_, state_));
    grammar_->masks.Insert(key, mask_);
  }
  return *mask_;
}

absl::Status Constraint::Accept(int32_t token) {
  if (token >= 0 && token < vocab_->size() && vocab_->IsEnd(token) && CanEnd()) {
    return absl::OkStatus();
  }
  if (token < 0 || token >= vocab_->size() || vocab_->IsEnd(token) ||
      !grammar_->matcher.FeedAll(state_, vocab_->piece(token))) {
    return absl::FailedPreconditionError(
        absl::StrCat("structured output: token ", token, " does not continue the grammar"));
  }
  mask_ = nullptr;
  return absl::OkStatus();
}

}  // namespace winnow::structured
