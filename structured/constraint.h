// One request's constrained decoding: the grammar's state after the tokens generated so far,
// the mask of tokens that may come next (end-of-generation only once the output is a complete
// value), and the step that takes the sampled token. Masks depend only on the state, so they
// are cached per grammar (MaskCache) and shared by every request with the same schema.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "structured/json_matcher.h"
#include "structured/token_vocabulary.h"

namespace winnow::structured {

// Bit (id % 64) of word (id / 64) is set when token `id` is allowed.
using TokenMask = std::vector<uint64_t>;

inline bool Allows(const TokenMask& mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

// The tokens of `vocab` that `state` can take whole (every byte of the token accepted), plus
// the end ids when the state may end.
TokenMask ComputeTokenMask(const JsonMatcher& matcher, const TokenVocabulary& vocab,
                           const MatchState& state);

// Masks by state key, bounded: when full it is cleared (states recur within a request, and a
// new request rebuilds what it needs).
class MaskCache {
 public:
  static constexpr size_t kCapacity = 512;
  std::shared_ptr<const TokenMask> Find(const std::string& key) const;
  void Insert(const std::string& key, std::shared_ptr<const TokenMask> mask);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const TokenMask>> masks_ ABSL_GUARDED_BY(mu_);
};

// A compiled grammar with its mask cache: what requests with the same schema share.
struct CompiledGrammar {
  explicit CompiledGrammar(std::shared_ptr<const Grammar> grammar) : matcher(std::move(grammar)) {}
  JsonMatcher matcher;
  mutable MaskCache masks;
};

class Constraint {
 public:
  Constraint(std::shared_ptr<const CompiledGrammar> grammar,
             std::shared_ptr<const TokenVocabulary> vocab);

  // The tokens allowed next.
  const TokenMask& Allowed();
  // Takes the sampled token. FailedPrecondition when the grammar does not allow it.
  absl::Status Accept(int32_t token);
  // Whether the output so far is a complete value.
  bool CanEnd() const { return grammar_->matcher.CanEnd(state_); }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  MatchState state_;
  std::shared_ptr<const TokenMask> mask_;  // of state_, once computed
};

}  // namespace winnow::structured
