// kernels/cuda/ops.h against the CPU forward's ops (kernels/cpu/ops.h, the embedding lookup),
// for fp16 and bf16 activations. Tolerances: u is the type's unit roundoff (2^-11 fp16, 2^-8
// bf16); a GPU result rounded to the type is within u of its float value, which differs from
// the CPU's float result by float-rounding noise, hence 2u relative (+1e-6 absolute for results
// near zero). Exact where no float arithmetic differs (gather, bias add, the residual add).
#include "kernels/cuda/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/kernel_test_util.h"

namespace winnow::kernels::cuda {
namespace {

using ::winnow::testing::Allocate;
using ::winnow::testing::Download;
using ::winnow::testing::Download16;
using ::winnow::testing::ExpectClose;
using ::winnow::testing::Half16;
using ::winnow::testing::RandomNormal;
using ::winnow::testing::RoundedTo;
using ::winnow::testing::Synchronize;
using ::winnow::testing::Upload;
using ::winnow::testing::Upload16;

template <typename T>
class OpsTest : public ::winnow::testing::CudaTest {
 protected:
  static constexpr KvDtype kDtype = Half16<T>::kDtype;
  static constexpr double kRel = 2 * Half16<T>::kRoundoff;
};

struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return Half16<T>::kDtype == KvDtype::kF16 ? "f16" : "bf16";
  }
};
using Types16 = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(OpsTest, Types16, TypeNames);

TYPED_TEST(OpsTest, EmbeddingGatherTakesTableRowsAndCallerRows) {
  using T = TypeParam;
  const int64_t vocab = 50, hidden = 300;
  const std::vector<float> table = RoundedTo(this->kDtype, RandomNormal(vocab * hidden, 1));
  const std::vector<float> embeddings = RandomNormal(2 * hidden, 2);
  // Row 2 and 5 take caller rows (in that order), row 6 has an id outside the vocabulary.
  const std::vector<int32_t> ids = {0, 49, kEmbeddingInputId, 7, 7, kEmbeddingInputId, 50};
  const std::vector<int32_t> embedding_rows = {-1, -1, 0, -1, -1, 1, -1};
  const int64_t rows = static_cast<int64_t>(ids.size());
  auto d_table = Upload16<T>(table);
  auto d_embeddings = Upload(embeddings);
  auto d_ids = Upload(ids);
  auto d_embedding_rows = Upload(embedding_rows);
  auto d_out = Allocate<float>(rows * hidden);
  ASSERT_TRUE(EmbeddingGather<T>(d_table.data(), vocab, hidden, d_ids.data(),
                                 d_embedding_rows.data(), d_embeddings.data(), rows,
                                 d_out.data(), nullptr)
                  .ok());
  ASSERT_TRUE(Synchronize().ok());
  std::vector<float> want(rows * hidden, 0.0f);
  int64_t next_embedding = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hidden; ++c) {
      if (ids[r] == kEmbeddingInputId) {
        want[r * hidden + c] = embeddings[next_embedding * hidden + c];
      } else if (ids[r] < vocab) {
        want[r * hidden + c] = table[ids[r] * hidden + c];
      }
    }
    if (ids[r] == kEmbeddingInputId) ++next_embedding;
  }
  ExpectClose(Download(d_out), want, 0, 0, "embedding rows");
}

TYPED_TEST(OpsTest, RmsNormWithAndWithoutTheResidualAdd) {
  using T = TypeParam;
  const int64_t rows = 5, hidden = 300;  // hidden not a multiple of the block
  const float eps = 1e-5f;
  const std::vector<float> x = RandomNormal(rows * hidden, 3, 3.0f);
  const std::vector<float> delta = RoundedTo(this->kDtype, RandomNormal(rows * hidden, 4));
  const std::vector<float> weight = RandomNormal(hidden, 5);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused residual add" : "norm only");
    std::vector<float> want_x = x;
    if (fused) AddInPlace(want_x.data(), delta.data(), rows * hidden);
    std::vector<float> want(rows * hidden);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::RmsNorm(want_x.data() + r * hidden, weight.data(), hidden, eps,
                       want.data() + r * hidden);
    }
    auto d_x = Upload(x);
    auto d_delta = Upload16<T>(delta);
    auto d_weight = Upload(weight);
    auto d_out = Allocate<T>(rows * hidden);
    ASSERT_TRUE(RmsNorm<T>(d_x.data(), fused ? d_delta.data() : nullptr, d_weight.data(), rows,
                           hidden, eps, d_out.data(), nullptr)
                    .ok());
    ASSERT_TRUE(Synchronize().ok());
    ExpectClose(Download(d_x), want_x, 0, 0, "residual stream");
    ExpectClose(Download16(d_out), want, this->kRel, 1e-6, "normalised rows");
  }
}

// QK-norm over 3 rows of 5 heads of 128 (qwen3's head_dim) and of 6 heads of 40 (not a
// multiple of the warp).
TYPED_TEST(OpsTest, HeadRmsNormNormalisesEveryHeadInPlace) {
  using T = TypeParam;
  const float eps = 1e-6f;
  for (int32_t dim : {128, 40}) {
    SCOPED_TRACE(dim);
    const int64_t vectors = dim == 128 ? 15 : 18;
    const std::vector<float> x = RoundedTo(this->kDtype, RandomNormal(vectors * dim, 6, 2.0f));
    const std::vector<float> weight = RandomNormal(dim, 7);
    std::vector<float> want(vectors * dim);
    for (int64_t v = 0; v < vectors; ++v) {
      kernels::RmsNorm(x.data() + v * dim, weight.data(), dim, eps, want.data() + v * dim);
    }
    auto d_x = Upload16<T>(x);
    auto d_weight = Upload(weight);
    ASSERT_TRUE(HeadRmsNorm<T>(d_x.data(), d_weight.data(), vectors, dim, eps, nullptr).ok());
    ASSERT_TRUE(Synchronize().ok());
    ExpectClose(Download16(d_x), want, this->kRel, 1e-6, "normalised heads");
  }
}

// Llama-3-like frequencies with linear scaling and a YaRN-like attention factor, a partial
// rotary dimension, positions up to 2^17, Q and K inside one fused QKV row.
TYPED_TEST(OpsTest, RopeMatchesTheCpuForBothLayouts) {
  using T = TypeParam;
  const int32_t heads = 6, kv_heads = 2, head_dim = 64, rope_dim = 48;
  const int64_t stride = int64_t{heads + 2 * kv_heads} * head_dim;
  const std::vector<int32_t> positions = {0, 7, 1000, 131071};
  const int64_t rows = static_cast<int64_t>(positions.size());
  std::vector<float> inv_freq(rope_dim / 2);
  for (int32_t i = 0; i < rope_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rope_dim) / 4.0);
  }
  const float attn_factor = 1.1f;
  const std::vector<float> qkv = RoundedTo(this->kDtype, RandomNormal(rows * stride, 6));
  for (RopeLayout layout : {RopeLayout::kAdjacent, RopeLayout::kHalves}) {
    SCOPED_TRACE(layout == RopeLayout::kAdjacent ? "adjacent (llama)" : "halves (qwen2)");
    std::vector<float> want = qkv;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = want.data() + r * stride;
      kernels::ApplyRope(row, heads, head_dim, rope_dim, positions[r], inv_freq.data(),
                         attn_factor, layout);
      kernels::ApplyRope(row + heads * head_dim, kv_heads, head_dim, rope_dim, positions[r],
                         inv_freq.data(), attn_factor, layout);
    }
    auto d_qkv = Upload16<T>(qkv);
    auto d_positions = Upload(positions);
    auto d_inv_freq = Upload(inv_freq);
    T* q = d_qkv.data();
    ASSERT_TRUE(ApplyRope<T>(q, stride, heads, q + heads * head_dim, stride, kv_heads, rows,
                             head_dim, rope_dim, d_positions.data(), d_inv_freq.data(),
                             attn_factor, layout, nullptr)
                    .ok());
    ASSERT_TRUE(Synchronize().ok());
    // V and the unrotated dimensions must come back unchanged (within the same tolerance,
    // which for unchanged values means exactly).
    ExpectClose(Download16(d_qkv), want, this->kRel, 1e-6, "rotated QKV rows");
  }
}

TYPED_TEST(OpsTest, SiluMulOnAFusedGateUpOutputAndInPlace) {
  using T = TypeParam;
  const int64_t rows = 3, cols = 200;
  const std::vector<float> gate_up =
      RoundedTo(this->kDtype, RandomNormal(rows * 2 * cols, 7, 3.0f));
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    kernels::SiluMul(gate_up.data() + r * 2 * cols, gate_up.data() + r * 2 * cols + cols, cols,
                     want.data() + r * cols);
  }
  auto d_gate_up = Upload16<T>(gate_up);
  auto d_out = Allocate<T>(rows * cols);
  ASSERT_TRUE(SiluMul<T>(d_gate_up.data(), d_gate_up.data() + cols, rows, cols, 2 * cols,
                         d_out.data(), nullptr)
                  .ok());
  ASSERT_TRUE(Synchronize().ok());
  ExpectClose(Download16(d_out), want, this->kRel, 1e-6, "fused gate|up");

  // Separate buffers, the result written over gate.
  std::vector<float> gate(gate_up.begin(), gate_up.begin() + rows * cols);
  std::vector<float> up(gate_up.begin() + rows * cols, gate_up.end());
  std::vector<float> want_separate(rows * cols);
  kernels::SiluMul(gate.data(), up.data(), rows * cols, want_separate.data());
  auto d_gate = Upload16<T>(gate);
  auto d_up = Upload16<T>(up);
  ASSERT_TRUE(
      SiluMul<T>(d_gate.data(), d_up.data(), rows, cols, cols, d_gate.data(), nullptr).ok());
  ASSERT_TRUE(Synchronize().ok());
  ExpectClose(Download16(d_gate), want_separate, this->kRel, 1e-6, "in place over gate");
}

TYPED_TEST(OpsTest, AddBiasRoundsLikeTheCpu) {
  using T = TypeParam;
  const int64_t rows = 4, cols = 130;
  const std::vector<float> x = RoundedTo(this->kDtype, RandomNormal(rows * cols, 8));
  const std::vector<float> bias = RandomNormal(cols, 9);
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) AddInPlace(want.data() + r * cols, bias.data(), cols);
  want = RoundedTo(this->kDtype, want);  // the sum is float on both sides, then one rounding
  auto d_x = Upload16<T>(x);
  auto d_bias = Upload(bias);
  ASSERT_TRUE(AddBias<T>(d_x.data(), d_bias.data(), rows, cols, nullptr).ok());
  ASSERT_TRUE(Synchronize().ok());
  ExpectClose(Download16(d_x), want, 0, 0, "biased rows");
}

// Argument checks run before any launch, so they are tested without a GPU too.
class LogSumExpRowsTest : public ::winnow::testing::CudaTest {};

TEST_F(LogSumExpRowsTest, MatchesTheDoubleSumOnTheHost) {
  // A vocabulary-sized row with logits of a model's range, a row of one large value, and rows
  // that are not a multiple of the block size long.
  for (const int64_t cols : {int64_t{128256}, int64_t{49152}, int64_t{1000}, int64_t{3}}) {
    const int64_t rows = 5;
    std::vector<float> x = RandomNormal(rows * cols, 11, 4.0f);
    x[2 * cols + cols / 2] = 80.0f;
    auto d_x = Upload(x);
    auto d_out = Allocate<float>(rows);
    ASSERT_TRUE(LogSumExpRows(d_x.data(), rows, cols, d_out.data(), nullptr).ok());
    ASSERT_TRUE(Synchronize().ok());
    const std::vector<float> got = Download(d_out);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * cols;
      const float max_value = *std::max_element(row, row + cols);
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(row[c]) - max_value);
      const double want = max_value + std::log(sum);
      EXPECT_NEAR(got[r], want, 1e-5 * (1 + std::abs(want))) << "cols " << cols << " row " << r;
    }
  }
}

TEST(OpsArgumentsTest, BadSizesAreInvalidArgumentsNamingTheField) {
  __nv_bfloat16* fake = reinterpret_cast<__nv_bfloat16*>(16);
  absl::Status s = ApplyRope<__nv_bfloat16>(fake, 64, 1, nullptr, 0, 0, 1, 64, 63, nullptr,
                                            nullptr, 1.0f, RopeLayout::kAdjacent, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rope_dim"), std::string::npos) << s;
  s = SiluMul<__nv_bfloat16>(fake, fake, 1, 10, 5, fake, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("in_stride"), std::string::npos) << s;
  s = RmsNorm<__nv_bfloat16>(nullptr, nullptr, nullptr, -1, 8, 1e-5f, fake, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows"), std::string::npos) << s;
  s = EmbeddingGather<__nv_bfloat16>(fake, 0, 8, nullptr, nullptr, nullptr, 1, nullptr, nullptr);
  EXPECT_NE(s.message().find("vocab"), std::string::npos) << s;
  // An empty batch is no work, not an error.
  EXPECT_TRUE(AddBias<__nv_bfloat16>(fake, nullptr, 0, 8, nullptr).ok());
}

}  // namespace
}  // namespace winnow::kernels::cuda
