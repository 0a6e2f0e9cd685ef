#include "cache/policies/layer_budget_split.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>

#include "base/status_macros.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

EvictableSplit SplitEvictable(const PromptLayout& layout, WindowRange window,
                              bool window_evictable) {
  EvictableSplit split;
  split.span_mode = layout.HasCompressibleSpans();
  const int32_t n = layout.num_tokens;
  std::vector<char> evictable(n, 0);
  if (split.span_mode) {
    for (const PromptSpan& span : layout.spans) {
      if (!PromptLayout::IsCompressibleKind(span.kind)) continue;
      for (int32_t p = span.begin; p < std::min(span.end, window.begin); ++p) evictable[p] = 1;
    }
  } else {
    const int32_t end = window_evictable ? n : window.begin;
    std::fill(evictable.begin(), evictable.begin() + std::clamp(end, 0, n), 1);
  }
  for (int32_t p = 0; p < n; ++p) {
    (evictable[p] ? split.evictable : split.always_kept).push_back(p);
  }
  return split;
}

EvictableSplit SplitBeforeWindow(const PromptLayout& layout, WindowRange window) {
  EvictableSplit split;
  split.span_mode = layout.HasCompressibleSpans();
  const int32_t n = layout.num_tokens;
  const int32_t begin = std::clamp(window.begin, 0, n);
  for (int32_t p = 0; p < n; ++p) (p < begin ? split.evictable : split.always_kept).push_back(p);
  return split;
}

absl::Status ReadBudgetBase(const PolicyConfig& config, BudgetBase* field) {
  return config.ReadChoice<BudgetBase>(
      "budget_of", field, {{"prompt", BudgetBase::kPrompt}, {"spans", BudgetBase::kSpans}});
}

int64_t SpanModeCap(double budget, BudgetBase base, int32_t layers, int32_t num_tokens,
                    const EvictableSplit& split) {
  const int64_t evictable = static_cast<int64_t>(split.evictable.size());
  int64_t cap = 0;
  if (base == BudgetBase::kSpans) {
    cap = static_cast<int64_t>(std::floor(budget * layers * evictable + 1e-6));
  } else {
    const int64_t kept_text = num_tokens - evictable;
    cap = int64_t{layers} * (KeepCount(budget, num_tokens) - kept_text);
  }
  return std::clamp<int64_t>(cap, 0, int64_t{layers} * evictable);
}

std::vector<double> WaterFill(std::span<const double> weights, double total, double lo,
                              double hi) {
  const size_t n = weights.size();
  std::vector<double> out(n, 0.0);
  if (n == 0) return out;
  hi = std::max(hi, lo);
  double remaining = std::clamp(total, lo * n, hi * n);
  // 0 = free, 1 = fixed. Upper clamps are settled first: fixing a layer at `hi` only raises the
  // others, and fixing at `lo` afterwards only lowers them, so neither phase undoes the other.
  std::vector<char> fixed(n, 0);
  for (int phase = 0; phase < 2; ++phase) {
    for (size_t round = 0; round <= n; ++round) {
      double weight_sum = 0.0;
      size_t free_count = 0;
      for (size_t i = 0; i < n; ++i) {
        if (fixed[i]) continue;
        weight_sum += std::max(weights[i], 0.0);
        ++free_count;
      }
      if (free_count == 0) break;
      bool clamped = false;
      for (size_t i = 0; i < n; ++i) {
        if (fixed[i]) continue;
        out[i] = weight_sum > 0.0 ? remaining * std::max(weights[i], 0.0) / weight_sum
                                  : remaining / static_cast<double>(free_count);
      }
      for (size_t i = 0; i < n; ++i) {
        if (fixed[i]) continue;
        const bool violates = phase == 0 ? out[i] > hi : out[i] < lo;
        if (!violates) continue;
        out[i] = phase == 0 ? hi : lo;
        fixed[i] = 1;
        remaining -= out[i];
        clamped = true;
      }
      if (!clamped) break;
    }
  }
  return out;
}

std::vector<int32_t> SpillPastWindows(std::vector<int32_t> counts, const ModelDims& dims,
                                      int32_t n, int32_t floor) {
  int64_t excess = 0;
  std::vector<int32_t> open;  // full-attention layers that can keep more
  for (int32_t l = 0; l < static_cast<int32_t>(counts.size()); ++l) {
    const int32_t read = dims.WindowOf(l) - 1;  // past slots a sliding layer's next token reads
    if (dims.WindowOf(l) == 0) {
      if (counts[l] < n) open.push_back(l);
      continue;
    }
    if (read <= 0 || read >= n) continue;
    // The layer's share of the prompt, applied to what it reads.
    const int64_t share = (int64_t{counts[l]} * read + n - 1) / n;
    const int32_t keep =
        static_cast<int32_t>(std::min<int64_t>(read, std::max<int64_t>(floor, share)));
    if (counts[l] > keep) {
      excess += counts[l] - keep;
      counts[l] = keep;
    }
  }
  if (excess == 0 || open.empty()) return counts;
  std::vector<double> weights;
  int64_t total = excess;
  for (int32_t l : open) {
    weights.push_back(counts[l]);
    total += counts[l];
  }
  const std::vector<int32_t> spilled =
      RoundBudgets(WaterFill(weights, static_cast<double>(total), 0.0, n), total, 0, n);
  for (size_t i = 0; i < open.size(); ++i) counts[open[i]] = spilled[i];
  return counts;
}

std::vector<int32_t> RoundBudgets(std::span<const double> targets, int64_t cap, int32_t lo,
                                  int32_t hi) {
  const size_t n = targets.size();
  std::vector<int32_t> out(n, 0);
  if (n == 0) return out;
  hi = std::max(hi, lo);
  double clamped_sum = 0.0;
  int64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double t = std::clamp(targets[i], static_cast<double>(lo), static_cast<double>(hi));
    clamped_sum += t;
    // The epsilon keeps 2.9999999 (a product that should be 3) from flooring to 2.
    out[i] = static_cast<int32_t>(std::clamp<double>(std::floor(t + 1e-9), lo, hi));
    sum += out[i];
  }
  const int64_t want = std::min<int64_t>(cap, static_cast<int64_t>(std::floor(clamped_sum + 1e-6)));
  if (sum < want) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto frac = [&](size_t i) { return std::clamp<double>(targets[i], lo, hi) - out[i]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return frac(a) > frac(b); });
    for (size_t k = 0; k < n && sum < want; ++k) {
      if (out[order[k]] < hi) {
        ++out[order[k]];
        ++sum;
      }
    }
  }
  while (sum > cap) {
    size_t best = n;
    for (size_t i = n; i-- > 0;) {
      if (out[i] > lo && (best == n || out[i] > out[best])) best = i;
    }
    if (best == n) break;  // every layer is at its floor
    --out[best];
    --sum;
  }
  return out;
}

std::vector<double> RankedShares(const std::vector<std::vector<float>>& candidates,
                                 int64_t picks, double per_slot) {
  const int32_t layers = static_cast<int32_t>(candidates.size());
  std::vector<double> targets(layers, 0.0);
  std::vector<float> all;
  for (const std::vector<float>& layer : candidates) {
    all.insert(all.end(), layer.begin(), layer.end());
  }
  if (picks <= 0 || all.empty()) return targets;
  const int64_t k = std::min<int64_t>(picks, static_cast<int64_t>(all.size()));
  std::nth_element(all.begin(), all.begin() + (k - 1), all.end(), std::greater<float>());
  const float threshold = all[k - 1];
  std::vector<int64_t> above(layers, 0), at(layers, 0);
  int64_t above_total = 0, at_total = 0;
  for (int32_t l = 0; l < layers; ++l) {
    for (const float score : candidates[l]) {
      above[l] += score > threshold;
      at[l] += score == threshold;
    }
    above_total += above[l];
    at_total += at[l];
  }
  const double tie_share =
      at_total > 0 ? static_cast<double>(k - above_total) / static_cast<double>(at_total) : 0.0;
  for (int32_t l = 0; l < layers; ++l) targets[l] += (above[l] + tie_share * at[l]) / per_slot;
  return targets;
}

std::vector<double> NeediestHeadShares(const std::vector<std::vector<float>>& head_scores,
                                       int32_t num_heads, int64_t picks) {
  std::vector<std::vector<float>> candidates(head_scores.size());
  std::vector<float> sorted;
  for (size_t l = 0; l < head_scores.size(); ++l) {
    const int64_t m = static_cast<int64_t>(head_scores[l].size()) / num_heads;
    candidates[l].assign(m, 0.0f);
    sorted.resize(m);
    for (int32_t g = 0; g < num_heads; ++g) {
      const auto row = head_scores[l].begin() + g * m;
      std::copy(row, row + m, sorted.begin());
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      for (int64_t c = 0; c < m; ++c) candidates[l][c] = std::max(candidates[l][c], sorted[c]);
    }
  }
  return RankedShares(candidates, picks, 1.0);
}

int64_t SplitBudgetPolicy::SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const {
  const int64_t layers = dims().num_layers;
  const int64_t kept_text = std::max<int64_t>(
      min_text_, prompt_tokens - static_cast<int64_t>(split_.evictable.size()));
  return layers * kept_text + cap_ + layers * generated;
}

absl::Status SplitBudgetPolicy::BeginObservation(const ObservationAttention& attention,
                                                 int32_t rows) {
  WINNOW_RETURN_IF_ERROR(CheckObservation(name(), attention, dims(), layout().num_tokens, rows));
  observed_[attention.layer] = 1;
  return absl::OkStatus();
}

}  // namespace winnow::cache::policies
