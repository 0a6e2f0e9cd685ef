// XKV (Li et al., "Personalized KV Cache Memory Reduction for Long-Context LLM Inference").
// Each layer scores the prefix tokens SnapKV-style (the last `window` prompt rows' attention,
// averaged, average-pooled); per-layer budgets come from the global top-N over every layer's
// sum-normalised scores (Algorithm 1's greedy, exactly), which maximises the mean importance
// retention ratio R_avg under the total budget; each KV head then keeps its own top n_l prefix
// tokens plus the window. Profile mode (the paper's online mode) reuses the averaged allocation
// of earlier requests of the same category. Decisions: docs/compression.md "## xkv".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

struct XkvOptions {
  int32_t window = 8;   // observation window ows (kept)
  int32_t kernel = 7;   // pooling size ps
  Pooling pooling = Pooling::kAvg;
  GroupAggregation aggregation = GroupAggregation::kMean;
  int32_t min_per_layer = 0;  // prefix tokens every layer keeps regardless (paper: none)
  double r_target = 0.0;      // > 0: Eq. 18, the fewest tokens reaching R_avg >= r_target
  bool profile = false;       // mode=profile: reuse the category's averaged allocation
  int64_t category = 0;
  int32_t profile_warmup = 8;   // the first requests of a category are always profiled
  double profile_rate = 0.1;    // afterwards, this share of them (deterministic: every 1/rate-th)
};

// Params: window, kernel, pooling (none|avg|max), gqa (sum|mean|max), min_per_layer, r_target,
// mode (request|profile), category, profile_warmup, profile_rate.
absl::StatusOr<XkvOptions> ParseXkvOptions(const PolicyConfig& config);

struct XkvAllocation {
  std::vector<int32_t> counts;  // [layer] prefix tokens kept
  double r_avg = 0.0;           // mean over layers of the kept share of normalised importance
};

// Algorithm 1 as the global top-N: `scores` is [layer][prefix], each layer summing to 1 (or all
// zero). Every layer first gets its min(min_per_layer, prefix, budget / layers) best tokens; the
// rest of `budget` goes to the largest remaining normalised scores over all layers, ties to the
// lower layer. With r_target > 0 it stops as soon as R_avg >= r_target (Eq. 18), never above
// `budget`.
XkvAllocation XkvAllocate(std::span<const float> scores, int32_t layers, int32_t prefix,
                          int64_t budget, int32_t min_per_layer, double r_target);

// The profile store behind mode=profile: per (category, layer count), the running mean of the
// allocations of sampled requests, as fractions of their total (prompt lengths differ, so
// counts would not transfer). Process-wide and thread-safe.
class XkvProfileStore {
 public:
  static XkvProfileStore& Global();

  // Called once per request at planning time. True: this request is sampled, runs the
  // per-request allocation and Record()s it. False: it reuses Average().
  bool ShouldProfile(int64_t category, int32_t layers, int32_t warmup, double rate);
  void Record(int64_t category, std::span<const int32_t> counts);
  // Mean fractions over the recorded samples; nullopt before the first.
  std::optional<std::vector<double>> Average(int64_t category, int32_t layers) const;
  int64_t Samples(int64_t category, int32_t layers) const;
  void Clear();  // tests

 private:
  struct Entry {
    int64_t planned = 0;       // requests that reached ShouldProfile
    int64_t samples = 0;       // recorded allocations
    std::vector<double> sum;   // [layer] sum of fractions
  };
  static std::string Key(int64_t category, int32_t layers);

  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_;
};

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreateXkvPolicy(const PolicyConfig& config,
                                                                    const PolicyContext& context);

}  // namespace winnow::cache::policies
