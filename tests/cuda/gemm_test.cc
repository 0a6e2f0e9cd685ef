#include "kernels/cuda/gemm.h"

#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

// The inputs are rounded to the 16-bit type on the host first, so the CPU reference multiplies
// exactly the values the GPU reads (their products are exact in FP32); what is left is the FP32
// summation order and, for a 16-bit output, one rounding of the result: half an ulp, 2^-9
// relative for bf16 and 2^-12 for f16. The tolerance is twice that rounding, plus 1e-4 absolute
// and 1e-4 relative for the summation order (k <= 576 here).
double RelativeTolerance(GemmType output) {
  switch (output) {
    case GemmType::kBF16:
      return 2.0 / 512 + 1e-4;
    case GemmType::kF16:
      return 2.0 / 4096 + 1e-4;
    case GemmType::kF32:
      break;
  }
  return 1e-4;
}
constexpr double kAbsoluteTolerance = 1e-4;

KvDtype HostType(GemmType type) {
  return type == GemmType::kBF16 ? KvDtype::kBF16
                                 : (type == GemmType::kF16 ? KvDtype::kF16 : KvDtype::kF32);
}

// Random values in [-1, 1), rounded to `type`; returns the 16-bit encoding in `encoded`.
std::vector<float> RandomRounded(int64_t n, GemmType type, std::mt19937& rng,
                                 std::vector<std::byte>* encoded) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  encoded->resize(KvRowBytes(HostType(type), static_cast<int32_t>(n)));
  EncodeKv(HostType(type), values.data(), n, encoded->data());
  DecodeKv(HostType(type), encoded->data(), n, values.data());
  return values;
}

class GemmTest : public testing::CudaTest {
 protected:
  // Runs one GEMM on the GPU and checks it against kernels::MatMul on the same values.
  void CheckAgainstCpu(GemmType input, GemmType output, int64_t m, int64_t n, int64_t k) {
    SCOPED_TRACE(::testing::Message() << GemmTypeName(input) << " -> " << GemmTypeName(output)
                                      << " m=" << m << " n=" << n << " k=" << k);
    std::mt19937 rng(static_cast<uint32_t>(m * 1000003 + n * 1009 + k));
    std::vector<std::byte> x_bits, w_bits;
    const std::vector<float> x = RandomRounded(m * k, input, rng, &x_bits);
    const std::vector<float> w = RandomRounded(n * k, input, rng, &w_bits);

    const WeightMatrix cpu_w{GgmlType::kF32, n, k, k * static_cast<int64_t>(sizeof(float)),
                             reinterpret_cast<const uint8_t*>(w.data())};
    std::vector<float> expected(m * n);
    ThreadPool pool(1);
    ASSERT_TRUE(MatMul(cpu_w, x.data(), m, expected.data(), pool).ok());

    auto d_x = DeviceBuffer<std::byte>::FromHost(x_bits);
    auto d_w = DeviceBuffer<std::byte>::FromHost(w_bits);
    const int64_t y_bytes = KvRowBytes(HostType(output), static_cast<int32_t>(m * n));
    auto d_y = DeviceBuffer<std::byte>::Allocate(y_bytes);
    ASSERT_TRUE(d_x.ok() && d_w.ok() && d_y.ok());
    auto gemm = Gemm::Create();
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    const GemmArgs args{input, output, m, n, k, d_x->data(), d_w->data(), d_y->data()};
    ASSERT_TRUE((*gemm)->Run(args, /*stream=*/nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    std::vector<std::byte> y_bits(y_bytes);
    ASSERT_TRUE(d_y->CopyToHost(std::span<std::byte>(y_bits)).ok());
    std::vector<float> actual(m * n);
    DecodeKv(HostType(output), y_bits.data(), m * n, actual.data());
    const double rtol = RelativeTolerance(output);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(actual[i], expected[i], kAbsoluteTolerance + rtol * std::fabs(expected[i]))
          << "row " << i / n << " column " << i % n;
    }
  }
};

TEST_F(GemmTest, MatchesCpuMatMulForEveryTypePair) {
  for (GemmType input : {GemmType::kF16, GemmType::kBF16}) {
    for (GemmType output : {input, GemmType::kF32}) {
      CheckAgainstCpu(input, output, /*m=*/7, /*n=*/96, /*k=*/64);
    }
  }
}

TEST_F(GemmTest, MatchesCpuMatMulForDecodeAndOddShapes) {
  CheckAgainstCpu(GemmType::kBF16, GemmType::kBF16, /*m=*/1, /*n=*/576, /*k=*/576);
  CheckAgainstCpu(GemmType::kF16, GemmType::kF32, /*m=*/33, /*n=*/17, /*k=*/200);
  CheckAgainstCpu(GemmType::kBF16, GemmType::kF32, /*m=*/130, /*n=*/1536, /*k=*/576);
}

TEST_F(GemmTest, BatchedGemmsReadStridedRowsAndSharedInputs) {
  // Three GEMMs as the column sums issue them (kernels/cuda/column_sums.h): x is one head's
  // rows out of a [rows x heads x k] tensor, the first two share w, and y = alpha * x * w^T.
  constexpr int64_t kBatch = 3, m = 5, n = 7, k = 64;
  constexpr int64_t kBf16 = 2;  // bytes
  std::mt19937 rng(7);
  std::vector<std::byte> x_bits, w_bits;
  const std::vector<float> x = RandomRounded(m * kBatch * k, GemmType::kBF16, rng, &x_bits);
  const std::vector<float> w = RandomRounded(2 * n * k, GemmType::kBF16, rng, &w_bits);
  const float alpha = 0.125f;
  auto d_x = DeviceBuffer<std::byte>::FromHost(x_bits);
  auto d_w = DeviceBuffer<std::byte>::FromHost(w_bits);
  auto d_y = DeviceBuffer<float>::Allocate(kBatch * m * n);
  ASSERT_TRUE(d_x.ok() && d_w.ok() && d_y.ok());
  const auto w_of = [](int64_t i) { return i == 2 ? 1 : 0; };
  std::vector<const void*> pointers;
  for (int64_t i = 0; i < kBatch; ++i) pointers.push_back(d_x->data() + i * k * kBf16);
  for (int64_t i = 0; i < kBatch; ++i) pointers.push_back(d_w->data() + w_of(i) * n * k * kBf16);
  for (int64_t i = 0; i < kBatch; ++i) pointers.push_back(d_y->data() + i * m * n);
  auto d_pointers = DeviceBuffer<const void*>::FromHost(pointers);
  ASSERT_TRUE(d_pointers.ok());
  GemmArgs args{GemmType::kBF16,       GemmType::kF32,           m, n, k, d_pointers->data(),
                d_pointers->data() + 3, d_pointers->data() + 6};
  args.ldx = kBatch * k;
  args.alpha = alpha;
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE((*gemm)->RunBatched(args, kBatch, nullptr).ok());
  std::vector<float> y(kBatch * m * n);
  ASSERT_TRUE(d_y->CopyToHost(std::span<float>(y)).ok());
  for (int64_t i = 0; i < kBatch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double want = 0;
        for (int64_t t = 0; t < k; ++t) {
          want += double{x[(r * kBatch + i) * k + t]} * w[(w_of(i) * n + c) * k + t];
        }
        want *= alpha;
        ASSERT_NEAR(y[(i * m + r) * n + c], want, 1e-4 + 1e-4 * std::fabs(want))
            << "batch " << i << " row " << r << " column " << c;
      }
    }
  }
}

TEST_F(GemmTest, NoRowsIsANoOp) {
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  EXPECT_TRUE((*gemm)->Run(GemmArgs{GemmType::kF16, GemmType::kF16, 0, 8, 8}, nullptr).ok());
}

TEST_F(GemmTest, RejectsBadArgumentsNamingTheField) {
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const auto message_of = [&](const GemmArgs& args) {
    return std::string((*gemm)->Run(args, nullptr).message());
  };
  int dummy = 0;
  const GemmArgs good{GemmType::kBF16, GemmType::kBF16, 2, 8, 8, &dummy, &dummy, &dummy};
  GemmArgs bad = good;
  bad.output = GemmType::kF16;
  EXPECT_NE(message_of(bad).find("output type"), std::string::npos) << message_of(bad);
  bad = good;
  bad.input = GemmType::kF32;
  EXPECT_NE(message_of(bad).find("input type"), std::string::npos) << message_of(bad);
  bad = good;
  bad.k = 0;
  EXPECT_NE(message_of(bad).find("k = 0"), std::string::npos) << message_of(bad);
  bad = good;
  bad.ldx = 4;
  EXPECT_NE(message_of(bad).find("ldx = 4"), std::string::npos) << message_of(bad);
  bad = good;
  bad.w = nullptr;
  EXPECT_NE(message_of(bad).find("w is null"), std::string::npos) << message_of(bad);
}

}  // namespace
}  // namespace winnow::kernels::cuda
