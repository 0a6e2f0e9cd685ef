#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels {
namespace {

struct WorkItem {
  int32_t sequence;
  int32_t token;  // index among the sequence's new tokens of the first of `count`
  int32_t count;
  int32_t kv_head;
};

// The first slot new token `token` sees: 0, or with a window the oldest slot inside it.
int32_t FirstVisible(const AttentionSequence& seq, int32_t token) {
  const int32_t last = seq.num_slots - seq.num_new + token;
  return seq.window > 0 ? std::max(0, last + 1 - seq.window) : 0;
}

// The slots new token `token` attends to, as a list, for the sparse path: the selected past slots
// then the new tokens up to itself, without those before its window.
void SparseVisible(const AttentionSequence& seq, int32_t token, std::vector<int32_t>& slots) {
  const int32_t past = seq.num_slots - seq.num_new;
  const int32_t first = FirstVisible(seq, token);
  slots.clear();
  for (int32_t j = 0; j < seq.num_selected; ++j) {
    if (seq.selected[j] >= first) slots.push_back(seq.selected[j]);
  }
  for (int32_t i = 0; i <= token; ++i) {
    if (past + i >= first) slots.push_back(past + i);
  }
}

// o[i] += Σ_j s[j] * rows[j][i] for j < n, each element summed in j order with one fused
// multiply-add per term, exactly as n calls of Axpy would; the output stays in registers across
// the rows instead of making a load and a store per row.
void WeightedRowSum(const float* s, const float* rows, int32_t n, int32_t head_dim, float* o) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int kVecs = 8;  // 64 floats of output per pass
  int32_t c = 0;
  for (; c + 8 * kVecs <= head_dim; c += 8 * kVecs) {
    __m256 acc[kVecs];
    for (int v = 0; v < kVecs; ++v) acc[v] = _mm256_loadu_ps(o + c + 8 * v);
    for (int32_t j = 0; j < n; ++j) {
      const __m256 w = _mm256_set1_ps(s[j]);
      const float* row = rows + static_cast<int64_t>(j) * head_dim + c;
      for (int v = 0; v < kVecs; ++v) {
        acc[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * v), acc[v]);
      }
    }
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(o + c + 8 * v, acc[v]);
  }
  if (c == head_dim) return;
  for (int32_t j = 0; j < n; ++j) {
    Axpy(s[j], rows + static_cast<int64_t>(j) * head_dim + c, o + c, head_dim - c);
  }
#else
  for (int32_t j = 0; j < n; ++j) {
    Axpy(s[j], rows + static_cast<int64_t>(j) * head_dim, o, head_dim);
  }
#endif
}

// Σ x[j] for j < n in double, in 8 interleaved lanes (a serial sum waits on each add): lane k
// takes the terms j ≡ k (mod 8) of the whole groups of 8, then c_k = lane_k + lane_(k+4) are
// added as (c0 + c1) + (c2 + c3), then the tail in order. One arithmetic with or without AVX2.
double SumAsDouble(const float* x, int32_t n) {
  int32_t j = 0;
  double sum;
#if defined(__AVX2__) && defined(__FMA__)
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; j + 8 <= n; j += 8) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm_loadu_ps(x + j)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4)));
  }
  double c[4];
  _mm256_storeu_pd(c, _mm256_add_pd(lo, hi));
  sum = (c[0] + c[1]) + (c[2] + c[3]);
#else
  double lane[8] = {};
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += x[j + k];
  }
  double c[4];
  for (int k = 0; k < 4; ++k) c[k] = lane[k] + lane[k + 4];
  sum = (c[0] + c[1]) + (c[2] + c[3]);
#endif
  for (; j < n; ++j) sum += x[j];
  return sum;
}

// max of x[0, n), n >= 1, in 8 lanes (std::max_element waits on each compare; a max is exact in
// any order).
float MaxOf(const float* x, int32_t n) {
  int32_t j = 0;
  float best = x[0];
#if defined(__AVX2__) && defined(__FMA__)
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(x);
    for (j = 8; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    best = *std::max_element(lanes, lanes + 8);
  }
#endif
  for (; j < n; ++j) best = std::max(best, x[j]);
  return best;
}

// Query tokens of one sequence that share each K/V block's conversion to float32 (dense path).
constexpr int32_t kTokenTile = 8;

// Attention of `count` consecutive new tokens (token0 ..) of one sequence, each for the query
// heads that share `kv_head` (a GQA group). Two passes over the visible keys: scores and their
// max, then exp-weights applied to V. Each key and value block is converted to float32 once for
// all the tokens and heads (into `rows`, max(block_size, 8) x head_dim floats, unused for
// f32). `slots` (sparse path, count = 1) lists the visible slots; when null, slots
// [first, visible) are (first = 0 without a window). Every output is the same sum in the same
// order whatever the dtype, the tile or the loop nesting, so a token's result depends only on
// its own inputs. `scores` holds count x group x (visible of the last token) floats, indexed by
// slot.
class TokenTile {
 public:
  TokenTile(const PagedKvView& kv, const AttentionSequence& seq, int32_t token0, int32_t count,
            int32_t kv_head, int32_t group, const float* q, int64_t q_stride, float* out,
            const std::vector<int32_t>* slots, std::vector<float>& scores, float* rows,
            float* fold)
      : kv_(kv), seq_(seq), token0_(token0), count_(count), kv_head_(kv_head), group_(group),
        q_(q), q_stride_(q_stride), out_(out), slots_(slots), rows_(rows), fold_(fold),
        max_visible_(VisibleOf(count - 1)),
        stride_(int64_t{group} * max_visible_) {
    scores.resize(static_cast<size_t>(count * stride_));
    scores_ = scores.data();
  }

  void Attend(float scale, int32_t num_heads) {
    if (slots_ != nullptr) {
      ScoreSelected(scale);
    } else {
      ScoreBlocks(scale);
    }
    Softmax();
    if (slots_ != nullptr) {
      WeighSelected();
    } else {
      WeighBlocks();
    }
    if (seq_.probs != nullptr) RecordProbabilities(num_heads);
    if (fold_ != nullptr) FoldProbabilities();
  }

 private:
  int32_t VisibleOf(int32_t t) const {
    return slots_ != nullptr ? static_cast<int32_t>(slots_->size())
                             : seq_.num_slots - seq_.num_new + token0_ + t + 1;
  }
  // The first visible entry of token t's scores (the sparse path lists only visible slots).
  int32_t FirstOf(int32_t t) const {
    return slots_ != nullptr ? 0 : FirstVisible(seq_, token0_ + t);
  }
  float* ScoreRow(int32_t t, int32_t g) const {
    return scores_ + t * stride_ + int64_t{g} * max_visible_;
  }
  const float* Query(int32_t t, int32_t g) const {
    return q_ + t * q_stride_ + int64_t{g} * kv_.head_dim;
  }
  float* Output(int32_t t, int32_t g) const {
    return out_ + t * q_stride_ + int64_t{g} * kv_.head_dim;
  }
  int32_t BlockOf(int32_t slot) const { return seq_.block_table[slot / kv_.block_size]; }
  const std::byte* KeyBlock(int32_t slot) const { return kv_.Keys(BlockOf(slot), kv_head_); }
  const std::byte* ValueBlock(int32_t slot) const {
    return kv_.Values(seq_.block_table[slot / kv_.block_size], kv_head_);
  }

  // Sparse path: eight keys at a time, each converted into its own row of `rows`, so that
  // every dot is the dense path's arithmetic.
  void ScoreSelected(float scale) {
    const int32_t head_dim = kv_.head_dim;
    for (int32_t j = 0; j < max_visible_; j += 8) {
      const int32_t n = std::min(8, max_visible_ - j);
      const float* keys[8];
      for (int32_t k = 0; k < n; ++k) {
        const int32_t slot = (*slots_)[j + k];
        keys[k] = kv_.Row(KeyBlock(slot), slot % kv_.block_size, rows_ + int64_t{k} * head_dim);
      }
      for (int32_t g = 0; g < group_; ++g) {
        float* logits = ScoreRow(0, g) + j;
        ScaledDotsUpTo8(Query(0, g), keys, n, head_dim, scale, logits);
        for (int32_t k = 0; k < n; ++k) {
          const int32_t slot = (*slots_)[j + k];
          kv_.AddBias(BlockOf(slot), kv_head_, slot % kv_.block_size,
                      slot % kv_.block_size + 1, logits + k);
        }
      }
    }
  }

  // The blocks from the one holding the tile's first visible slot; token t scores the slots
  // [lo, hi) of each that it sees.
  void ScoreBlocks(float scale) {
    const int32_t bs = kv_.block_size;
    for (int32_t start = FirstOf(0) / bs * bs; start < max_visible_; start += bs) {
      const int32_t n = std::min(bs, max_visible_ - start);
      const float* keys = kv_.Rows(KeyBlock(start), n, rows_);
      for (int32_t t = 0; t < count_; ++t) {
        const int32_t lo = std::max(start, FirstOf(t));
        const int32_t hi = std::min(start + n, VisibleOf(t));
        if (hi <= lo) continue;
        for (int32_t g = 0; g < group_; ++g) {
          ScaledDots(Query(t, g), keys + int64_t{lo - start} * kv_.head_dim, hi - lo,
                     kv_.head_dim, scale, ScoreRow(t, g) + lo);
          kv_.AddBias(BlockOf(start), kv_head_, lo - start, hi - start, ScoreRow(t, g) + lo);
        }
      }
    }
  }

  // Softmax weights, normalised in place; the outputs zeroed for the weighted sums.
  void Softmax() {
    for (int32_t t = 0; t < count_; ++t) {
      const int32_t visible = VisibleOf(t) - FirstOf(t);
      for (int32_t g = 0; g < group_; ++g) {
        float* s = ScoreRow(t, g) + FirstOf(t);
        const float max_score = MaxOf(s, visible);
        vec::ExpShifted(s, visible, max_score);
        const float inv_sum = static_cast<float>(1.0 / SumAsDouble(s, visible));
        for (int32_t j = 0; j < visible; ++j) s[j] *= inv_sum;
        std::fill(Output(t, g), Output(t, g) + kv_.head_dim, 0.0f);
      }
    }
  }

  void WeighSelected() {
    for (int32_t j = 0; j < max_visible_; ++j) {
      const int32_t slot = (*slots_)[j];
      const float* value = kv_.Row(ValueBlock(slot), slot % kv_.block_size, rows_);
      for (int32_t g = 0; g < group_; ++g) {
        Axpy(ScoreRow(0, g)[j], value, Output(0, g), kv_.head_dim);
      }
    }
  }

  void WeighBlocks() {
    const int32_t bs = kv_.block_size;
    for (int32_t start = FirstOf(0) / bs * bs; start < max_visible_; start += bs) {
      const int32_t n = std::min(bs, max_visible_ - start);
      const float* values = kv_.Rows(ValueBlock(start), n, rows_);
      for (int32_t t = 0; t < count_; ++t) {
        const int32_t lo = std::max(start, FirstOf(t));
        const int32_t hi = std::min(start + n, VisibleOf(t));
        if (hi <= lo) continue;
        for (int32_t g = 0; g < group_; ++g) {
          WeightedRowSum(ScoreRow(t, g) + lo, values + int64_t{lo - start} * kv_.head_dim,
                         hi - lo, kv_.head_dim, Output(t, g));
        }
      }
    }
  }

  // The weights as the sequence's attention probabilities (this work item is the only writer
  // of its (token, head) rows).
  void RecordProbabilities(int32_t num_heads) {
    for (int32_t t = 0; t < count_; ++t) {
      for (int32_t g = 0; g < group_; ++g) {
        const int32_t h = kv_head_ * group_ + g;
        const float* s = ScoreRow(t, g);
        float* p =
            seq_.probs + (static_cast<int64_t>(token0_ + t) * num_heads + h) * seq_.num_slots;
        for (int32_t j = FirstOf(t); j < VisibleOf(t); ++j) {
          p[slots_ != nullptr ? (*slots_)[j] : j] = s[j];
        }
      }
    }
  }

  // The weights of the tokens from seq_.fold_from on, added to (or maxed into) this tile's
  // stripe of the sequence's column fold, token by token in order.
  void FoldProbabilities() {
    for (int32_t t = std::max(0, seq_.fold_from - token0_); t < count_; ++t) {
      for (int32_t g = 0; g < group_; ++g) {
        const float* s = ScoreRow(t, g);
        float* column = fold_ + int64_t{kv_head_ * group_ + g} * seq_.num_slots;
        for (int32_t j = FirstOf(t); j < VisibleOf(t); ++j) {
          float& c = column[slots_ != nullptr ? (*slots_)[j] : j];
          c = seq_.fold_reduce == ColumnReduce::kMax ? std::max(c, s[j]) : c + s[j];
        }
      }
    }
  }

  const PagedKvView& kv_;
  const AttentionSequence& seq_;
  const int32_t token0_, count_, kv_head_, group_;
  const float* q_;
  const int64_t q_stride_;
  float* out_;
  const std::vector<int32_t>* slots_;
  float* rows_;
  float* fold_;  // null, or the stripe of the column fold this tile adds to (head 0's column)
  const int32_t max_visible_;
  const int64_t stride_;  // the scores of token t start at t * stride_
  float* scores_ = nullptr;
};

// Scratch of one thread of PagedAttention.
struct AttendScratch {
  std::vector<float> scores;
  std::vector<int32_t> slots;
  std::vector<float> rows;
};

// One work item: `count` tokens from `token` of one sequence, for one KV head's query heads;
// `fold` as TokenTile's.
void AttendItem(const PagedKvView& kv, const AttentionSequence& seq, const WorkItem& item,
                int32_t num_heads, const float* q, float scale, float* out, float* fold,
                AttendScratch& scratch) {
  const int32_t group = num_heads / kv.num_kv_heads;
  const int64_t row_floats = static_cast<int64_t>(num_heads) * kv.head_dim;
  const int64_t row = seq.first_row + item.token;
  const int64_t head_offset = static_cast<int64_t>(item.kv_head) * group * kv.head_dim;
  const bool sparse = seq.selected != nullptr;
  if (sparse) SparseVisible(seq, item.token, scratch.slots);
  scratch.rows.resize(static_cast<size_t>(std::max(kv.block_size, 8)) * kv.head_dim);
  TokenTile(kv, seq, item.token, item.count, item.kv_head, group,
            q + row * row_floats + head_offset, row_floats, out + row * row_floats + head_offset,
            sparse ? &scratch.slots : nullptr, scratch.scores, scratch.rows.data(), fold)
      .Attend(scale, num_heads);
}

// What PagedAttention runs on one thread at a time: a folding sequence's token tiles of one
// stripe and KV head, in order (the stripe's only writer), or every T-th of the other items.
struct Unit {
  int32_t sequence = -1;  // >= 0: a fold unit of this sequence
  int32_t stripe = 0;     // fold unit: its stripe; otherwise the lane
  int32_t kv_head = 0;
};

// The sparse path has a slot list per token; it takes its tokens one at a time.
int32_t TileOf(const AttentionSequence& seq) {
  return seq.selected != nullptr ? 1 : kTokenTile;
}

// One PagedAttention call's work: the items of the sequences that do not fold, the units the
// threads run, and each folding sequence's stripes (zeroed).
struct Schedule {
  std::vector<WorkItem> items;
  int32_t lanes = 0;
  std::vector<Unit> units;
  std::vector<std::vector<float>> stripes;  // [sequence]

  Schedule(std::span<const AttentionSequence> sequences, int32_t num_kv_heads,
           int32_t num_heads, int32_t num_threads)
      : stripes(sequences.size()) {
    for (int32_t s = 0; s < static_cast<int32_t>(sequences.size()); ++s) {
      const AttentionSequence& seq = sequences[s];
      const int32_t tile = TileOf(seq);
      if (seq.column_fold != nullptr) {
        stripes[s].assign(int64_t{kFoldStripes} * num_heads * seq.num_slots, 0.0f);
        const int32_t tiles = (seq.num_new + tile - 1) / tile;
        for (int32_t stripe = 0; stripe < std::min(kFoldStripes, tiles); ++stripe) {
          for (int32_t h = 0; h < num_kv_heads; ++h) units.push_back({s, stripe, h});
        }
        continue;
      }
      for (int32_t t = 0; t < seq.num_new; t += tile) {
        for (int32_t h = 0; h < num_kv_heads; ++h) {
          items.push_back({s, t, std::min(tile, seq.num_new - t), h});
        }
      }
    }
    // Later tokens of a prefill chunk see more keys, so contiguous chunks would leave the
    // thread with the tail doing most of the work; each lane takes every T-th item instead,
    // and the lanes are spread among the fold units (the pool gives each thread a contiguous
    // range of units).
    lanes = static_cast<int32_t>(std::min<int64_t>(num_threads, items.size()));
    const int64_t fold_units = static_cast<int64_t>(units.size());
    for (int32_t lane = 0; lane < lanes; ++lane) {
      units.insert(units.begin() + lane * (fold_units + lanes) / lanes, Unit{-1, lane, 0});
    }
  }
};

// The column fold of a folding sequence from its stripes: per head, the stripes in order.
void MergeStripes(const AttentionSequence& seq, const std::vector<float>& stripes,
                  int32_t num_heads, ThreadPool& pool) {
  const int64_t n = seq.num_slots;
  pool.ParallelFor(num_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      float* column = seq.column_fold + h * n;
      std::copy_n(stripes.data() + h * n, n, column);
      for (int32_t stripe = 1; stripe < kFoldStripes; ++stripe) {
        const float* part = stripes.data() + (stripe * num_heads + h) * n;
        for (int64_t j = 0; j < n; ++j) {
          column[j] = seq.fold_reduce == ColumnReduce::kMax ? std::max(column[j], part[j])
                                                            : column[j] + part[j];
        }
      }
    }
  });
}

}  // namespace

void PagedAttention(const PagedKvView& kv, std::span<const AttentionSequence> sequences,
                    const float* q, int32_t num_heads, float scale, float* out,
                    ThreadPool& pool) {
  Schedule work(sequences, kv.num_kv_heads, num_heads, pool.num_threads());
  const int64_t num_items = static_cast<int64_t>(work.items.size());
  pool.ParallelFor(static_cast<int64_t>(work.units.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local AttendScratch scratch;
    for (int64_t u = begin; u < end; ++u) {
      const Unit& unit = work.units[u];
      if (unit.sequence < 0) {
        for (int64_t i = unit.stripe; i < num_items; i += work.lanes) {
          const WorkItem& item = work.items[i];
          AttendItem(kv, sequences[item.sequence], item, num_heads, q, scale, out, nullptr,
                     scratch);
        }
        continue;
      }
      const AttentionSequence& seq = sequences[unit.sequence];
      const int32_t tile = TileOf(seq);
      float* fold = work.stripes[unit.sequence].data() +
                    int64_t{unit.stripe} * num_heads * seq.num_slots;
      for (int32_t t = unit.stripe * tile; t < seq.num_new; t += kFoldStripes * tile) {
        const WorkItem item{unit.sequence, t, std::min(tile, seq.num_new - t), unit.kv_head};
        AttendItem(kv, seq, item, num_heads, q, scale, out, fold, scratch);
      }
    }
  });
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (sequences[s].column_fold != nullptr) {
      MergeStripes(sequences[s], work.stripes[s], num_heads, pool);
    }
  }
}

}  // namespace winnow::kernels
