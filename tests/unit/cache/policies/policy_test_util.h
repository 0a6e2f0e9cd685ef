// Shared fixture for policy tests on constructed attention patterns: an observation built from
// per-(head, row, key) logits exactly as the scoring kernel would hand it to a policy, and a
// driver that runs a policy over one such pattern per layer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/policies/policy.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies::policy_testing {

// One layer's observation built from logits: probs are the causal softmax of logit(h, r, j)
// over j <= row position, exactly what the scoring kernel hands a policy.
struct FakeLayer {
  int32_t layer = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t n = 0;
  std::vector<int32_t> positions;
  std::vector<float> probs;
  std::vector<float> log_normalizer;

  ObservationAttention View() const {
    ObservationAttention a;
    a.layer = layer;
    a.num_heads = heads;
    a.num_kv_heads = kv_heads;
    a.num_rows = static_cast<int32_t>(positions.size());
    a.num_slots = n;
    a.row_positions = positions;
    a.probs = probs;
    a.log_normalizer = log_normalizer;
    return a;
  }
};

using LogitFn = std::function<double(int32_t h, int32_t row_position, int32_t j)>;

inline FakeLayer MakeLayer(int32_t layer, int32_t heads, int32_t kv_heads, int32_t n,
                    int32_t window_begin, const LogitFn& logit) {
  FakeLayer f{layer, heads, kv_heads, n, {}, {}, {}};
  for (int32_t p = window_begin; p < n; ++p) f.positions.push_back(p);
  const int32_t rows = n - window_begin;
  f.probs.assign(static_cast<size_t>(heads) * rows * n, 0.0f);
  f.log_normalizer.assign(static_cast<size_t>(heads) * rows, 0.0f);
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t pos = f.positions[r];
      double mx = -1e300;
      for (int32_t j = 0; j <= pos; ++j) mx = std::max(mx, logit(h, pos, j));
      double sum = 0.0;
      for (int32_t j = 0; j <= pos; ++j) sum += std::exp(logit(h, pos, j) - mx);
      for (int32_t j = 0; j <= pos; ++j) {
        f.probs[(static_cast<size_t>(h) * rows + r) * n + j] =
            static_cast<float>(std::exp(logit(h, pos, j) - mx) / sum);
      }
      f.log_normalizer[static_cast<size_t>(h) * rows + r] = static_cast<float>(mx + std::log(sum));
    }
  }
  return f;
}

inline PolicyContext Context(int32_t layers, int32_t heads, int32_t kv_heads, int32_t n,
                      std::vector<PromptSpan> spans) {
  PolicyContext c;
  c.dims = ModelDims{layers, heads, kv_heads, 8, 16};
  c.layout.num_tokens = n;
  c.layout.spans = std::move(spans);
  return c;
}

// Runs a policy over per-layer logit functions and returns its plan.
inline KeepPlan RunPolicy(CompressionPolicy& policy, const PolicyContext& c,
                   const std::vector<LogitFn>& layers) {
  const int32_t begin = policy.Observation().window_begin;
  for (int32_t l = 0; l < c.dims.num_layers; ++l) {
    FakeLayer f = MakeLayer(l, c.dims.num_heads, c.dims.num_kv_heads, c.layout.num_tokens,
                            begin, layers[l]);
    EXPECT_TRUE(policy.ObserveLayer(f.View()).ok());
  }
  absl::StatusOr<KeepPlan> plan = policy.Plan();
  EXPECT_TRUE(plan.ok()) << plan.status();
  const int32_t n = c.layout.num_tokens;
  EXPECT_TRUE(plan->Validate(c.dims, [n](int32_t) { return n; }).ok());
  return *plan;
}

// Unstructured attention: deterministic pseudo-random logits in [0, scale).
inline LogitFn RandomLogits(uint32_t seed, double scale) {
  return [seed, scale](int32_t h, int32_t pos, int32_t j) {
    const uint32_t x = (seed ^ (h * 7919u) ^ (pos * 104729u) ^ (j * 15485863u)) * 2654435761u;
    return (x % 1000) / 1000.0 * scale;
  };
}

// One random pattern per layer, later layers sharper.
inline std::vector<LogitFn> RandomLayers(std::mt19937& rng, int32_t layers) {
  std::vector<LogitFn> fns;
  for (int32_t l = 0; l < layers; ++l) fns.push_back(RandomLogits(rng(), 1.0 + 3.0 * l));
  return fns;
}

inline bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::binary_search(v.begin(), v.end(), x);
}

// Checks that every compressed layer's every head keeps all positions outside the spans
// (`in_span`), and sums the plan over layers: span slots kept and all slots kept (an untouched
// layer keeps all n).
struct PlanTotals {
  int64_t span = 0;
  int64_t slots = 0;
};
inline PlanTotals ExpectTextKept(const KeepPlan& plan, int32_t layers, int32_t n,
                                 const std::function<bool(int32_t)>& in_span) {
  int32_t span_tokens = 0;
  for (int32_t p = 0; p < n; ++p) span_tokens += in_span(p);
  PlanTotals totals;
  for (int32_t l = 0; l < layers; ++l) {
    if (plan.layers.empty() || plan.layers[l].untouched()) {
      totals.span += span_tokens;
      totals.slots += n;
      continue;
    }
    for (const std::vector<int32_t>& head : plan.layers[l].heads) {
      for (int32_t p = 0; p < n; ++p) {
        if (!in_span(p)) {
          EXPECT_TRUE(Contains(head, p)) << "layer " << l << ": text position " << p;
        }
      }
    }
    totals.span += plan.layers[l].kept() - (n - span_tokens);
    totals.slots += plan.layers[l].kept();
  }
  return totals;
}

// A modality-aware policy whose `budget` is a fraction of the whole prompt (`params` select
// that): on random prompts with one context span it keeps every text token and, summed over
// layers, at most L x max(KeepCount(budget, n), text) slots: the text is paid first.
inline void ExpectPromptBudgetCountsKeptText(
    const std::string& policy_name, const PolicyParams& params) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 60 + static_cast<int32_t>(rng() % 60);
    const int32_t a = 4, b = a + 30 + static_cast<int32_t>(rng() % 20);
    const PolicyContext c = Context(3, 4, 2, n, {{SpanKind::kContext, a, b}});
    const double budget = 0.05 + 0.9 * (rng() % 1000) / 1000.0;
    absl::StatusOr<std::unique_ptr<CompressionPolicy>> policy =
        CreatePolicy(policy_name, PolicyConfig(budget, params), c);
    ASSERT_TRUE(policy.ok()) << policy.status();
    const KeepPlan plan = RunPolicy(**policy, c, RandomLayers(rng, 3));
    const int32_t text = n - (b - a);
    const int64_t slots =
        ExpectTextKept(plan, 3, n, [&](int32_t p) { return p >= a && p < b; }).slots;
    EXPECT_LE(slots, 3 * std::max(KeepCount(budget, n), text))
        << "budget " << budget << ", n " << n << ", text " << text;
    EXPECT_LE(slots, (*policy)->SteadyStateSlots(n, 0));
  }
}

}  // namespace winnow::cache::policies::policy_testing
