#include "kernels/cpu/attention_scores.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels {
namespace {

// Room for one block's rows in float32, per thread (the f32 path reads the arena directly).
float* BlockScratch(const PagedKvView& kv) {
  thread_local std::vector<float> rows;
  rows.resize(static_cast<size_t>(kv.block_size) * kv.head_dim);
  return rows.data();
}

// scale * q.k_j for j in [0, n) into out, reading keys block by block.
void Logits(const PagedKvView& kv, const int32_t* block_table, int32_t kv_head, const float* q,
            int32_t n, float scale, float* out) {
  const int32_t d = kv.head_dim;
  float* scratch = BlockScratch(kv);
  for (int32_t start = 0; start < n; start += kv.block_size) {
    const int32_t m = std::min(kv.block_size, n - start);
    const float* keys = kv.Rows(kv.Keys(block_table[start / kv.block_size], kv_head), m, scratch);
    ScaledDots(q, keys, m, d, scale, out + start);
  }
}

// max and ln(sum exp(x - max)) + max of x[0, n), in double for the sum so long rows do not lose
// the small terms.
float LogSumExp(const float* x, int32_t n) {
  const float max_value = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int32_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j] - max_value));
  return max_value + static_cast<float>(std::log(sum));
}

}  // namespace

void AttentionProbabilities(const PagedKvView& kv, const ScoreInput& in, float* probs,
                            float* log_normalizer, ThreadPool& pool) {
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int64_t row_floats = int64_t{in.num_heads} * kv.head_dim;
  const int64_t items = int64_t{in.num_heads} * in.num_rows;
  pool.ParallelFor(items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int32_t h = static_cast<int32_t>(item / in.num_rows);
      const int32_t r = static_cast<int32_t>(item % in.num_rows);
      const int32_t visible = in.visible[r];
      float* out = probs + item * in.num_slots;
      const float* q = in.q + r * row_floats + int64_t{h} * kv.head_dim;
      Logits(kv, in.block_table, h / group, q, visible, in.scale, out);
      const float lse = LogSumExp(out, visible);
      for (int32_t j = 0; j < visible; ++j) out[j] = std::exp(out[j] - lse);
      std::fill(out + visible, out + in.num_slots, 0.0f);
      if (log_normalizer != nullptr) log_normalizer[item] = lse;
    }
  });
}

void AccumulateAttentionColumns(const PagedKvView& kv, const ScoreInput& in,
                                float* column_sums, ThreadPool& pool) {
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int64_t row_floats = int64_t{in.num_heads} * d;

  // Pass 1: each (head, row)'s log-normaliser.
  std::vector<float> lse(static_cast<size_t>(in.num_heads) * in.num_rows);
  const int64_t items = int64_t{in.num_heads} * in.num_rows;
  pool.ParallelFor(items, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> logits;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t h = static_cast<int32_t>(item / in.num_rows);
      const int32_t r = static_cast<int32_t>(item % in.num_rows);
      logits.resize(in.visible[r]);
      Logits(kv, in.block_table, h / group, in.q + r * row_floats + int64_t{h} * d,
             in.visible[r], in.scale, logits.data());
      lse[item] = LogSumExp(logits.data(), in.visible[r]);
    }
  });

  // Pass 2: per (KV head, key block), every row's probability on each key; the block's owner
  // is the only writer of those columns.
  int32_t max_visible = 0;
  for (int32_t r = 0; r < in.num_rows; ++r) max_visible = std::max(max_visible, in.visible[r]);
  const int32_t num_key_blocks = (max_visible + kv.block_size - 1) / kv.block_size;
  const int64_t tiles = int64_t{kv.num_kv_heads} * num_key_blocks;
  pool.ParallelFor(tiles, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> block_probs;
    block_probs.resize(kv.block_size);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int32_t g = static_cast<int32_t>(tile / num_key_blocks);
      const int32_t kb = static_cast<int32_t>(tile % num_key_blocks);
      const int32_t start = kb * kv.block_size;
      const int32_t n = std::min(kv.block_size, max_visible - start);
      const float* keys = kv.Rows(kv.Keys(in.block_table[kb], g), n, BlockScratch(kv));
      for (int32_t hh = 0; hh < group; ++hh) {
        const int32_t h = g * group + hh;
        float* col = column_sums + int64_t{h} * in.num_slots + start;
        for (int32_t r = 0; r < in.num_rows; ++r) {
          const int32_t limit = std::min(n, in.visible[r] - start);
          if (limit <= 0) continue;
          const float* q = in.q + r * row_floats + int64_t{h} * d;
          const float row_lse = lse[int64_t{h} * in.num_rows + r];
          // One block's logits, then one vectorised exp over them.
          ScaledDots(q, keys, limit, d, in.scale, block_probs.data());
          vec::ExpShifted(block_probs.data(), limit, row_lse);
          if (in.reduce == ColumnReduce::kMax) {
            for (int32_t j = 0; j < limit; ++j) col[j] = std::max(col[j], block_probs[j]);
          } else {
            for (int32_t j = 0; j < limit; ++j) col[j] += block_probs[j];
          }
        }
      }
    }
  });
}

void ValueNorms(const PagedKvView& kv, const int32_t* block_table, int32_t num_slots,
                float* norms) {
  const int32_t d = kv.head_dim;
  for (int32_t g = 0; g < kv.num_kv_heads; ++g) {
    for (int32_t start = 0; start < num_slots; start += kv.block_size) {
      const int32_t n = std::min(kv.block_size, num_slots - start);
      const float* values =
          kv.Rows(kv.Values(block_table[start / kv.block_size], g), n, BlockScratch(kv));
      for (int32_t j = 0; j < n; ++j) {
        const float* v = values + static_cast<int64_t>(j) * d;
        norms[int64_t{g} * num_slots + start + j] = std::sqrt(Dot(v, v, d));
      }
    }
  }
}

}  // namespace winnow::kernels
