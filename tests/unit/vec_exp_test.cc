#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace winnow::kernels::vec
