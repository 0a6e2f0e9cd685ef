// The scoring kernel and the attention kernel's sparse / probability paths against a dense
// double-precision reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {
namespace {

constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 8;
constexpr int32_t kBlock = 4;
constexpr int32_t kSlots = 23;  // not a multiple of the block size

struct Fixture {
  std::unique_ptr<cache::BlockPool> pool;
  cache::SequenceKv kv{1, kBlock};
  std::vector<float> q;  // rows x heads x dim
  std::mt19937 rng{7};

  // With `logit_bias`, every (KV head, slot) gets a random bias that the attention adds.
  explicit Fixture(int32_t rows, bool logit_bias = false, int32_t slots = kSlots) {
    pool = *cache::BlockPool::Create(
        cache::KvLayout{1, kKvHeads, kDim, kBlock, KvDtype::kF32, logit_bias},
        slots / kBlock + 5);
    // Take blocks out of order so the table is not the identity.
    std::vector<int32_t> spare;
    pool->Allocate(3, &spare);
    EXPECT_TRUE(kv.Reserve(*pool, slots));
    pool->Free(spare);
    kv.AppendSlots(0, slots);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int32_t s = 0; s < slots; ++s) {
      for (int32_t g = 0; g < kKvHeads; ++g) {
        for (int32_t d = 0; d < kDim; ++d) {
          Key(g, s)[d] = normal(rng);
          Value(g, s)[d] = normal(rng);
        }
        if (logit_bias) Bias(g, s) = normal(rng);
      }
    }
    q.resize(static_cast<size_t>(rows) * kHeads * kDim);
    for (float& x : q) x = 2.0f * normal(rng);
  }
  float* Key(int32_t g, int32_t s) {
    return pool->Keys(kv.block_table(0)[s / kBlock], g) + (s % kBlock) * kDim;
  }
  float* Value(int32_t g, int32_t s) {
    return pool->Values(kv.block_table(0)[s / kBlock], g) + (s % kBlock) * kDim;
  }
  float& Bias(int32_t g, int32_t s) {
    return pool->Bias(kv.block_table(0)[s / kBlock], g)[s % kBlock];
  }
  PagedKvView View() const { return pool->View(); }
  // Dense reference probabilities of row r, head h over the first `visible` slots.
  std::vector<double> Reference(int32_t r, int32_t h, int32_t visible, float scale) {
    std::vector<double> p(visible);
    double max_logit = -1e300;
    for (int32_t j = 0; j < visible; ++j) {
      double dot = 0;
      for (int32_t d = 0; d < kDim; ++d) {
        dot += double{q[(r * kHeads + h) * kDim + d]} * Key(h / (kHeads / kKvHeads), j)[d];
      }
      p[j] = dot * scale;
      if (pool->layout().logit_bias) p[j] += Bias(h / (kHeads / kKvHeads), j);
      max_logit = std::max(max_logit, p[j]);
    }
    double sum = 0;
    for (double& x : p) sum += (x = std::exp(x - max_logit));
    for (double& x : p) x /= sum;
    return p;
  }
};

TEST(AttentionScoresTest, ProbabilitiesMatchDenseReferenceWithCausalLimits) {
  const int32_t rows = 11;  // more than one chunk of rows, the last one partial
  Fixture f(rows);
  ThreadPool threads(2);
  std::vector<int32_t> visible = {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
  ScoreInput in{f.kv.block_table(0).data(), kSlots, f.q.data(), rows, visible.data(), kHeads,
                1.0f / std::sqrt(float{kDim})};
  std::vector<float> probs(kHeads * rows * kSlots, -1.0f);
  std::vector<float> lse(kHeads * rows);
  AttentionProbabilities(f.View(), in, probs.data(), lse.data(), threads);
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t r = 0; r < rows; ++r) {
      const std::vector<double> ref = f.Reference(r, h, visible[r], in.scale);
      for (int32_t j = 0; j < kSlots; ++j) {
        const float got = probs[(h * rows + r) * kSlots + j];
        if (j < visible[r]) {
          EXPECT_NEAR(got, ref[j], 1e-5) << "h=" << h << " r=" << r << " j=" << j;
        } else {
          EXPECT_EQ(got, 0.0f);
        }
      }
      // logit = ln p + lse.
      double dot = 0;
      for (int32_t d = 0; d < kDim; ++d) {
        dot += double{f.q[(r * kHeads + h) * kDim + d]} * f.Key(h / 2, 0)[d];
      }
      EXPECT_NEAR(std::log(probs[(h * rows + r) * kSlots]) + lse[h * rows + r], dot * in.scale,
                  1e-4);
    }
  }
}

TEST(AttentionScoresTest, ColumnSumsEqualSummedProbabilitiesAndIgnoreThreadCount) {
  const int32_t rows = 10;  // more than one chunk of rows
  Fixture f(rows);
  std::vector<int32_t> visible = {3, 8, 12, 17, 22, 23, 1, 9, 20, 23};
  ScoreInput in{f.kv.block_table(0).data(), kSlots, f.q.data(), rows, visible.data(), kHeads,
                1.0f / std::sqrt(float{kDim})};
  std::vector<float> one(kHeads * kSlots, 0.0f), four(kHeads * kSlots, 0.0f);
  ThreadPool t1(1), t4(4);
  AccumulateAttentionColumns(f.View(), in, one.data(), t1);
  AccumulateAttentionColumns(f.View(), in, four.data(), t4);
  EXPECT_EQ(one, four);  // bit-identical: fixed summation order
  for (int32_t h = 0; h < kHeads; ++h) {
    std::vector<double> ref(kSlots, 0.0);
    for (int32_t r = 0; r < rows; ++r) {
      const std::vector<double> p = f.Reference(r, h, visible[r], in.scale);
      for (int32_t j = 0; j < visible[r]; ++j) ref[j] += p[j];
    }
    for (int32_t j = 0; j < kSlots; ++j) EXPECT_NEAR(one[h * kSlots + j], ref[j], 1e-5);
  }
  // Accumulates: a second call doubles.
  AccumulateAttentionColumns(f.View(), in, one.data(), t1);
  for (int32_t i = 0; i < kHeads * kSlots; ++i) EXPECT_FLOAT_EQ(one[i], 2 * four[i]);
}

TEST(AttentionScoresTest, ColumnMaximaAreTheLargestRowProbabilityAndIgnoreThreadCount) {
  const int32_t rows = 6;
  Fixture f(rows);
  std::vector<int32_t> visible = {3, 8, 12, 17, 22, 23};
  ScoreInput in{f.kv.block_table(0).data(), kSlots, f.q.data(), rows, visible.data(), kHeads,
                1.0f / std::sqrt(float{kDim})};
  in.reduce = ColumnReduce::kMax;
  std::vector<float> one(kHeads * kSlots, 0.0f), four(kHeads * kSlots, 0.0f);
  ThreadPool t1(1), t4(4);
  AccumulateAttentionColumns(f.View(), in, one.data(), t1);
  AccumulateAttentionColumns(f.View(), in, four.data(), t4);
  EXPECT_EQ(one, four);
  for (int32_t h = 0; h < kHeads; ++h) {
    std::vector<double> ref(kSlots, 0.0);
    for (int32_t r = 0; r < rows; ++r) {
      const std::vector<double> p = f.Reference(r, h, visible[r], in.scale);
      for (int32_t j = 0; j < visible[r]; ++j) ref[j] = std::max(ref[j], p[j]);
    }
    for (int32_t j = 0; j < kSlots; ++j) EXPECT_NEAR(one[h * kSlots + j], ref[j], 1e-6);
  }
  // Folds into what the buffer holds: the maximum of the two, not a sum.
  std::vector<float> seeded(kHeads * kSlots, 0.5f);
  AccumulateAttentionColumns(f.View(), in, seeded.data(), t1);
  for (int32_t i = 0; i < kHeads * kSlots; ++i) {
    EXPECT_FLOAT_EQ(seeded[i], std::max(0.5f, one[i])) << i;
  }
}

TEST(AttentionScoresTest, ValueNormsAreTheL2NormOfEachValueRow) {
  Fixture f(1);
  std::vector<float> norms(kKvHeads * kSlots, -1.0f);
  ValueNorms(f.View(), f.kv.block_table(0).data(), kSlots, norms.data());
  for (int32_t g = 0; g < kKvHeads; ++g) {
    for (int32_t j = 0; j < kSlots; ++j) {
      double sq = 0;
      for (int32_t d = 0; d < kDim; ++d) sq += double{f.Value(g, j)[d]} * f.Value(g, j)[d];
      EXPECT_NEAR(norms[g * kSlots + j], std::sqrt(sq), 1e-5) << "head " << g << " slot " << j;
    }
  }
}

// A prefill chunk of 140 tokens over 150 slots (18 token tiles: the fold's stripes wrap) whose
// attention folds the probabilities of its tokens from the 6th on.
constexpr int32_t kFoldSlots = 150, kFoldNew = 140, kFoldFrom = 5;

std::vector<float> FoldedPrefill(Fixture& f, ColumnReduce reduce, ThreadPool& threads,
                                 bool behind_a_decode) {
  std::vector<float> fold(kHeads * kFoldSlots, -7.0f);  // overwritten
  AttentionSequence seq{f.kv.block_table(0).data(), kFoldSlots, kFoldNew, 0};
  seq.column_fold = fold.data();
  seq.fold_from = kFoldFrom;
  seq.fold_reduce = reduce;
  std::vector<AttentionSequence> batch = {seq};
  if (behind_a_decode) {  // another sequence's token first in the batch (the same keys)
    batch[0].first_row = 1;
    batch.insert(batch.begin(), AttentionSequence{f.kv.block_table(0).data(), kFoldSlots, 1, 0});
  }
  std::vector<float> q(f.q.begin(), f.q.begin() + kFoldNew * kHeads * kDim);
  if (behind_a_decode) q.insert(q.begin(), f.q.end() - kHeads * kDim, f.q.end());
  std::vector<float> out(q.size());
  PagedAttention(f.View(), batch, q.data(), kHeads, 1.0f / std::sqrt(float{kDim}), out.data(),
                 threads);
  return fold;
}

TEST(PagedAttentionTest, ColumnFoldIsTheScoringKernelsAndIgnoresThreadsAndBatch) {
  Fixture f(kFoldNew + 1, /*logit_bias=*/true, kFoldSlots);
  ThreadPool t1(1), t3(3);
  for (const ColumnReduce reduce : {ColumnReduce::kSum, ColumnReduce::kMax}) {
    const std::vector<float> one = FoldedPrefill(f, reduce, t1, false);
    EXPECT_EQ(one, FoldedPrefill(f, reduce, t3, false));  // bit-identical: a fixed order
    EXPECT_EQ(one, FoldedPrefill(f, reduce, t3, true));
    // The scoring kernel over the same rows: token i sees the past and the new up to itself.
    const int32_t rows = kFoldNew - kFoldFrom;
    std::vector<int32_t> visible(rows);
    for (int32_t r = 0; r < rows; ++r) visible[r] = kFoldSlots - kFoldNew + kFoldFrom + r + 1;
    ScoreInput in{f.kv.block_table(0).data(), kFoldSlots, f.q.data() + kFoldFrom * kHeads * kDim,
                  rows, visible.data(), kHeads, 1.0f / std::sqrt(float{kDim}), reduce};
    std::vector<float> scored(kHeads * kFoldSlots, 0.0f);
    AccumulateAttentionColumns(f.View(), in, scored.data(), t1);
    for (int32_t i = 0; i < kHeads * kFoldSlots; ++i) {
      EXPECT_NEAR(one[i], scored[i], 2e-6 * std::max(1.0f, scored[i])) << i;
    }
  }
}

// The new token (slot 22) decoding over the past slots {0, 5, 6, 20} only (the sparse path):
// its output (heads x dim) and probabilities (heads x slots).
struct SparseResult {
  std::vector<float> out, probs;
};
SparseResult SparseDecode(Fixture& f, ThreadPool& threads, float scale) {
  const std::vector<int32_t> selected = {0, 5, 6, 20};
  SparseResult r{std::vector<float>(kHeads * kDim), std::vector<float>(kHeads * kSlots, 0.0f)};
  AttentionSequence sparse{f.kv.block_table(0).data(), kSlots, 1, 0};
  sparse.selected = selected.data();
  sparse.num_selected = static_cast<int32_t>(selected.size());
  sparse.probs = r.probs.data();
  PagedAttention(f.View(), {&sparse, 1}, f.q.data(), kHeads, scale, r.out.data(), threads);
  return r;
}

TEST(PagedAttentionTest, ProbabilityOutputAndSparseSelectionMatchReference) {
  Fixture f(1);
  ThreadPool threads(2);
  const float scale = 1.0f / std::sqrt(float{kDim});
  // Dense decode over all 23 slots (the last is the new token), with probabilities.
  std::vector<float> out(kHeads * kDim), probs(kHeads * kSlots, 0.0f);
  AttentionSequence seq{f.kv.block_table(0).data(), kSlots, 1, 0};
  seq.probs = probs.data();
  PagedAttention(f.View(), {&seq, 1}, f.q.data(), kHeads, scale, out.data(), threads);
  for (int32_t h = 0; h < kHeads; ++h) {
    const std::vector<double> ref = f.Reference(0, h, kSlots, scale);
    for (int32_t j = 0; j < kSlots; ++j) EXPECT_NEAR(probs[h * kSlots + j], ref[j], 1e-5);
  }
  // Sparse: attend to slots {0, 5, 6, 20} of the past plus the new token (slot 22).
  const auto [sparse_out, sparse_probs] = SparseDecode(f, threads, scale);
  const std::vector<int32_t> attended = {0, 5, 6, 20, 22};
  for (int32_t h = 0; h < kHeads; ++h) {
    const std::vector<double> full = f.Reference(0, h, kSlots, scale);
    double z = 0;
    for (int32_t j : attended) z += full[j];
    std::vector<double> expect_out(kDim, 0.0);
    for (int32_t j : attended) {
      const double p = full[j] / z;
      EXPECT_NEAR(sparse_probs[h * kSlots + j], p, 1e-5);
      for (int32_t d = 0; d < kDim; ++d) expect_out[d] += p * f.Value(h / 2, j)[d];
    }
    for (int32_t j = 0; j < kSlots; ++j) {
      if (std::find(attended.begin(), attended.end(), j) == attended.end()) {
        EXPECT_EQ(sparse_probs[h * kSlots + j], 0.0f);
      }
    }
    for (int32_t d = 0; d < kDim; ++d) EXPECT_NEAR(sparse_out[h * kDim + d], expect_out[d], 1e-5);
  }
}

// Probabilities and output of row r, head h over exactly the slots `attended`, from the dense
// reference renormalised over them.
void ExpectAttendsTo(Fixture& f, int32_t r, int32_t h, const std::vector<int32_t>& attended,
                     const float* probs, const float* out, float scale) {
  const std::vector<double> full = f.Reference(r, h, attended.back() + 1, scale);
  double z = 0;
  for (int32_t j : attended) z += full[j];
  std::vector<double> expect_out(kDim, 0.0);
  for (int32_t j = 0; j < kSlots; ++j) {
    const bool seen = std::find(attended.begin(), attended.end(), j) != attended.end();
    const double p = seen ? full[j] / z : 0.0;
    EXPECT_NEAR(probs[j], p, 1e-5) << "row " << r << " head " << h << " slot " << j;
    for (int32_t d = 0; d < kDim && seen; ++d) expect_out[d] += p * f.Value(h / 2, j)[d];
  }
  for (int32_t d = 0; d < kDim; ++d) EXPECT_NEAR(out[h * kDim + d], expect_out[d], 1e-5);
}

TEST(PagedAttentionTest, SlidingWindowSeesOnlyTheLastWindowSlots) {
  // A 9-token prefill chunk over slots 14..22 with a window of 6 (which starts mid-block and
  // moves across block boundaries); then the same window with a sparse selection.
  constexpr int32_t kNew = 9, kWindow = 6;
  Fixture f(kNew);
  ThreadPool threads(2);
  const float scale = 1.0f / std::sqrt(float{kDim});
  std::vector<float> out(kNew * kHeads * kDim), probs(kNew * kHeads * kSlots, 0.0f);
  AttentionSequence seq{f.kv.block_table(0).data(), kSlots, kNew, 0};
  seq.window = kWindow;
  seq.probs = probs.data();
  PagedAttention(f.View(), {&seq, 1}, f.q.data(), kHeads, scale, out.data(), threads);
  for (int32_t i = 0; i < kNew; ++i) {
    const int32_t last = kSlots - kNew + i;
    std::vector<int32_t> attended;
    for (int32_t j = last - kWindow + 1; j <= last; ++j) attended.push_back(j);
    for (int32_t h = 0; h < kHeads; ++h) {
      ExpectAttendsTo(f, i, h, attended, probs.data() + (i * kHeads + h) * kSlots,
                      out.data() + i * kHeads * kDim, scale);
    }
  }
  // Decode with a selection: slots before the window (0, 5, 16) drop out, 18 and 20 stay.
  const std::vector<int32_t> selected = {0, 5, 16, 18, 20};
  std::vector<float> sparse_out(kHeads * kDim), sparse_probs(kHeads * kSlots, 0.0f);
  AttentionSequence sparse{f.kv.block_table(0).data(), kSlots, 1, 0};
  sparse.window = kWindow;
  sparse.selected = selected.data();
  sparse.num_selected = static_cast<int32_t>(selected.size());
  sparse.probs = sparse_probs.data();
  PagedAttention(f.View(), {&sparse, 1}, f.q.data(), kHeads, scale, sparse_out.data(), threads);
  for (int32_t h = 0; h < kHeads; ++h) {
    ExpectAttendsTo(f, 0, h, {18, 20, 22}, sparse_probs.data() + h * kSlots, sparse_out.data(),
                    scale);
  }
}

}  // namespace
// The per-slot logit bias (a merged slot's share of evicted mass) enters every logit: the
// attention's dense and sparse paths and the scoring kernel's probabilities all match the
// reference with the bias added.
TEST(AttentionScoresTest, EveryKernelAddsTheSlotsLogitBias) {
  constexpr int32_t kNew = 9;
  Fixture f(kNew, /*logit_bias=*/true);
  ThreadPool threads(2);
  const float scale = 1.0f / std::sqrt(float{kDim});
  std::vector<float> out(kNew * kHeads * kDim), probs(kNew * kHeads * kSlots, 0.0f);
  AttentionSequence seq{f.kv.block_table(0).data(), kSlots, kNew, 0};
  seq.probs = probs.data();
  PagedAttention(f.View(), {&seq, 1}, f.q.data(), kHeads, scale, out.data(), threads);
  std::vector<int32_t> visible;
  for (int32_t i = 0; i < kNew; ++i) {
    const int32_t last = kSlots - kNew + i;
    visible.push_back(last + 1);
    std::vector<int32_t> attended(last + 1);
    for (int32_t j = 0; j <= last; ++j) attended[j] = j;
    for (int32_t h = 0; h < kHeads; ++h) {
      ExpectAttendsTo(f, i, h, attended, probs.data() + (i * kHeads + h) * kSlots,
                      out.data() + i * kHeads * kDim, scale);
    }
  }
  const auto [sparse_out, sparse_probs] = SparseDecode(f, threads, scale);
  for (int32_t h = 0; h < kHeads; ++h) {
    ExpectAttendsTo(f, 0, h, {0, 5, 6, 20, 22}, sparse_probs.data() + h * kSlots,
                    sparse_out.data(), scale);
  }
  ScoreInput in{f.kv.block_table(0).data(), kSlots, f.q.data(), kNew, visible.data(), kHeads,
                scale};
  std::vector<float> scored(kHeads * kNew * kSlots, -1.0f), lse(kHeads * kNew);
  AttentionProbabilities(f.View(), in, scored.data(), lse.data(), threads);
  std::vector<float> columns(kHeads * kSlots, 0.0f);
  AccumulateAttentionColumns(f.View(), in, columns.data(), threads);
  for (int32_t h = 0; h < kHeads; ++h) {
    std::vector<double> column(kSlots, 0.0);
    for (int32_t r = 0; r < kNew; ++r) {
      const std::vector<double> ref = f.Reference(r, h, visible[r], scale);
      for (int32_t j = 0; j < visible[r]; ++j) {
        EXPECT_NEAR(scored[(h * kNew + r) * kSlots + j], ref[j], 1e-5) << h << " " << r;
        column[j] += ref[j];
      }
    }
    for (int32_t j = 0; j < kSlots; ++j) EXPECT_NEAR(columns[h * kSlots + j], column[j], 1e-5);
  }
}

}  // namespace winnow::kernels
