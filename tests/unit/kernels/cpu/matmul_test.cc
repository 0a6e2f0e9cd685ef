#include "kernels/cpu/matmul.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/unit/kernels/cpu/matmul_test_util.h"

namespace winnow::kernels {
namespace {

// Compares MatMul with a double-precision product over DequantizeRow's output. The tolerance is
// relative to sum |w_k x_k|, the natural scale of float summation error for one output.
void CheckAgainstReference(GgmlType type, int64_t rows, int64_t cols, int64_t m,
                           ThreadPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  const Weights w = RandomWeights(type, rows, cols, rng);
  const std::vector<float> x = RandomActivations(m * cols, rng);
  std::vector<float> y(static_cast<size_t>(m * rows), NAN);
  ASSERT_TRUE(MatMul(w.matrix, x.data(), m, y.data(), pool).ok());

  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = w.bytes.data() + r * w.matrix.row_bytes;
    ASSERT_TRUE(DequantizeRow(type, src, cols, row.data()).ok());
    for (int64_t i = 0; i < m; ++i) {
      double ref = 0.0, l1 = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(row[k]) * x[i * cols + k];
        ref += p;
        l1 += std::fabs(p);
      }
      const double err = std::fabs(y[i * rows + r] - ref) / (l1 + 1e-30);
      ASSERT_LE(err, 1e-5) << TraitsOf(type).name << " rows=" << rows << " cols=" << cols
                           << " m=" << m << " at (" << i << ", " << r << "): got "
                           << y[i * rows + r] << " want " << ref;
    }
  }
}

struct Shape {
  int64_t rows, cols;
};

// Rows deliberately miss every panel size (16, 32, 64); cols cover one block up to K-blocked.
constexpr Shape kShapes[] = {{1, 64}, {37, 64}, {100, 96}, {129, 576}, {77, 2048}, {45, 1536}};
constexpr int64_t kMs[] = {1, 3, 8, 17, 130};

class MatMulTypeTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatMulTypeTest, MatchesDequantisedReference) {
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const int64_t cols = WholeBlocks(GetParam(), s.cols);
    for (int64_t m : kMs) CheckAgainstReference(GetParam(), s.rows, cols, m, pool, seed++);
  }
}

TEST_P(MatMulTypeTest, EveryTileRemainder) {
  // Through both paths and, for any kernel height up to 16 above a switch point up to 24, every
  // remainder of m: on one thread and on more threads than panels (input rows split too).
  ThreadPool one(1), many(4);
  for (int64_t m = 1; m <= 40; ++m) {
    CheckAgainstReference(GetParam(), 70, WholeBlocks(GetParam(), 128), m, one, 100 + m);
    CheckAgainstReference(GetParam(), 19, WholeBlocks(GetParam(), 96), m, many, 200 + m);
  }
}

INSTANTIATE_TEST_SUITE_P(FastPaths, MatMulTypeTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) { return std::string(TraitsOf(info.param).name); });

TEST(MatMulTest, PlainTypesAcceptAnyRowLength) {
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (int64_t cols : {1, 7, 33, 70, 531}) {
      for (int64_t m : {1, 5, 20}) CheckAgainstReference(type, 23, cols, m, pool, 7 * cols + m);
    }
  }
}

TEST(MatMulTest, GenericPathForOtherTypes) {
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K}) {
    if (!CanDequantize(type)) continue;
    const int64_t block = TraitsOf(type).block_elements;
    for (int64_t m : {1, 4, 9, 40}) {
      CheckAgainstReference(type, 33, 2 * block, m, pool, 11 + m);
      CheckAgainstReference(type, 20, 3 * 256, m, pool, 13 + m);  // > one K block for 32-blocks
    }
  }
}

// The model compares a sequence's logits run alone with the same sequence batched with others,
// bit for bit: a row's output must not depend on m, on which path m selects, or on the pool.
TEST(MatMulTest, RowsAreBitIdenticalWhateverTheBatch) {
  ThreadPool one(1), three(3);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kF32, GgmlType::kQ5_0,
                        GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ2_K}) {
    if (!CanDequantize(type)) continue;
    for (int64_t cols : {WholeBlocks(type, 96), WholeBlocks(type, 576)}) {
      std::mt19937 rng(static_cast<uint32_t>(cols) + static_cast<uint32_t>(type));
      const int64_t rows = 75, m = 45;
      const Weights w = RandomWeights(type, rows, cols, rng);
      const std::vector<float> x = RandomActivations(m * cols, rng);
      std::vector<float> batched(m * rows);
      ASSERT_TRUE(MatMul(w.matrix, x.data(), m, batched.data(), three).ok());
      // Every sub-batch [start, start + len) sees the same rows as the full batch.
      for (int64_t len : {1, 3, 8, 9, 17}) {
        for (int64_t start : {int64_t{0}, m - len}) {
          std::vector<float> part(len * rows);
          ThreadPool& pool = len % 2 ? one : three;
          ASSERT_TRUE(MatMul(w.matrix, x.data() + start * cols, len, part.data(), pool).ok());
          EXPECT_EQ(std::memcmp(part.data(), batched.data() + start * rows,
                                part.size() * sizeof(float)),
                    0)
              << TraitsOf(type).name << " cols=" << cols << " rows [" << start << ", "
              << start + len << ")";
        }
      }
    }
  }
}

TEST(MatMulTest, ResultsAreDeterministic) {
  ThreadPool pool(3);
  std::mt19937 rng(5);
  const Weights w = RandomWeights(GgmlType::kQ4_1, 200, 576, rng);
  for (int64_t m : {1, 64}) {
    const std::vector<float> x = RandomActivations(m * 576, rng);
    std::vector<float> a(m * 200), b(m * 200);
    ASSERT_TRUE(MatMul(w.matrix, x.data(), m, a.data(), pool).ok());
    ASSERT_TRUE(MatMul(w.matrix, x.data(), m, b.data(), pool).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

TEST(MatMulTest, RejectsUnsupportedTypeByName) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(64 * 8);
  const WeightMatrix w{GgmlType::kI32, 2, 64, 64 * 4, bytes.data()};
  float x[64] = {}, y[2];
  const absl::Status s = MatMul(w, x, 1, y, pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::string(TraitsOf(GgmlType::kI32).name)), std::string::npos)
      << s;

  const WeightMatrix unknown{static_cast<GgmlType>(4), 2, 64, 64, bytes.data()};
  EXPECT_EQ(MatMul(unknown, x, 1, y, pool).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MatMulTest, RejectsBadShapes) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(1024);
  float x[64] = {}, y[4];
  // 40 is not whole Q8_0 blocks.
  EXPECT_FALSE(MatMul({GgmlType::kQ8_0, 2, 40, 40, bytes.data()}, x, 1, y, pool).ok());
  // row_bytes too small for 64 Q8_0 elements (68 bytes).
  EXPECT_FALSE(MatMul({GgmlType::kQ8_0, 2, 64, 60, bytes.data()}, x, 1, y, pool).ok());
  EXPECT_FALSE(MatMul({GgmlType::kF32, 2, 4, 16, nullptr}, x, 1, y, pool).ok());
  EXPECT_FALSE(MatMul({GgmlType::kF32, 1, 4, 16, bytes.data()}, x, -1, y, pool).ok());
  EXPECT_TRUE(MatMul({GgmlType::kF32, 1, 4, 16, bytes.data()}, x, 0, y, pool).ok());
}

TEST(MatMulTest, GetRowMatchesDequantizeRow) {
  std::mt19937 rng(9);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_1, GgmlType::kF16}) {
    const Weights w = RandomWeights(type, 10, 96, rng);
    std::vector<float> got(96), want(96);
    for (int64_t r : {0, 4, 9}) {
      ASSERT_TRUE(GetRow(w.matrix, r, got.data()).ok());
      const uint8_t* src = w.bytes.data() + r * w.matrix.row_bytes;
      ASSERT_TRUE(DequantizeRow(type, src, 96, want.data()).ok());
      EXPECT_EQ(got, want);
    }
    EXPECT_EQ(GetRow(w.matrix, 10, got.data()).code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(GetRow(w.matrix, -1, got.data()).code(), absl::StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace winnow::kernels
