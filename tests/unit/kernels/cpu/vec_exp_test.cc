#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels::vec {
namespace {

std::vector<float> Inputs() {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 1.0f, -1.0f, 0.5f}) x.push_back(v);
  return x;
}

TEST(ExpTest, WithinThreeUlpOfLibm) {
  for (float v : Inputs()) {
    const double want = std::exp(static_cast<double>(v));
    const float got = ExpScalar(v);
    EXPECT_LE(std::fabs(got - want) / want, 3.6e-7) << "x = " << v;
  }
  EXPECT_EQ(ExpScalar(0.0f), 1.0f);
  // Far below the range: a tiny positive value, never NaN or negative (softmax's masked tail).
  EXPECT_GT(ExpScalar(-1000.0f), 0.0f);
  EXPECT_LT(ExpScalar(-1000.0f), 1e-37f);
}

// ExpShifted's vector lanes and scalar tail agree bit for bit, so where a value sits in a row
// never changes its exp.
TEST(ExpTest, VectorAndScalarAgreeBitForBit) {
  std::vector<float> x = Inputs();
  std::vector<float> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) expected[i] = ExpScalar(x[i] - 0.25f);
  ExpShifted(x.data(), static_cast<int64_t>(x.size()), 0.25f);
  EXPECT_EQ(std::memcmp(x.data(), expected.data(), x.size() * sizeof(float)), 0);
}

// A dot's bits do not depend on how many keys share its ScaledDots call or where it sits among
// them (attention's batch and chunking invariance rests on this), and it is the dot within float
// rounding.
TEST(ScaledDotsTest, EachDotIsTheSameAloneOrAmongOthersAndNearTheExactDot) {
  constexpr int64_t kDim = 64, kKeys = 21;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(kDim), keys(kKeys * kDim);
  for (float& v : q) v = normal(rng);
  for (float& v : keys) v = normal(rng);
  std::vector<float> all(kKeys);
  winnow::kernels::ScaledDots(q.data(), keys.data(), kKeys, kDim, 0.125f, all.data());
  for (int64_t j = 0; j < kKeys; ++j) {
    float alone;
    winnow::kernels::ScaledDots(q.data(), keys.data() + j * kDim, 1, kDim, 0.125f, &alone);
    EXPECT_EQ(alone, all[j]) << "key " << j;
    std::vector<float> tail(kKeys - j);
    winnow::kernels::ScaledDots(q.data(), keys.data() + j * kDim, kKeys - j, kDim, 0.125f,
                                tail.data());
    EXPECT_EQ(tail[0], all[j]) << "key " << j << " first of a call";
    double exact = 0.0;
    for (int64_t c = 0; c < kDim; ++c) exact += double{q[c]} * keys[j * kDim + c];
    EXPECT_NEAR(all[j], 0.125 * exact, 1e-5) << "key " << j;
  }
}

// SiluMul's polynomial exp: within float rounding of g * sigmoid(g) * up, finite at the ends,
// and the vector body and scalar tail agree wherever a value sits.
TEST(SiluMulTest, MatchesLibmAndIgnoresPosition) {
  std::vector<float> gate = Inputs(), up(gate.size());
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0.5f + static_cast<float>(i % 7);
  std::vector<float> out(gate.size());
  winnow::kernels::SiluMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g = " << g;
    float alone;
    winnow::kernels::SiluMul(&gate[i], &up[i], 1, &alone);
    EXPECT_EQ(alone, out[i]) << "g = " << g;
  }
}

// GeluTanhMul against PyTorch's gelu(approximate="tanh") in double, with the same
// position independence.
TEST(GeluTanhMulTest, MatchesTheTanhFormulaAndIgnoresPosition) {
  std::vector<float> gate = Inputs(), up(gate.size());
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0.5f + static_cast<float>(i % 7);
  std::vector<float> out(gate.size());
  winnow::kernels::GeluTanhMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()),
                               out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    // 0.5 g (1 + tanh(inner)) written without its cancellation for very negative g.
    const double inner = std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g);
    const double want = g / (1.0 + std::exp(-2.0 * inner)) * up[i];
    // The exponent carries float rounding in proportion to its size; past exp's clamp (about
    // g < -10) the result is below 1e-35 instead of smaller still.
    const double tolerance = (1e-6 + 5e-7 * std::fabs(inner)) * std::fabs(want) + 1e-34;
    EXPECT_NEAR(out[i], want, tolerance) << "g = " << g;
    float alone;
    winnow::kernels::GeluTanhMul(&gate[i], &up[i], 1, &alone);
    EXPECT_EQ(alone, out[i]) << "g = " << g;
  }
}

}  // namespace
}  // namespace winnow::kernels::vec
