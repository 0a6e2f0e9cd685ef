// The forward pass on the real default model: batch composition and chunking must not change a
// sequence's logits, and bad batches are errors rather than crashes.
#include "model/cpu_forward.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>

#include "model/model.h"

namespace winnow::model {
namespace {

class ModelTest : public ::testing::Test {
 protected:
  // The model, loaded once, and a forward per activation mode (index: CpuActivations).
  static void SetUpTestSuite() {
    const char* path = std::getenv("WINNOW_TEST_MODEL");
    if (path == nullptr || !std::filesystem::exists(path)) return;
    auto loaded = Model::Load(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    loaded_ = loaded->release();
    threads_ = new kernels::ThreadPool(2);
    for (CpuActivations a : {CpuActivations::kF32, CpuActivations::kQ8}) {
      forwards_[static_cast<int>(a)] = new CpuForward(*loaded_, *threads_, a);
    }
  }
  static void TearDownTestSuite() {
    for (CpuForward*& f : forwards_) {
      delete f;
      f = nullptr;
    }
    delete threads_;
    delete loaded_;
    threads_ = nullptr;
    loaded_ = nullptr;
  }
  virtual CpuActivations Activations() const { return CpuActivations::kF32; }
  void SetUp() override {
    model_ = loaded_;
    forward_ = forwards_[static_cast<int>(Activations())];
    if (model_ == nullptr) GTEST_SKIP() << "WINNOW_TEST_MODEL not set";
    pool_ = *cache::BlockPool::Create(model_->KvLayoutFor(16), 30 * 16);
  }

  // Prefills `prompt` in one call and greedily decodes `steps` tokens alone in the pool;
  // returns the logits after the prompt and after each decoded token.
  std::vector<std::vector<float>> RunAlone(const std::vector<int32_t>& prompt, int steps) {
    cache::SequenceKv kv(model_->config().num_layers, 16);
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> next = prompt;
    int32_t position = 0;
    for (int s = 0; s <= steps; ++s) {
      EXPECT_TRUE(kv.Reserve(*pool_, static_cast<int32_t>(next.size())));
      BatchEntry e{&kv, next, {}, position, LogitsMode::kLast};
      ForwardOutput out;
      EXPECT_TRUE(forward_->Forward({&e, 1}, *pool_, &out).ok());
      rows.emplace_back(out.Row(0).begin(), out.Row(0).end());
      position += static_cast<int32_t>(next.size());
      next = {Argmax(rows.back())};
    }
    kv.Release(*pool_);
    return rows;
  }

  static int32_t Argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
  }

  static inline Model* loaded_ = nullptr;
  static inline kernels::ThreadPool* threads_ = nullptr;
  static inline CpuForward* forwards_[2] = {nullptr, nullptr};
  Model* model_ = nullptr;
  CpuForward* forward_ = nullptr;
  std::unique_ptr<cache::BlockPool> pool_;
};

std::vector<int32_t> Tokens(const Model& m, const std::string& text) {
  return m.tokenizer().Encode(text, true, true);
}

// Batching invariance holds for every KV dtype and both activation modes: a row is converted and
// quantised the same way whatever batch wrote or reads it.
class ModelDtypeTest
    : public ModelTest,
      public ::testing::WithParamInterface<std::tuple<kernels::KvDtype, CpuActivations>> {
 protected:
  CpuActivations Activations() const override { return std::get<1>(GetParam()); }
  void SetUp() override {
    ModelTest::SetUp();
    if (model_ != nullptr) {
      pool_ = *cache::BlockPool::Create(model_->KvLayoutFor(16, std::get<0>(GetParam())), 30 * 16);
    }
  }
};

TEST_P(ModelDtypeTest, MixedBatchGivesEachSequenceItsSoloLogits) {
  const std::vector<int32_t> a = Tokens(*model_, "The quick brown fox jumps over the lazy dog. "
                                                 "Then it ran into the forest and");
  const std::vector<int32_t> b = Tokens(*model_, "In 1969, the first humans landed on");
  const auto solo_a = RunAlone(a, 2);
  const auto solo_b = RunAlone(b, 0);

  // Iteration 1: A's whole prompt. Iteration 2: A's first decode token with B's first chunk.
  // Iteration 3: A's second decode token with the rest of B's prompt.
  cache::SequenceKv kv_a(model_->config().num_layers, 16), kv_b(model_->config().num_layers, 16);
  ForwardOutput out;
  ASSERT_TRUE(kv_a.Reserve(*pool_, static_cast<int32_t>(a.size())));
  BatchEntry first{&kv_a, a, {}, 0, LogitsMode::kLast};
  ASSERT_TRUE(forward_->Forward({&first, 1}, *pool_, &out).ok());
  std::vector<float> a_logits(out.Row(0).begin(), out.Row(0).end());
  EXPECT_EQ(a_logits, solo_a[0]);

  const int32_t split = 3;
  const std::vector<int32_t> b_head(b.begin(), b.begin() + split);
  const std::vector<int32_t> b_tail(b.begin() + split, b.end());
  int32_t a_pos = static_cast<int32_t>(a.size());
  for (int step = 1; step <= 2; ++step) {
    const int32_t token = Argmax(a_logits);
    const std::vector<int32_t>& b_chunk = step == 1 ? b_head : b_tail;
    ASSERT_TRUE(kv_a.Reserve(*pool_, 1));
    ASSERT_TRUE(kv_b.Reserve(*pool_, static_cast<int32_t>(b_chunk.size())));
    BatchEntry batch[2] = {
        {&kv_b, b_chunk, {}, step == 1 ? 0 : split,
         step == 1 ? LogitsMode::kNone : LogitsMode::kLast},
        {&kv_a, {&token, 1}, {}, a_pos, LogitsMode::kLast},
    };
    ASSERT_TRUE(forward_->Forward(batch, *pool_, &out).ok());
    const int32_t a_row = out.first_row[1];
    a_logits.assign(out.Row(a_row).begin(), out.Row(a_row).end());
    EXPECT_EQ(a_logits, solo_a[step]) << "decode step " << step;
    if (step == 2) {
      const auto row = out.Row(out.first_row[0]);
      EXPECT_EQ(std::vector<float>(row.begin(), row.end()), solo_b[0]);
    }
    ++a_pos;
  }
  kv_a.Release(*pool_);
  kv_b.Release(*pool_);
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());
}

INSTANTIATE_TEST_SUITE_P(
    AllKvDtypes, ModelDtypeTest,
    ::testing::Combine(::testing::Values(kernels::KvDtype::kF32, kernels::KvDtype::kF16,
                                         kernels::KvDtype::kBF16, kernels::KvDtype::kQ8_0),
                       ::testing::Values(CpuActivations::kF32, CpuActivations::kQ8)),
    [](const auto& info) {
      return std::string(kernels::KvDtypeName(std::get<0>(info.param))) + "_" +
             std::string(CpuActivationsName(std::get<1>(info.param)));
    });

TEST_F(ModelTest, BadBatchesAreErrorsNotCrashes) {
  cache::SequenceKv kv(model_->config().num_layers, 16);
  ForwardOutput out;
  const std::vector<int32_t> bad = {1, model_->config().vocab_size};
  ASSERT_TRUE(kv.Reserve(*pool_, 2));
  BatchEntry e{&kv, bad, {}, 0, LogitsMode::kLast};
  EXPECT_EQ(forward_->Forward({&e, 1}, *pool_, &out).code(), absl::StatusCode::kInvalidArgument);

  const std::vector<int32_t> too_many(40, 1);  // capacity reserved for 16 only
  BatchEntry unreserved{&kv, too_many, {}, 0, LogitsMode::kLast};
  EXPECT_EQ(forward_->Forward({&unreserved, 1}, *pool_, &out).code(),
            absl::StatusCode::kFailedPrecondition);

  const std::vector<int32_t> embedded = {kEmbeddingInput};
  BatchEntry missing_rows{&kv, embedded, {}, 0, LogitsMode::kLast};
  EXPECT_EQ(forward_->Forward({&missing_rows, 1}, *pool_, &out).code(),
            absl::StatusCode::kInvalidArgument);
  kv.Release(*pool_);
}

TEST_F(ModelTest, EmbeddingRowsStandInForTokens) {
  // Feeding a token's own embedding row must give the same logits as feeding the token.
  const std::vector<int32_t> ids = Tokens(*model_, "Hello there, friend");
  const auto solo = RunAlone(ids, 0);
  std::vector<int32_t> mixed = ids;
  mixed[1] = kEmbeddingInput;
  std::vector<float> row(model_->config().hidden_size);
  ASSERT_TRUE(kernels::GetRow(model_->weights().token_embd, ids[1], row.data()).ok());
  cache::SequenceKv kv(model_->config().num_layers, 16);
  ASSERT_TRUE(kv.Reserve(*pool_, static_cast<int32_t>(mixed.size())));
  BatchEntry e{&kv, mixed, row, 0, LogitsMode::kLast};
  ForwardOutput out;
  ASSERT_TRUE(forward_->Forward({&e, 1}, *pool_, &out).ok());
  EXPECT_EQ(std::vector<float>(out.Row(0).begin(), out.Row(0).end()), solo[0]);
  kv.Release(*pool_);
}

}  // namespace
}  // namespace winnow::model
