// kernels/cpu/quantize.h: the blocks' own invariants and that the kernels read them. Byte
// equality with gguf-py is tests/python/test_weight_quantize.py's.
#include "kernels/cpu/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_q8.h"

namespace winnow::kernels {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                               GgmlType::kQ5_0, GgmlType::kQ5_1};

std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The largest error a block of this type may make on a value: half a step d for the rounded
// quants (Q8_0, and Q4_1 / Q5_1's trunc(v + 0.5)), a whole step for Q4_0 / Q5_0 (the value
// -max is clipped from level 16 to 15), plus what the fp16 scale and minimum lose
// (2^-11 relative each; 2^-10 here for margin).
float MaxError(GgmlType type, const float* block) {
  float lo = block[0], hi = block[0], amax = 0;
  for (int j = 0; j < 32; ++j) {
    lo = std::min(lo, block[j]);
    hi = std::max(hi, block[j]);
    amax = std::max(amax, std::fabs(block[j]));
  }
  const float fp16 = std::ldexp(1.0f, -10);
  switch (type) {
    case GgmlType::kQ8_0: return amax / 127 / 2 + amax * fp16;
    case GgmlType::kQ4_0: return amax / 8 + amax * fp16;
    case GgmlType::kQ5_0: return amax / 16 + amax * fp16;
    case GgmlType::kQ4_1: return (hi - lo) / 15 / 2 + (hi - lo + std::fabs(lo)) * fp16;
    default: return (hi - lo) / 31 / 2 + (hi - lo + std::fabs(lo)) * fp16;
  }
}

TEST(QuantizeTest, RoundTripsWithinTheTypesStep) {
  const int64_t n = 32 * 16;
  const std::vector<float> x = RandomValues(n, 1);
  for (GgmlType type : kTypes) {
    std::vector<uint8_t> blocks(RowBytes(type, n));
    ASSERT_TRUE(QuantizeRow(type, x.data(), n, blocks.data()).ok());
    std::vector<float> back(n);
    ASSERT_TRUE(DequantizeRow(type, blocks.data(), n, back.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(back[i] - x[i]), MaxError(type, x.data() + i / 32 * 32))
          << TraitsOf(type).name << " element " << i;
    }
  }
}

TEST(QuantizeTest, ZerosStayZeros) {
  const std::vector<float> zeros(64, 0.0f);
  for (GgmlType type : kTypes) {
    std::vector<uint8_t> blocks(RowBytes(type, 64));
    ASSERT_TRUE(QuantizeRow(type, zeros.data(), 64, blocks.data()).ok());
    std::vector<float> back(64, 1.0f);
    ASSERT_TRUE(DequantizeRow(type, blocks.data(), 64, back.data()).ok());
    for (float v : back) EXPECT_EQ(v, 0.0f) << TraitsOf(type).name;
  }
}

// A matrix quantised on a pool of any size is the same bytes as row by row, and the float
// and the integer matmuls multiply it as they multiply its dequantised copy.
TEST(QuantizeTest, MatrixRunsInTheKernels) {
  const int64_t rows = 48, cols = 128, m = 3;
  const std::vector<float> w = RandomValues(rows * cols, 2);
  const std::vector<float> x = RandomValues(m * cols, 3);
  const WeightMatrix source{GgmlType::kF32, rows, cols, cols * 4,
                            reinterpret_cast<const uint8_t*>(w.data())};
  ThreadPool one(1), four(4);
  for (GgmlType type : kTypes) {
    const int64_t row_bytes = RowBytes(type, cols);
    std::vector<uint8_t> a(rows * row_bytes), b(rows * row_bytes), by_row(rows * row_bytes);
    absl::StatusOr<WeightMatrix> q = QuantizeMatrix(source, type, a.data(), one);
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_TRUE(QuantizeMatrix(source, type, b.data(), four).ok());
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(QuantizeRow(type, w.data() + r * cols, cols, by_row.data() + r * row_bytes).ok());
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, by_row);
    EXPECT_EQ(q->type, type);
    EXPECT_EQ(q->row_bytes, row_bytes);
    ASSERT_TRUE(ValidateWeightMatrix(*q).ok());

    std::vector<float> dequantized(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(GetRow(*q, r, dequantized.data() + r * cols).ok());
    }
    const WeightMatrix plain{GgmlType::kF32, rows, cols, cols * 4,
                             reinterpret_cast<const uint8_t*>(dequantized.data())};
    std::vector<float> want(m * rows), got(m * rows), got_q8(m * rows);
    ASSERT_TRUE(MatMul(plain, x.data(), m, want.data(), four).ok());
    ASSERT_TRUE(MatMul(*q, x.data(), m, got.data(), four).ok());
    ASSERT_TRUE(HasInt8Kernel(type));
    Q8Activations xq;
    ASSERT_TRUE(QuantizeActivations(x.data(), m, cols, &xq, four).ok());
    ASSERT_TRUE(MatMulQ8(*q, xq, got_q8.data(), four).ok());
    for (int64_t i = 0; i < m * rows; ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5f) << TraitsOf(type).name;
      EXPECT_NEAR(got_q8[i], want[i], 2e-3f) << TraitsOf(type).name;  // activations' rounding
    }
  }
}

TEST(QuantizeTest, RefusesOtherTypesAndPartialBlocks) {
  const std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_FALSE(CanQuantize(GgmlType::kQ4_K));
  EXPECT_FALSE(CanQuantize(GgmlType::kF16));
  const absl::Status k = QuantizeRow(GgmlType::kQ4_K, x.data(), 64, out.data());
  EXPECT_EQ(k.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(k.message().find("Q4_K"), absl::string_view::npos) << k;
  const absl::Status partial = QuantizeRow(GgmlType::kQ8_0, x.data(), 48, out.data());
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(partial.message().find("48"), absl::string_view::npos) << partial;
}

}  // namespace
}  // namespace winnow::kernels
