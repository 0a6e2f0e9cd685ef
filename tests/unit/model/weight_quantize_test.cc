// model/weight_quantize.h: which matrices --cpu-weight-type rewrites and which it leaves, the
// flag's names, and Model::Load applying it. tests/python/test_hf_model.py measures a real
// directory's accuracy; tests/python/test_weight_quantize.py checks the blocks against gguf-py.
#include "model/weight_quantize.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "kernels/cpu/dequantize.h"

namespace winnow::model {
namespace {

using kernels::GgmlType;
using kernels::WeightMatrix;

// Float32 bytes of a rows x cols matrix, element (r, c) = (r - c) / 64.
std::vector<float> Values(int64_t rows, int64_t cols) {
  std::vector<float> v(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) v[i] = static_cast<float>(i / cols - i % cols) / 64;
  return v;
}

WeightMatrix F32(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return {GgmlType::kF32, rows, cols, cols * 4, reinterpret_cast<const uint8_t*>(v.data())};
}

TEST(CpuWeightTypeTest, NamesRoundTripAndUnknownOnesListTheChoices) {
  for (const char* name : {"none", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}) {
    absl::StatusOr<std::optional<GgmlType>> type = ParseCpuWeightType(name);
    ASSERT_TRUE(type.ok()) << name;
    EXPECT_EQ(CpuWeightTypeName(*type), name);
  }
  EXPECT_FALSE(ParseCpuWeightType("none")->has_value());
  EXPECT_EQ(*ParseCpuWeightType("q8_0"), GgmlType::kQ8_0);
  const absl::Status bad = ParseCpuWeightType("q4_k").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "must be one of none, q8_0, q4_0, q4_1, q5_0, q5_1; got 'q4_k'");
}

// Float matrices of whole blocks become the type (a tied head still shares the embeddings');
// a quantised matrix, one of another width and the norms stay as they were.
TEST(QuantizeWeightsTest, RewritesTheFloatMatricesOnly) {
  const std::vector<float> embd = Values(10, 64), q = Values(64, 64), odd = Values(8, 48);
  const std::vector<uint8_t> q8(8 * kernels::RowBytes(GgmlType::kQ8_0, 64), 0);
  ModelWeights w;
  w.token_embd = F32(embd, 10, 64);
  w.output = w.token_embd;  // tied
  w.output_norm.assign(64, 1.0f);
  LayerWeights layer;
  layer.attn_norm.assign(64, 1.0f);
  layer.wq = F32(q, 64, 64);
  layer.wk = F32(odd, 8, 48);
  layer.wv = {GgmlType::kQ8_0, 8, 64, kernels::RowBytes(GgmlType::kQ8_0, 64), q8.data()};
  layer.wo = layer.w_gate = layer.w_up = layer.w_down = layer.wq;
  w.layers.push_back(layer);

  absl::StatusOr<std::shared_ptr<const void>> owner = QuantizeWeights(GgmlType::kQ4_0, 3, &w);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ASSERT_NE(owner->get(), nullptr);
  EXPECT_EQ(w.token_embd.type, GgmlType::kQ4_0);
  EXPECT_EQ(w.token_embd.row_bytes, kernels::RowBytes(GgmlType::kQ4_0, 64));
  EXPECT_EQ(w.output.data, w.token_embd.data);
  const LayerWeights& l = w.layers[0];
  for (const WeightMatrix* m : {&l.wq, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
    EXPECT_EQ(m->type, GgmlType::kQ4_0);
    EXPECT_EQ(m->data, l.wq.data);  // one source, rewritten once
  }
  EXPECT_NE(l.wq.data, reinterpret_cast<const uint8_t*>(q.data()));
  EXPECT_EQ(l.wk.type, GgmlType::kF32);
  EXPECT_EQ(l.wk.data, reinterpret_cast<const uint8_t*>(odd.data()));
  EXPECT_EQ(l.wv.data, q8.data());
  EXPECT_EQ(l.attn_norm, std::vector<float>(64, 1.0f));

  // The rewritten rows read back within Q4_0's step (max |x| / 8 per block).
  std::vector<float> row(64);
  ASSERT_TRUE(kernels::GetRow(w.token_embd, 9, row.data()).ok());
  for (int c = 0; c < 64; ++c) EXPECT_NEAR(row[c], embd[9 * 64 + c], 54.0f / 64 / 8) << c;
}

TEST(QuantizeWeightsTest, NothingToRewriteOwnsNothing) {
  ModelWeights w;
  absl::StatusOr<std::shared_ptr<const void>> owner = QuantizeWeights(GgmlType::kQ8_0, 1, &w);
  ASSERT_TRUE(owner.ok());
  EXPECT_EQ(owner->get(), nullptr);
  EXPECT_FALSE(QuantizeWeights(GgmlType::kQ6_K, 1, &w).ok());
}

// A GGUF's quantised tensors stay as stored (the default model: Q4_1 layers, Q8_0 embeddings;
// only its norms are float, and those are vectors).
TEST(QuantizeWeightsTest, LoadKeepsAGgufsQuantisedTensors) {
  const char* path = std::getenv("WINNOW_TEST_MODEL");
  if (path == nullptr || !std::filesystem::exists(path)) GTEST_SKIP() << "WINNOW_TEST_MODEL";
  absl::StatusOr<std::unique_ptr<Model>> plain = Model::Load(path);
  absl::StatusOr<std::unique_ptr<Model>> q =
      Model::Load(path, "", CpuWeightOptions{GgmlType::kQ8_0, 2});
  ASSERT_TRUE(plain.ok() && q.ok()) << q.status();
  const ModelWeights& a = (*plain)->weights();
  const ModelWeights& b = (*q)->weights();
  EXPECT_EQ(b.token_embd.type, a.token_embd.type);
  EXPECT_EQ(b.layers[0].wq.type, a.layers[0].wq.type);
  EXPECT_EQ(b.layers[0].w_down.type, GgmlType::kQ4_1);
}

}  // namespace
}  // namespace winnow::model
