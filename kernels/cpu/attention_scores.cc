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

// Overwrites x[0, n) with exp(x - max) and returns ln(sum exp(x)) (the log-normaliser) and
// the sum of the exponentials it wrote. One vectorised exp pass (ExpShifted's polynomial, ~1
// ulp) and a float sum over several accumulators: every term is <= 1 and rows are at most the
// model's context long, so the sum's relative error stays ~1e-6.
struct ExpSum {
  float log_normalizer;
  float sum;
};
ExpSum ExpShiftedInPlace(float* x, int32_t n) {
  float max_value = x[0];
  for (int32_t j = 1; j < n; ++j) max_value = std::max(max_value, x[j]);
  vec::ExpShifted(x, n, max_value);
  const float sum = vec::Sum(x, n);
  return {max_value + std::log(sum), sum};
}

// Query rows that share each key block's conversion to float32.
constexpr int32_t kRowChunk = 8;

// Logits of rows [r0, r0 + rows) for the query heads of KV head g: out(hh, rr)[j] =
// scale * q.k_j for j < visible[r0 + rr], hh the head's index within the group. Each key
// block is converted to float32 once for every (head, row) of the chunk.
template <typename RowOut>
void ChunkLogits(const PagedKvView& kv, const ScoreInput& in, int32_t g, int32_t r0,
                 int32_t rows, RowOut out) {
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int64_t row_floats = int64_t{in.num_heads} * d;
  const int32_t visible = *std::max_element(in.visible + r0, in.visible + r0 + rows);
  for (int32_t start = 0; start < visible; start += kv.block_size) {
    const int32_t m = std::min(kv.block_size, visible - start);
    const float* keys =
        kv.Rows(kv.Keys(in.block_table[start / kv.block_size], g), m, BlockScratch(kv));
    for (int32_t hh = 0; hh < group; ++hh) {
      const int32_t h = g * group + hh;
      for (int32_t rr = 0; rr < rows; ++rr) {
        const int32_t limit = std::min(m, in.visible[r0 + rr] - start);
        if (limit <= 0) continue;
        ScaledDots(in.q + (r0 + rr) * row_floats + int64_t{h} * d, keys, limit, d, in.scale,
                   out(hh, rr) + start);
        kv.AddBias(in.block_table[start / kv.block_size], g, 0, limit, out(hh, rr) + start);
      }
    }
  }
}

}  // namespace

void AttentionProbabilities(const PagedKvView& kv, const ScoreInput& in, float* probs,
                            float* log_normalizer, ThreadPool& pool) {
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int32_t row_chunks = (in.num_rows + kRowChunk - 1) / kRowChunk;
  pool.ParallelFor(int64_t{kv.num_kv_heads} * row_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int32_t g = static_cast<int32_t>(item / row_chunks);
      const int32_t r0 = static_cast<int32_t>(item % row_chunks) * kRowChunk;
      const int32_t rows = std::min(kRowChunk, in.num_rows - r0);
      auto row_probs = [&](int32_t hh, int32_t rr) {
        return probs + (int64_t{g * group + hh} * in.num_rows + r0 + rr) * in.num_slots;
      };
      ChunkLogits(kv, in, g, r0, rows, row_probs);
      for (int32_t hh = 0; hh < group; ++hh) {
        for (int32_t rr = 0; rr < rows; ++rr) {
          const int32_t visible = in.visible[r0 + rr];
          float* out = row_probs(hh, rr);
          const ExpSum e = ExpShiftedInPlace(out, visible);
          const float inverse_sum = 1.0f / e.sum;
          for (int32_t j = 0; j < visible; ++j) out[j] *= inverse_sum;
          std::fill(out + visible, out + in.num_slots, 0.0f);
          if (log_normalizer != nullptr) {
            log_normalizer[int64_t{g * group + hh} * in.num_rows + r0 + rr] = e.log_normalizer;
          }
        }
      }
    }
  });
}

void AccumulateAttentionColumns(const PagedKvView& kv, const ScoreInput& in,
                                float* column_sums, ThreadPool& pool) {
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int64_t row_floats = int64_t{in.num_heads} * d;

  // Pass 1: each (head, row)'s log-normaliser, rows in chunks (ChunkLogits).
  std::vector<float> lse(static_cast<size_t>(in.num_heads) * in.num_rows);
  const int32_t row_chunks = (in.num_rows + kRowChunk - 1) / kRowChunk;
  pool.ParallelFor(int64_t{kv.num_kv_heads} * row_chunks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> logits;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t g = static_cast<int32_t>(item / row_chunks);
      const int32_t r0 = static_cast<int32_t>(item % row_chunks) * kRowChunk;
      const int32_t rows = std::min(kRowChunk, in.num_rows - r0);
      const int32_t visible = *std::max_element(in.visible + r0, in.visible + r0 + rows);
      logits.resize(static_cast<size_t>(group) * rows * visible);
      auto row_logits = [&](int32_t hh, int32_t rr) {
        return logits.data() + (int64_t{hh} * rows + rr) * visible;
      };
      ChunkLogits(kv, in, g, r0, rows, row_logits);
      for (int32_t hh = 0; hh < group; ++hh) {
        for (int32_t rr = 0; rr < rows; ++rr) {
          lse[int64_t{g * group + hh} * in.num_rows + r0 + rr] =
              ExpShiftedInPlace(row_logits(hh, rr), in.visible[r0 + rr]).log_normalizer;
        }
      }
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
          kv.AddBias(in.block_table[kb], g, 0, limit, block_probs.data());
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
