// A composable eviction policy: one budget allocator over layers x one token scorer x keep or
// merge, each chosen by an option, so that the papers' ideas can be measured apart and combined
// (issue 15; docs/compression.md, "composite"). Runs once after the last prefill chunk (or after
// a lookahead's first reply tokens); no decode-time eviction.
//
//   allocation  how the request's slots are split over layers:
//     uniform        the same count in every layer (SnapKV);
//     pyramid        linear from the first layer down (PyramidKV, beta);
//     global         XKV's global top-N over every layer's normalised scores: a layer gets the
//                    tokens whose share of its own importance beats the other layers';
//     neediest       AdaKV's head-adaptive budget as the paged cache allows it: each KV head's
//                    scores normalised to sum 1, a layer's c-th slot worth its heads' largest
//                    c-th best, one ranking over every layer (NeediestHeadShares);
//     sparsity       VL-Cache's density 1 - sparsity (threshold p x row max), water-filled so the
//                    whole budget is spent (the paper's clip loses what is above a full layer);
//     strength_skew  AirCache's Eq. 11 on this scorer's scores: half the mass the window puts on
//                    the candidates, half the right skew of their scores.
//   scorer      what a token's score is:
//     window         the observed rows' summed attention (SnapKV, XKV; post-span rows with spans);
//     accumulated    every prompt row's summed attention (H2O's column sums);
//     hybrid         both, each normalised to sum 1 over the keys before the window, added;
//   value_norm  true: each score is multiplied by the L2 norm of the key's value vector (a token
//               attended to but carrying a small value adds little to the output: VATP).
//   kernel / pooling / gqa  1-D pooling of each query head's scores, then the fold into KV heads.
//   neighbours  r > 0: each kept token brings the r tokens on either side of it, from the same
//               budget (fewer, wider picks: TopKWithNeighbours), so that a value spread over
//               several tokens is kept whole.
//   neighbour_share  with neighbours: the share of the candidate budget that widened picks may
//               take (the best picks first); the rest goes to single picks. 0.5 keeps a needle's
//               digits and most of a summary's spread (docs/experiments/compression-needle.md).
//   lookahead   N > 0: the plan waits for the reply's first N tokens, decoded on the whole
//               prompt, and their attention joins the observed rows' (CompressionPolicy::
//               LookaheadSteps); they are kept.
//   merge       false: evicted tokens are dropped; true: each joins the nearest kept scored
//               token, whose K and V become the mean of its group (Elastic Cache's merge, with
//               the sinks, window and kept text absorbing nothing).
//   mass_merge  true: each evicted token whose key's cosine with a kept scored token's is at
//               least mass_merge_similarity joins the most similar one, which keeps its key,
//               takes the group's values weighted by the observed rows' attention and gains
//               log(group mass / its own) as a logit bias, so those rows' attention mass and
//               output survive the eviction (KeepKV-style; the compaction does it,
//               cache/compaction.h); the other evicted tokens are dropped. Needs a pool with
//               logit biases (the CPU worker's); not with merge. Lowers KL on documents and
//               retrieval, but loses exact lookups (docs/experiments/mass-merge.md).
//
// What is always kept (counted in the budget): the first max(sinks, sink_frac x per-layer
// budget) tokens and the observed rows (the window shrinks when they do not fit); in span mode
// with evict_text=false, every text token too (AirCache's rule: only image/context spans are
// evicted). `full_layers` first layers keep everything, paid from the others. Everything else
// is a candidate. budget is, as for every policy, the fraction of the prompt's tokens kept on
// average over layers.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

struct CompositeOptions {
  enum class Allocation { kUniform, kPyramid, kGlobal, kNeediest, kSparsity, kStrengthSkew };
  enum class Scorer { kWindow, kAccumulated, kHybrid };

  Allocation allocation = Allocation::kGlobal;
  Scorer scorer = Scorer::kWindow;
  int32_t window = 32;       // observed rows without spans (the last `window` tokens)
  int32_t min_window = 1;    // with spans: the text after the last span, clamped to these
  int32_t max_window = 256;
  bool post_span = true;     // false: the last `window` tokens even when there are spans
  int32_t sinks = 4;
  double sink_frac = 0.0;    // sinks = max(sinks, sink_frac x the per-layer budget)
  int32_t full_layers = 0;   // the first full_layers layers are not compressed (paid from the rest)
  int32_t kernel = 7;
  Pooling pooling = Pooling::kMax;
  GroupAggregation aggregation = GroupAggregation::kMean;
  bool normalize = false;    // accumulated: divide a key's sum by the rows that saw it
  bool evict_text = true;    // with spans: false keeps every text token
  bool merge = false;
  bool mass_merge = false;
  double mass_merge_similarity = 0.8;  // the least key cosine at which an evicted token merges
  bool value_norm = false;   // weight each key's score by ||v|| of its KV head (VATP)
  int32_t neighbours = 0;    // each kept token brings this many on either side
  double neighbour_share = 1.0;  // of the candidate budget, what widened picks may take
  int32_t lookahead = 0;     // decode steps whose attention joins the window's before the plan
  double beta = 20.0;        // pyramid: largest / smallest layer
  double p = 0.01;           // sparsity: the threshold, a fraction of the row max
};

absl::StatusOr<CompositeOptions> ParseCompositeOptions(const PolicyConfig& config);

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateCompositePolicy(
    const PolicyConfig& config, const PolicyContext& context);

// `winnowkv`: the composite preset that held up best over both task families (retrieval and
// real documents) at budget 0.1: global allocation, 32 observed rows, average pooling over 7,
// 4 sinks (docs/experiments/policy-search.md), and half the candidate budget for picks that
// bring 8 neighbours either side, so that a value the reply reads token by token is kept whole
// (docs/experiments/compression-needle.md). A client's params override it.
const PolicyParams& WinnowKvPreset();
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateWinnowKvPolicy(
    const PolicyConfig& config, const PolicyContext& context);

// `winnowkv_docs`: the preset for documents with an open-ended instruction (summaries,
// overviews): the hybrid scorer (every prompt row's attention plus the window's) weighted by
// value norms, no pooling, 30% of the budget on the prompt's start. Best measured on real
// documents at 0.1, but it loses short needles that pooling keeps together, so it is not the
// all-round default (docs/experiments/compression-documents.md).
const PolicyParams& WinnowKvDocsPreset();
absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateWinnowKvDocsPolicy(
    const PolicyConfig& config, const PolicyContext& context);

}  // namespace winnow::cache::policies
