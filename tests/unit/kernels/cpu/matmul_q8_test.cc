#include "kernels/cpu/matmul_q8.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/unit/kernels/cpu/matmul_test_util.h"

namespace winnow::kernels {
namespace {

constexpr GgmlType kInt8Types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                   GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                                   GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                   GgmlType::kQ6_K};

Q8Activations Quantize(const std::vector<float>& x, int64_t m, int64_t cols, ThreadPool& pool) {
  Q8Activations q;
  EXPECT_TRUE(QuantizeActivations(x.data(), m, cols, &q, pool).ok());
  return q;
}

std::vector<float> DequantizedRow(const Weights& w, int64_t r) {
  std::vector<float> row(static_cast<size_t>(w.matrix.cols));
  EXPECT_TRUE(
      DequantizeRow(w.matrix.type, w.bytes.data() + r * w.matrix.row_bytes, w.matrix.cols,
                    row.data())
          .ok());
  return row;
}

// MatMulQ8 computes exactly (up to float rounding) the product of the dequantised weights with
// the dequantised activations: checks every integer unpacker, scale and offset.
void CheckExactOnQuantisedInputs(GgmlType type, int64_t rows, int64_t cols, int64_t m,
                                 ThreadPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  const Weights w = RandomWeights(type, rows, cols, rng);
  const Q8Activations x = Quantize(RandomActivations(m * cols, rng), m, cols, pool);
  std::vector<float> y(static_cast<size_t>(m * rows), NAN);
  ASSERT_TRUE(MatMulQ8(w.matrix, x, y.data(), pool).ok());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = DequantizedRow(w, r);
    for (int64_t i = 0; i < m; ++i) {
      double ref = 0.0, l1 = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double a = double{x.scale[i * x.blocks() + k / 32]} * x.q[i * cols + k];
        ref += row[k] * a;
        l1 += std::fabs(row[k] * a);
      }
      ASSERT_LE(std::fabs(y[i * rows + r] - ref), 1e-5 * l1 + 1e-30)
          << TraitsOf(type).name << " rows=" << rows << " cols=" << cols << " m=" << m << " at ("
          << i << ", " << r << ")";
    }
  }
}

class MatMulQ8TypeTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatMulQ8TypeTest, EqualsProductOfDequantisedOperands) {
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (int64_t cols : {int64_t{64}, int64_t{576}, int64_t{1536}}) {
    for (int64_t m : {1, 3, 8, 17, 70}) {
      CheckExactOnQuantisedInputs(GetParam(), 45, WholeBlocks(GetParam(), cols), m, pool, seed++);
    }
  }
}

TEST_P(MatMulQ8TypeTest, EveryTileRemainder) {
  ThreadPool one(1), many(4);
  for (int64_t m = 1; m <= 20; ++m) {
    CheckExactOnQuantisedInputs(GetParam(), 7, WholeBlocks(GetParam(), 96), m, one, 100 + m);
    CheckExactOnQuantisedInputs(GetParam(), 5, WholeBlocks(GetParam(), 64), m, many, 200 + m);
  }
}

// The SIMD kernels follow the portable code's arithmetic operation for operation.
TEST_P(MatMulQ8TypeTest, SimdEqualsPortableBitForBit) {
  ThreadPool pool(2);
  std::mt19937 rng(static_cast<uint32_t>(GetParam()));
  const int64_t cols = WholeBlocks(GetParam(), 576);
  const Weights w = RandomWeights(GetParam(), 33, cols, rng);
  for (int64_t m : {1, 5, 40}) {
    const Q8Activations x = Quantize(RandomActivations(m * cols, rng), m, cols, pool);
    std::vector<float> simd(m * 33), portable(m * 33);
    ASSERT_TRUE(MatMulQ8(w.matrix, x, simd.data(), pool).ok());
    ASSERT_TRUE(internal::MatMulQ8Portable(w.matrix, x, portable.data(), pool).ok());
    EXPECT_EQ(std::memcmp(simd.data(), portable.data(), simd.size() * sizeof(float)), 0)
        << TraitsOf(GetParam()).name << " m=" << m;
  }
}

// Against float32 activations the only new error is the activations' rounding, at most half a
// step per element: |y_q8 - y_f32| <= sum_k |w_k| * scale_block(k) / 2 (plus float rounding).
TEST_P(MatMulQ8TypeTest, WithinActivationRoundingOfFloatPath) {
  ThreadPool pool(2);
  std::mt19937 rng(7 + static_cast<uint32_t>(GetParam()));
  const int64_t cols = WholeBlocks(GetParam(), 768), rows = 40, m = 12;
  const Weights w = RandomWeights(GetParam(), rows, cols, rng);
  const std::vector<float> xf = RandomActivations(m * cols, rng);
  const Q8Activations x = Quantize(xf, m, cols, pool);
  std::vector<float> y_q8(m * rows), y_f32(m * rows);
  ASSERT_TRUE(MatMulQ8(w.matrix, x, y_q8.data(), pool).ok());
  ASSERT_TRUE(MatMul(w.matrix, xf.data(), m, y_f32.data(), pool).ok());
  double worst_fraction = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = DequantizedRow(w, r);
    for (int64_t i = 0; i < m; ++i) {
      double bound = 0.0, l1 = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        bound += std::fabs(row[k]) * x.scale[i * x.blocks() + k / 32] / 2;
        l1 += std::fabs(row[k] * xf[i * cols + k]);
      }
      const double err = std::fabs(double{y_q8[i * rows + r]} - y_f32[i * rows + r]);
      ASSERT_LE(err, bound + 1e-5 * l1) << TraitsOf(GetParam()).name;
      worst_fraction = std::max(worst_fraction, err / bound);
    }
  }
  // Rounding errors are independent, so they mostly cancel: the bound is far from tight.
  EXPECT_LT(worst_fraction, 0.5) << TraitsOf(GetParam()).name;
}

INSTANTIATE_TEST_SUITE_P(IntegerKernels, MatMulQ8TypeTest, ::testing::ValuesIn(kInt8Types),
                         [](const auto& info) { return std::string(TraitsOf(info.param).name); });

TEST(MatMulQ8Test, RowsAreBitIdenticalWhateverTheBatch) {
  ThreadPool one(1), three(3);
  for (GgmlType type : kInt8Types) {
    const int64_t cols = WholeBlocks(type, 576), rows = 37, m = 45;
    std::mt19937 rng(static_cast<uint32_t>(type));
    const Weights w = RandomWeights(type, rows, cols, rng);
    const std::vector<float> xf = RandomActivations(m * cols, rng);
    std::vector<float> batched(m * rows);
    ASSERT_TRUE(MatMulQ8(w.matrix, Quantize(xf, m, cols, three), batched.data(), three).ok());
    for (int64_t len : {1, 3, 7, 8, 9, 17}) {
      for (int64_t start : {int64_t{0}, m - len}) {
        const std::vector<float> part_x(xf.begin() + start * cols,
                                        xf.begin() + (start + len) * cols);
        ThreadPool& pool = len % 2 ? one : three;
        std::vector<float> part(len * rows);
        ASSERT_TRUE(MatMulQ8(w.matrix, Quantize(part_x, len, cols, pool), part.data(), pool).ok());
        EXPECT_EQ(std::memcmp(part.data(), batched.data() + start * rows,
                              part.size() * sizeof(float)),
                  0)
            << TraitsOf(type).name << " rows [" << start << ", " << start + len << ")";
      }
    }
  }
}

// The quantiser's contract, checked against a plain restatement of it.
TEST(QuantizeActivationsTest, RoundsEachBlockToItsOwnScale) {
  ThreadPool pool(2);
  std::mt19937 rng(3);
  const int64_t m = 3, cols = 96;
  std::vector<float> x = RandomActivations(m * cols, rng);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
  x[70] = 1e-30f;                                    // a tiny maximum
  x[100] = -50.0f;                                   // a large negative maximum
  const Q8Activations q = Quantize(x, m, cols, pool);
  ASSERT_EQ(q.blocks(), 3);
  for (int64_t t = 0; t < m * 3; ++t) {
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[t * 32 + k]));
    EXPECT_EQ(q.scale[t], amax / 127.0f);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int k = 0; k < 32; ++k) {
      EXPECT_EQ(q.q[t * 32 + k], static_cast<int8_t>(std::nearbyint(x[t * 32 + k] * inv)))
          << "block " << t << " element " << k;
    }
    int sums[2] = {0, 0};
    for (int k = 0; k < 32; ++k) sums[k / 16] += q.q[t * 32 + k];
    EXPECT_EQ(q.half_sums[2 * t], sums[0]);
    EXPECT_EQ(q.half_sums[2 * t + 1], sums[1]);
    EXPECT_EQ(q.scaled_sum[t], q.scale[t] * static_cast<float>(sums[0] + sums[1]));
  }
  EXPECT_EQ(q.q[100], -127);
}

TEST(MatMulQ8Test, RefusesWhatItCannotDo) {
  ThreadPool pool(1);
  std::mt19937 rng(1);
  Q8Activations x;
  EXPECT_FALSE(QuantizeActivations(nullptr, 2, 33, &x, pool).ok());
  x = Quantize(RandomActivations(64, rng), 1, 64, pool);
  const Weights f32 = RandomWeights(GgmlType::kF32, 2, 64, rng);
  const absl::Status no_kernel = MatMulQ8(f32.matrix, x, nullptr, pool);
  EXPECT_FALSE(no_kernel.ok());
  EXPECT_NE(no_kernel.message().find("F32"), std::string::npos) << no_kernel;
  const Weights q4 = RandomWeights(GgmlType::kQ4_0, 2, 96, rng);
  std::vector<float> y(2);
  const absl::Status mismatch = MatMulQ8(q4.matrix, x, y.data(), pool);
  EXPECT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.message().find("64"), std::string::npos) << mismatch;
  EXPECT_FALSE(HasInt8Kernel(GgmlType::kF16));
  EXPECT_FALSE(HasInt8Kernel(GgmlType::kBF16));
  EXPECT_TRUE(HasInt8Kernel(GgmlType::kQ6_K));
}

}  // namespace
}  // namespace winnow::kernels
