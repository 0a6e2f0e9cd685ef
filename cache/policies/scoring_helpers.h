// Scoring building blocks shared by the policies, so that every policy (and every baseline)
// aggregates, pools, selects and breaks ties the same way and comparisons stay fair.
//
// Conventions: a "score row" is one value per slot; higher means keep. Ties in any top-k go to
// the lower slot index, so runs are reproducible. Results are ascending slot indices.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"
#include "cache/policies/pooling.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::cache::policies {

// Param `name`: "sum" / "mean" / "max".
absl::Status ReadGroupAggregation(const PolicyConfig& config, const std::string& name,
                                  GroupAggregation* field);

// Param `name`: "none" / "avg" / "max".
absl::Status ReadPooling(const PolicyConfig& config, const std::string& name, Pooling* field);

// The parameter groups several policies share, read into their options fields (the fields'
// values are the defaults):
//   window, min_window, max_window  ObservationWindow's arguments;
//   kernel, pooling, gqa            SnapKV's 1-D pooling of the scores and the GQA fold;
//   selection (per_head|shared)     one keep set per KV head, or one per layer.
absl::Status ReadWindowParams(const PolicyConfig& config, int32_t* window, int32_t* min_window,
                              int32_t* max_window);
absl::Status ReadPoolingParams(const PolicyConfig& config, int32_t* kernel, Pooling* pooling,
                               GroupAggregation* aggregation);
absl::Status ReadSelection(const PolicyConfig& config, bool* shared_selection);

// Slots kept for `budget` of `n` tokens: floor(budget * n) (a tiny epsilon absorbs float error),
// at least 1 and at most n. budget 1 keeps everything.
int32_t KeepCount(double budget, int32_t n);

// Per query head, the sum over observed rows [row_begin, row_end) of their probabilities:
// out[h * num_slots + j]. With `mean`, each column is divided by the number of those rows
// that can see key j (causal), so keys inside the window are not penalised for seeing fewer
// queries. Without row probabilities (ObservationRequest::row_probabilities false) only the
// plain sum over every row is available (window_sums); anything else is zeros.
std::vector<float> SumObservedRows(const ObservationAttention& attention, int32_t row_begin,
                                   int32_t row_end, bool mean,
                                   kernels::ThreadPool* threads = nullptr);

// Folds per-query-head score rows ([num_heads][n]) into per-KV-head rows ([num_kv_heads][n]).
std::vector<float> AggregateGroups(std::span<const float> per_query_head, int32_t num_heads,
                                   int32_t num_kv_heads, int32_t n, GroupAggregation agg);

// Mean over every head of per-head rows ([num_rows][n] -> [n]): layer-level scores.
std::vector<float> MeanOverHeads(std::span<const float> rows, int32_t num_rows, int32_t n);

// 1-D pooling with stride 1 and padding kernel/2 on both sides, as SnapKV's avg_pool1d /
// max_pool1d (avg counts padding as zeros, like PyTorch's default). Even kernels are widened
// to the next odd size so the output stays aligned with the input. kernel <= 1: copy.
std::vector<float> Pool1d(std::span<const float> scores, int32_t kernel, Pooling pooling);

// Pool1d of the first `prefix` scores of every row of `rows` ([num_rows][n]): [num_rows][prefix].
// With `threads`, the rows are split over the pool.
std::vector<float> PoolRowPrefixes(std::span<const float> rows, int32_t num_rows, int32_t n,
                                   int32_t prefix, int32_t kernel, Pooling pooling,
                                   kernels::ThreadPool* threads = nullptr);

// Scales a non-negative row to sum 1 (all-zero rows stay zero).
void NormalizeSum(std::span<float> scores);

// The `k` best slots among `candidates` (ascending slot ids) by `scores` (indexed by slot),
// ties to the lower slot; returned ascending. k >= candidates.size() returns them all.
std::vector<int32_t> TopK(std::span<const float> scores, std::span<const int32_t> candidates,
                          int32_t k);

// Ascending slots of size min(k, n): every `forced` slot (ascending, < n) first, then the best
// of the rest by `scores` (length n). If forced alone exceeds k, the forced slots closest to the
// end win (the recent window matters more than the oldest forced entries) — callers that want
// otherwise pass fewer forced slots.
std::vector<int32_t> TopKWithForced(std::span<const float> scores, int32_t n,
                                    std::span<const int32_t> forced, int32_t k);

// TopKWithForced, but every pick brings its neighbours: the best remaining slot by `scores`,
// then those at distance 1, 2, ..., `radius` from it (at each distance the one after, then the
// one before; slots already kept are skipped), until k slots are kept. A value stated over
// several tokens (the digits of a number) then survives whole when the scorer keeps one of its
// tokens or the key before it. radius 0 is TopKWithForced.
// With `share` < 1 only the first share x (k - forced) slots come from widened picks; the
// rest are single picks (the best remaining slots).
std::vector<int32_t> TopKWithNeighbours(std::span<const float> scores, int32_t n,
                                        std::span<const int32_t> forced, int32_t k,
                                        int32_t radius, double share = 1.0);

// Sinks + recent window as forced slots for a prompt of n tokens: [0, sinks) and [n - window,
// n), ascending, deduplicated.
std::vector<int32_t> SinksAndWindow(int32_t n, int32_t sinks, int32_t window);

// One layer's keep set when every KV head picks its own top-k by its own score row:
// kv_scores is [num_kv_heads][n]; forced slots are kept in every head. With `threads`, the
// heads are split over the pool.
// With `neighbours` > 0, each head's picks are TopKWithNeighbours'.
LayerKeep PerHeadTopK(std::span<const float> kv_scores, int32_t num_kv_heads, int32_t n,
                      std::span<const int32_t> forced, int32_t k,
                      kernels::ThreadPool* threads = nullptr, int32_t neighbours = 0,
                      double neighbour_share = 1.0);

// fn(h) for every h in [0, count): split over `threads` when it is given (the policy's idle
// forward pool, CompressionPolicy::threads()), in order on the calling thread otherwise. Each
// call must write only its own head's outputs.
void ForEachHead(kernels::ThreadPool* threads, int32_t count,
                 const std::function<void(int32_t)>& fn);

// One layer's keep set shared by every KV head (layer-level selection).
LayerKeep SharedTopK(std::span<const float> scores, int32_t num_kv_heads, int32_t n,
                     std::span<const int32_t> forced, int32_t k);

// SharedTopK when `shared_selection`, else PerHeadTopK (scores then per KV head).
LayerKeep SelectTopK(bool shared_selection, std::span<const float> scores, int32_t num_kv_heads,
                     int32_t n, std::span<const int32_t> forced, int32_t k);

// The per-layer step of a plan: `select(layer, scores[layer])` gives the layer's keep set, or
// nullopt when the layer keeps every slot; each layer's scores are released once it is done.
// All layers untouched: the empty plan.
using SelectLayer =
    std::function<std::optional<LayerKeep>(int32_t layer, std::span<const float> scores)>;
KeepPlan PlanPerLayer(std::vector<std::vector<float>>& scores, const SelectLayer& select);

// SteadyStateSlots of a request its policy leaves whole: every layer keeps the prompt (at least
// one slot) and everything generated.
int64_t KeepAllSlots(int32_t layers, int32_t prompt_tokens, int32_t generated);

// FailedPrecondition naming the first layer whose observed[layer] is 0: Plan() came before
// every ObserveLayer.
absl::Status CheckEveryLayerObserved(const std::string& policy, std::span<const char> observed);

// InternalError unless the observation is of a layer in [0, dims.num_layers) over the prompt's
// `num_tokens` slots with `rows` observed rows (rows < 0: any count).
absl::Status CheckObservation(const std::string& policy, const ObservationAttention& attention,
                              const ModelDims& dims, int32_t num_tokens, int32_t rows);

// InternalError unless the observation carries every-row column sums (num_heads x num_slots),
// which a policy asking for accumulate_all_rows relies on.
absl::Status CheckColumnSums(const std::string& policy, const ObservationAttention& attention);

// Reorders per-slot state (e.g. accumulated H2O scores, [num_kv_heads][num_slots]) the way a
// plan reorders a layer's slots: out[h][i] = in[h][layer.heads[h][i]], merged entries summing
// their sources. A untouched layer is returned unchanged.
std::vector<float> ApplyLayerKeepToSlotValues(const LayerKeep& layer, std::span<const float> in,
                                              int32_t num_kv_heads, int32_t num_slots);

// PyramidKV's per-layer budgets (KVCache-Factory PyramidKVCluster): `mean_budget` slots per
// layer on average, of which `window` are the observation window; lower layers keep more,
// linearly, with beta = 20 setting the smallest/largest ratio. Falls back to uniform when the
// constraints fail. Each entry is clamped to [1, n]; the sum stays <= num_layers * mean_budget.
std::vector<int32_t> PyramidBudgets(int32_t num_layers, int32_t n, int32_t mean_budget,
                                    int32_t window, double beta);

}  // namespace winnow::cache::policies
