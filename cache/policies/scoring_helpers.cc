#include "cache/policies/scoring_helpers.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace winnow::cache::policies {

absl::Status ReadGroupAggregation(const PolicyConfig& config, const std::string& name,
                                  GroupAggregation* field) {
  return config.ReadChoice<GroupAggregation>(
      name, field,
      {{"sum", GroupAggregation::kSum}, {"mean", GroupAggregation::kMean},
       {"max", GroupAggregation::kMax}});
}

absl::Status ReadPooling(const PolicyConfig& config, const std::string& name, Pooling* field) {
  return config.ReadChoice<Pooling>(
      name, field, {{"none", Pooling::kNone}, {"avg", Pooling::kAvg}, {"max", Pooling::kMax}});
}

absl::Status ReadWindowParams(const PolicyConfig& config, int32_t* window, int32_t* min_window,
                              int32_t* max_window) {
  WINNOW_RETURN_IF_ERROR(config.ReadInt("window", window, 1, 1 << 16));
  WINNOW_RETURN_IF_ERROR(config.ReadInt("min_window", min_window, 1, 1 << 16));
  *max_window = std::max(*max_window, *min_window);
  return config.ReadInt("max_window", max_window, *min_window, 1 << 16);
}

absl::Status ReadPoolingParams(const PolicyConfig& config, int32_t* kernel, Pooling* pooling,
                               GroupAggregation* aggregation) {
  WINNOW_RETURN_IF_ERROR(config.ReadInt("kernel", kernel, 1, 1 << 10));
  WINNOW_RETURN_IF_ERROR(ReadPooling(config, "pooling", pooling));
  return ReadGroupAggregation(config, "gqa", aggregation);
}

absl::Status ReadSelection(const PolicyConfig& config, bool* shared_selection) {
  return config.ReadChoice<bool>("selection", shared_selection,
                                 {{"per_head", false}, {"shared", true}});
}

KeepPlan PlanPerLayer(std::vector<std::vector<float>>& scores, const SelectLayer& select) {
  KeepPlan plan;
  plan.layers.resize(scores.size());
  for (size_t l = 0; l < scores.size(); ++l) {
    std::optional<LayerKeep> keep = select(static_cast<int32_t>(l), scores[l]);
    if (keep.has_value()) plan.layers[l] = *std::move(keep);
    std::vector<float>().swap(scores[l]);
  }
  if (plan.empty()) plan.layers.clear();
  return plan;
}

int64_t KeepAllSlots(int32_t layers, int32_t prompt_tokens, int32_t generated) {
  return int64_t{layers} * (std::max(prompt_tokens, 1) + int64_t{generated});
}

absl::Status CheckEveryLayerObserved(const std::string& policy, std::span<const char> observed) {
  for (size_t l = 0; l < observed.size(); ++l) {
    if (!observed[l]) {
      return absl::FailedPreconditionError(
          absl::StrCat(policy, ": layer ", l, " was never observed"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckObservation(const std::string& policy, const ObservationAttention& attention,
                              const ModelDims& dims, int32_t num_tokens, int32_t rows) {
  if (attention.layer < 0 || attention.layer >= dims.num_layers ||
      attention.num_slots != num_tokens || (rows >= 0 && attention.num_rows != rows)) {
    return absl::InternalError(absl::StrCat(policy, ": unexpected observation of layer ",
                                            attention.layer, " (", attention.num_rows, " rows, ",
                                            attention.num_slots, " slots)"));
  }
  return absl::OkStatus();
}

absl::Status CheckColumnSums(const std::string& policy, const ObservationAttention& attention) {
  if (attention.column_sums.size() !=
      static_cast<size_t>(attention.num_heads) * attention.num_slots) {
    return absl::InternalError(absl::StrCat(policy, ": column sums missing from the observation"));
  }
  return absl::OkStatus();
}

int32_t KeepCount(double budget, int32_t n) {
  if (n <= 0) return 0;
  const double kept = std::floor(budget * n + 1e-6);
  return static_cast<int32_t>(std::clamp<double>(kept, 1.0, n));
}

void ForEachHead(kernels::ThreadPool* threads, int32_t count,
                 const std::function<void(int32_t)>& fn) {
  if (threads == nullptr || count < 2) {
    for (int32_t h = 0; h < count; ++h) fn(h);
    return;
  }
  threads->ParallelFor(count, 1, [&fn](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) fn(static_cast<int32_t>(h));
  });
}

std::vector<float> SumObservedRows(const ObservationAttention& attention, int32_t row_begin,
                                   int32_t row_end, bool mean, kernels::ThreadPool* threads) {
  const int32_t n = attention.num_slots;
  std::vector<float> out(static_cast<size_t>(attention.num_heads) * n, 0.0f);
  row_begin = std::max(row_begin, 0);
  row_end = std::min(row_end, attention.num_rows);
  if (attention.probs.empty()) {
    // The machinery summed every row already (ObservationRequest::row_probabilities false);
    // a partial or mean sum needs the rows, which such a policy must not ask for.
    if (row_begin == 0 && row_end == attention.num_rows && !mean &&
        attention.window_sums.size() == out.size()) {
      out.assign(attention.window_sums.begin(), attention.window_sums.end());
    }
    return out;
  }
  ForEachHead(threads, attention.num_heads, [&](int32_t h) {
    float* dst = out.data() + int64_t{h} * n;
    for (int32_t r = row_begin; r < row_end; ++r) {
      std::span<const float> row = attention.Row(h, r);
      const int32_t visible = std::min(n, attention.row_positions[r] + 1);
      for (int32_t j = 0; j < visible; ++j) dst[j] += row[j];
    }
    if (!mean) return;
    for (int32_t j = 0; j < n; ++j) {
      int32_t seen_by = 0;
      for (int32_t r = row_begin; r < row_end; ++r) seen_by += attention.row_positions[r] >= j;
      if (seen_by > 0) dst[j] /= static_cast<float>(seen_by);
    }
  });
  return out;
}

std::vector<float> AggregateGroups(std::span<const float> per_query_head, int32_t num_heads,
                                   int32_t num_kv_heads, int32_t n, GroupAggregation agg) {
  const int32_t group = num_heads / num_kv_heads;
  std::vector<float> out(static_cast<size_t>(num_kv_heads) * n, 0.0f);
  for (int32_t g = 0; g < num_kv_heads; ++g) {
    float* dst = out.data() + int64_t{g} * n;
    for (int32_t hh = 0; hh < group; ++hh) {
      const float* src = per_query_head.data() + int64_t{g * group + hh} * n;
      for (int32_t j = 0; j < n; ++j) {
        dst[j] = (agg == GroupAggregation::kMax && hh > 0) ? std::max(dst[j], src[j])
                                                            : dst[j] + src[j];
      }
    }
    if (agg == GroupAggregation::kMean) {
      for (int32_t j = 0; j < n; ++j) dst[j] /= static_cast<float>(group);
    }
  }
  return out;
}

std::vector<float> MeanOverHeads(std::span<const float> rows, int32_t num_rows, int32_t n) {
  std::vector<float> out(n, 0.0f);
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t j = 0; j < n; ++j) out[j] += rows[int64_t{r} * n + j];
  }
  if (num_rows > 0) {
    for (float& v : out) v /= static_cast<float>(num_rows);
  }
  return out;
}

std::vector<float> Pool1d(std::span<const float> scores, int32_t kernel, Pooling pooling) {
  const int32_t n = static_cast<int32_t>(scores.size());
  if (kernel <= 1 || pooling == Pooling::kNone) return {scores.begin(), scores.end()};
  const int32_t half = kernel / 2;
  const int32_t width = 2 * half + 1;
  std::vector<float> out(n);
  for (int32_t j = 0; j < n; ++j) {
    const int32_t lo = std::max(0, j - half);
    const int32_t hi = std::min(n - 1, j + half);
    if (pooling == Pooling::kMax) {
      out[j] = *std::max_element(scores.begin() + lo, scores.begin() + hi + 1);
    } else {
      double sum = 0.0;
      for (int32_t i = lo; i <= hi; ++i) sum += scores[i];
      out[j] = static_cast<float>(sum / width);
    }
  }
  return out;
}

std::vector<float> PoolRowPrefixes(std::span<const float> rows, int32_t num_rows, int32_t n,
                                   int32_t prefix, int32_t kernel, Pooling pooling,
                                   kernels::ThreadPool* threads) {
  std::vector<float> pooled(static_cast<size_t>(num_rows) * prefix);
  ForEachHead(threads, num_rows, [&](int32_t r) {
    const std::vector<float> row = Pool1d(rows.subspan(int64_t{r} * n, prefix), kernel, pooling);
    std::copy(row.begin(), row.end(), pooled.begin() + int64_t{r} * prefix);
  });
  return pooled;
}

void NormalizeSum(std::span<float> scores) {
  double sum = 0.0;
  for (float v : scores) sum += v;
  if (sum <= 0.0) return;
  const float inv = static_cast<float>(1.0 / sum);
  for (float& v : scores) v *= inv;
}

std::vector<int32_t> TopK(std::span<const float> scores, std::span<const int32_t> candidates,
                          int32_t k) {
  std::vector<int32_t> picked(candidates.begin(), candidates.end());
  if (k >= static_cast<int32_t>(picked.size())) return picked;
  if (k <= 0) return {};
  auto better = [&scores](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  };
  std::nth_element(picked.begin(), picked.begin() + k, picked.end(), better);
  picked.resize(k);
  std::sort(picked.begin(), picked.end());
  return picked;
}

std::vector<int32_t> TopKWithForced(std::span<const float> scores, int32_t n,
                                    std::span<const int32_t> forced, int32_t k) {
  k = std::clamp(k, 0, n);
  if (static_cast<int32_t>(forced.size()) >= k) {
    return std::vector<int32_t>(forced.end() - k, forced.end());
  }
  std::vector<char> is_forced(n, 0);
  for (int32_t slot : forced) is_forced[slot] = 1;
  std::vector<int32_t> candidates;
  candidates.reserve(n - forced.size());
  for (int32_t j = 0; j < n; ++j) {
    if (!is_forced[j]) candidates.push_back(j);
  }
  std::vector<int32_t> picked =
      TopK(scores, candidates, k - static_cast<int32_t>(forced.size()));
  picked.insert(picked.end(), forced.begin(), forced.end());
  std::sort(picked.begin(), picked.end());
  return picked;
}

std::vector<int32_t> TopKWithNeighbours(std::span<const float> scores, int32_t n,
                                        std::span<const int32_t> forced, int32_t k,
                                        int32_t radius, double share) {
  k = std::clamp(k, 0, n);
  if (radius <= 0 || static_cast<int32_t>(forced.size()) >= k) {
    return TopKWithForced(scores, n, forced, k);
  }
  std::vector<char> kept(n, 0);
  int32_t count = 0;
  auto keep = [&](int32_t j) {
    if (j < 0 || j >= n || kept[j] || count >= k) return;
    kept[j] = 1;
    ++count;
  };
  for (int32_t slot : forced) keep(slot);
  std::vector<int32_t> order;
  order.reserve(n);
  for (int32_t j = 0; j < n; ++j) {
    if (!kept[j]) order.push_back(j);
  }
  // Best first, ties to the lower slot (TopK's order).
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  const int32_t widen_until =
      count + static_cast<int32_t>(std::lround(std::clamp(share, 0.0, 1.0) * (k - count)));
  for (int32_t c : order) {
    if (count >= k) break;
    keep(c);
    for (int32_t d = 1; d <= radius && count < std::min(k, widen_until); ++d) {
      keep(c + d);
      keep(c - d);
    }
  }
  std::vector<int32_t> out;
  out.reserve(count);
  for (int32_t j = 0; j < n; ++j) {
    if (kept[j]) out.push_back(j);
  }
  return out;
}

std::vector<int32_t> SinksAndWindow(int32_t n, int32_t sinks, int32_t window) {
  std::vector<int32_t> out;
  const int32_t sink_end = std::clamp(sinks, 0, n);
  const int32_t window_begin = std::clamp(n - window, 0, n);
  for (int32_t j = 0; j < sink_end; ++j) out.push_back(j);
  for (int32_t j = std::max(window_begin, sink_end); j < n; ++j) out.push_back(j);
  return out;
}

LayerKeep PerHeadTopK(std::span<const float> kv_scores, int32_t num_kv_heads, int32_t n,
                      std::span<const int32_t> forced, int32_t k, kernels::ThreadPool* threads,
                      int32_t neighbours, double neighbour_share) {
  LayerKeep keep;
  keep.heads.resize(num_kv_heads);
  ForEachHead(threads, num_kv_heads, [&](int32_t g) {
    keep.heads[g] =
        TopKWithNeighbours(kv_scores.subspan(int64_t{g} * n, n), n, forced, k, neighbours,
                           neighbour_share);
  });
  return keep;
}

LayerKeep SharedTopK(std::span<const float> scores, int32_t num_kv_heads, int32_t n,
                     std::span<const int32_t> forced, int32_t k) {
  LayerKeep keep;
  keep.heads.assign(num_kv_heads, TopKWithForced(scores, n, forced, k));
  return keep;
}

LayerKeep SelectTopK(bool shared_selection, std::span<const float> scores, int32_t num_kv_heads,
                     int32_t n, std::span<const int32_t> forced, int32_t k) {
  return shared_selection ? SharedTopK(scores, num_kv_heads, n, forced, k)
                          : PerHeadTopK(scores, num_kv_heads, n, forced, k);
}

std::vector<float> ApplyLayerKeepToSlotValues(const LayerKeep& layer, std::span<const float> in,
                                              int32_t num_kv_heads, int32_t num_slots) {
  if (layer.untouched()) return {in.begin(), in.end()};
  const int32_t kept = layer.kept();
  std::vector<float> out(static_cast<size_t>(num_kv_heads) * kept, 0.0f);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const float* src = in.data() + int64_t{h} * num_slots;
    float* dst = out.data() + int64_t{h} * kept;
    const bool merged = !layer.merge.empty() && !layer.merge[h].empty();
    for (int32_t i = 0; i < kept; ++i) {
      if (!merged) {
        dst[i] = src[layer.heads[h][i]];
        continue;
      }
      for (int32_t s : layer.merge[h][i]) dst[i] += src[s];
    }
  }
  return out;
}

std::vector<int32_t> PyramidBudgets(int32_t num_layers, int32_t n, int32_t mean_budget,
                                    int32_t window, double beta) {
  std::vector<int32_t> out(num_layers, std::clamp(mean_budget, 1, std::max(n, 1)));
  if (num_layers < 2 || mean_budget >= n || mean_budget <= window) return out;
  // KVCache-Factory: B - w spread linearly from max_num (layer 0) to min_num (last layer).
  const int64_t b = mean_budget - window;
  int64_t min_num = static_cast<int64_t>(b / beta);
  int64_t max_num = 2 * b - min_num;
  if (max_num >= n - window) {
    max_num = n - window;
    min_num = 2 * b - max_num;
  }
  if (min_num < 0 || max_num < min_num) return out;
  const int64_t steps = (max_num - min_num) / (num_layers - 1);
  int64_t total = 0;
  for (int32_t l = 0; l < num_layers; ++l) {
    out[l] = static_cast<int32_t>(std::clamp<int64_t>(max_num - l * steps + window, 1, n));
    total += out[l];
  }
  // The integer step rounds down, which would leave the pyramid slightly above the uniform
  // total; take the excess from the largest (lowest) layers so the budget is never exceeded.
  const int64_t target = int64_t{num_layers} * mean_budget;
  for (int32_t l = 0; total > target; l = (l + 1) % num_layers) {
    if (out[l] > 1) {
      --out[l];
      --total;
    }
  }
  return out;
}

}  // namespace winnow::cache::policies
