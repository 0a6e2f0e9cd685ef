// TokenSelect (Wu et al., EMNLP 2025; brief specs/tokenselect.md): dynamic token-level selection
// of the KV each decode step attends to. Nothing is evicted and no block is freed: the policy
// only cuts attention work. Per layer and decode step:
//   vote[t] = sum over query heads h of softmax_t(q_h . k_t) over the candidate tokens t
//   (eq. 7, the head soft vote: each head's distribution sums to 1, so no head dominates);
//   attended = [0, n_init) + top-k(vote) + the n_local most recent tokens (the new token
//   included), one set per layer shared by every KV head (what a paged kernel can use).
// The Selection Cache reuses the last selection while the query stays within cosine theta of
// the query that produced it. Decisions on the brief's open points: docs/compression.md
// ("## tokenselect").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/attention_selector.h"
#include "cache/policies/policy.h"
#include "cache/scoring_backend.h"

namespace winnow::cache::policies {

// Params (all optional):
//   k          (0)    selected tokens per step; 0 = derive the whole attended set from `budget`
//                     (budget x tokens in the cache, split like the paper's 128 + 2048 + 512);
//   n_init     (128)  leading tokens always attended (an upper bound when k = 0);
//   n_local    (512)  most recent tokens always attended, the new one included (idem);
//   theta      (0.9)  Selection Cache cosine threshold; selection_cache (true) turns it off;
//   gqa_map    (div|mod) which KV head query head h scores against: h / group (the model's real
//                     pairing) or h % num_kv_heads (the reference code, for reproduction);
//   vote_scale (none|sqrt_d) logits in the vote: raw q.k (eq. 7) or scaled by 1/sqrt(d);
//   pool       (0)    max-pool kernel over the vote before the top-k (the release's per-task
//                     smoothing; 0 = off);
//   min_tokens (0)    attend densely while the cache holds fewer tokens than this.
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateTokenSelectPolicy(
    const PolicyConfig& config, const PolicyContext& context);

struct TokenSelectOptions {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  double budget = 1.0;  // fraction of the cached tokens attended when k == 0
  int32_t k = 0;
  int32_t n_init = 128;
  int32_t n_local = 512;
  bool selection_cache = true;
  double theta = 0.9;
  bool gqa_mod = false;
  bool scaled_vote = false;
  int32_t pool = 0;
  int32_t min_tokens = 0;
};

// Counters over every Select call, for tests, benchmarks and docs.
struct TokenSelectStats {
  int64_t calls = 0;          // Select calls (one per layer per forward)
  int64_t dense = 0;          // calls that attended densely (cache within the budget)
  int64_t hits = 0;           // Selection Cache hits
  int64_t misses = 0;         // selections computed (scoring pass over the candidates)
  int64_t keys_total = 0;     // past keys a dense attention would have read
  int64_t keys_attended = 0;  // past keys actually attended
  int64_t scored_keys = 0;    // candidate keys scored on misses
};

// The split of one step's attended set.
struct TokenSelectSplit {
  int32_t n_init = 0;
  int32_t k = 0;
  int32_t n_local = 0;  // includes the new tokens
  int32_t total() const { return n_init + k + n_local; }
};

class TokenSelectSelector : public AttentionSelector {
 public:
  explicit TokenSelectSelector(const TokenSelectOptions& options) : options_(options) {}

  // Where the vote runs: the forward backend's scoring (cache/scoring_backend.h; Select runs
  // between the forward's kernels, when its threads are idle). Results do not depend on it.
  // Without one, Select fails (error()).
  void set_scoring(ScoringBackend* scoring) { scoring_ = scoring; }

  // With k > 0: the paper's fixed n_init + k + n_local. With k == 0: B = floor(budget x
  // tokens) attended tokens, n_init and n_local scaled from the paper's 128 : 2048 : 512 and
  // capped by their params, the rest selected.
  TokenSelectSplit Split(int32_t tokens) const;

  bool Select(int32_t layer, std::span<const float> q, int32_t num_new, int32_t past_slots,
              const SequenceKv& kv, std::vector<int32_t>* slots) override;

  absl::Status error() const override { return error_; }

  const TokenSelectStats& stats() const { return stats_; }
  // The candidate positions selected by the last miss of `layer` (ascending), for tests.
  const std::vector<int32_t>& cached_selection(int32_t layer) const;

  // The soft vote over candidate slots [begin, end) of `layer` for one query (num_heads x
  // head_dim floats): vote[t - begin]. Public for tests and the benchmark.
  std::vector<float> Vote(int32_t layer, std::span<const float> query, int32_t begin,
                          int32_t end, const SequenceKv& kv);

 private:
  struct LayerState {
    bool valid = false;
    std::vector<float> query;       // the query of the last miss, flattened
    std::vector<int32_t> selected;  // its top-k, ascending slots
  };

  TokenSelectOptions options_;
  ScoringBackend* scoring_ = nullptr;
  std::vector<LayerState> layers_;
  TokenSelectStats stats_;
  absl::Status error_;  // the first device error a vote met
};

}  // namespace winnow::cache::policies
