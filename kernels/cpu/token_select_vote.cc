#include "kernels/cpu/token_select_vote.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/simd.h"

namespace winnow::kernels {
namespace {

constexpr int32_t kChunk = 512;

// The candidates in fixed chunks of kChunk, run over the pool or on the calling thread.
struct Chunks {
  int32_t n = 0;
  int32_t count = 0;
  ThreadPool* threads = nullptr;

  int32_t begin(int64_t c) const { return static_cast<int32_t>(c) * kChunk; }
  int32_t end(int64_t c) const { return std::min(n, begin(c) + kChunk); }
  void Run(const std::function<void(int64_t, int64_t)>& fn) const {
    if (threads != nullptr && count > 1) {
      threads->ParallelFor(count, 1, fn);
    } else {
      fn(0, count);
    }
  }
};

// Pass 1: every head's logits over the candidates, each key row read once for every query
// head of its group; returns each head's maximum.
std::vector<float> Logits(const PagedKvView& kv, std::span<const int32_t> table,
                          std::span<const float> query, int32_t num_heads, int32_t first,
                          float scale, bool gqa_mod, const Chunks& chunks, float* logits) {
  const int32_t num_kv = kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int32_t n = chunks.n;
  std::vector<std::vector<int32_t>> heads_of_kv(num_kv);
  for (int32_t h = 0; h < num_heads; ++h) {
    heads_of_kv[gqa_mod ? h % num_kv : h / (num_heads / num_kv)].push_back(h);
  }
  std::vector<float> chunk_max(static_cast<size_t>(chunks.count) * num_heads);
  chunks.Run([&](int64_t c_begin, int64_t c_end) {
    std::vector<float> key_row(d);  // a key converted to float32 (unused for f32 pools)
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int32_t t0 = chunks.begin(c);
      const int32_t t1 = chunks.end(c);
      for (int32_t g = 0; g < num_kv; ++g) {
        for (int32_t t = t0; t < t1; ++t) {
          const int32_t slot = first + t;
          const float* key = kv.Row(kv.Keys(table[slot / kv.block_size], g),
                                    slot % kv.block_size, key_row.data());
          for (int32_t h : heads_of_kv[g]) {
            logits[static_cast<int64_t>(h) * n + t] =
                Dot(query.data() + static_cast<int64_t>(h) * d, key, d) * scale;
          }
        }
      }
      for (int32_t h = 0; h < num_heads; ++h) {
        const float* row = logits + static_cast<int64_t>(h) * n;
        chunk_max[c * num_heads + h] = *std::max_element(row + t0, row + t1);
      }
    }
  });
  std::vector<float> max_logit(num_heads, -std::numeric_limits<float>::infinity());
  for (int32_t c = 0; c < chunks.count; ++c) {
    for (int32_t h = 0; h < num_heads; ++h) {
      max_logit[h] = std::max(max_logit[h], chunk_max[c * num_heads + h]);
    }
  }
  return max_logit;
}

// Pass 2: exponentials in place (fp32), partial sums in double: at long contexts single
// probabilities are tiny and a float sum of ~1e5 of them drops the small ones (the paper's
// release, in bf16, drops more). Returns each head's 1 / sum.
std::vector<float> Exponentiate(std::span<const float> max_logit, const Chunks& chunks,
                                float* logits) {
  const int32_t num_heads = static_cast<int32_t>(max_logit.size());
  std::vector<double> chunk_sum(static_cast<size_t>(chunks.count) * num_heads);
  chunks.Run([&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      for (int32_t h = 0; h < num_heads; ++h) {
        float* row = logits + static_cast<int64_t>(h) * chunks.n;
        double sum = 0.0;
        for (int32_t t = chunks.begin(c); t < chunks.end(c); ++t) {
          row[t] = std::exp(row[t] - max_logit[h]);
          sum += row[t];
        }
        chunk_sum[c * num_heads + h] = sum;
      }
    }
  });
  std::vector<float> inv_sum(num_heads);
  for (int32_t h = 0; h < num_heads; ++h) {
    double sum = 0.0;
    for (int32_t c = 0; c < chunks.count; ++c) sum += chunk_sum[c * num_heads + h];
    inv_sum[h] = static_cast<float>(1.0 / sum);
  }
  return inv_sum;
}

}  // namespace

void TokenSelectVote(const PagedKvView& kv, std::span<const int32_t> table,
                     std::span<const float> query, int32_t num_heads, int32_t begin, int32_t end,
                     float scale, bool gqa_mod, float* vote, std::vector<float>* logits,
                     ThreadPool* threads) {
  const int32_t n = end - begin;
  const Chunks chunks{n, (n + kChunk - 1) / kChunk, threads};
  logits->resize(static_cast<size_t>(num_heads) * n);
  const std::vector<float> max_logit =
      Logits(kv, table, query, num_heads, begin, scale, gqa_mod, chunks, logits->data());
  const std::vector<float> inv_sum = Exponentiate(max_logit, chunks, logits->data());
  // Pass 3, TokenSelect's eq. 7: each head's softmax over the candidates, summed over heads.
  chunks.Run([&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      for (int32_t h = 0; h < num_heads; ++h) {
        const float* row = logits->data() + static_cast<int64_t>(h) * n;
        for (int32_t t = chunks.begin(c); t < chunks.end(c); ++t) vote[t] += row[t] * inv_sum[h];
      }
    }
  });
}

}  // namespace winnow::kernels
