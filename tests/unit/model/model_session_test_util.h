// Shared fixture for tests that drive a CompressionSession over the real default model
// (WINNOW_TEST_MODEL; skipped without it), following the engine's protocol in
// cache/compression.h: capture during prefill chunks, compress after the last one, then decode
// steps with the session's attention buffer and selector.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/compaction.h"
#include "cache/compression.h"
#include "cache/policies/policy.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"
#include "model/cpu_forward.h"
#include "model/model.h"

namespace winnow::testing_util {

class ModelSessionTest : public ::testing::Test {
 protected:
  static constexpr int32_t kModelBlock = 16;
  using Params = cache::policies::PolicyParams;

  static void SetUpTestSuite() {
    const char* path = std::getenv("WINNOW_TEST_MODEL");
    if (path == nullptr || !std::filesystem::exists(path)) return;
    auto loaded = model::Model::Load(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = loaded->release();
    threads_ = new kernels::ThreadPool(2);
    forward_ = new model::CpuForward(*model_, *threads_);
  }
  static void TearDownTestSuite() {
    delete forward_;
    delete threads_;
    delete model_;
    forward_ = nullptr;
    threads_ = nullptr;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "WINNOW_TEST_MODEL not set";
    pool_ = *cache::BlockPool::Create(model_->KvLayoutFor(kModelBlock), L() * 40);
  }

  static int32_t L() { return model_->config().num_layers; }
  static int32_t H() { return model_->config().num_heads; }

  // `lead` followed by " 1, 2, ..., 40,": a prompt whose continuation depends on its end.
  static std::vector<int32_t> CountingPrompt(const std::string& lead = "Count with me:") {
    std::string text = lead;
    for (int i = 1; i <= 40; ++i) absl::StrAppend(&text, " ", i, ",");
    return model_->tokenizer().Encode(text, true, true);
  }

  std::unique_ptr<cache::CompressionSession> Session(const std::string& policy, double budget,
                                                     int32_t tokens, Params p = {}) {
    const model::ModelConfig& c = model_->config();
    cache::policies::PolicyContext context;
    context.dims = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, kModelBlock};
    context.layout.num_tokens = tokens;
    auto s = cache::CompressionSession::Create(
        policy, cache::policies::PolicyConfig(budget, std::move(p)), context);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Prefills `prompt` in chunks of `chunk` (the session, if any, capturing its observation
  // rows), then compresses. Returns the logits after the prompt; `stats` gets the compaction.
  std::vector<float> PrefillAndCompress(const std::vector<int32_t>& prompt, int32_t chunk,
                                        cache::CompressionSession* session,
                                        cache::SequenceKv& kv,
                                        cache::CompactionStats* stats = nullptr) {
    std::vector<float> logits;
    const int32_t n = static_cast<int32_t>(prompt.size());
    for (int32_t start = 0; start < n; start += chunk) {
      const int32_t count = std::min(chunk, n - start);
      EXPECT_TRUE(kv.Reserve(*pool_, count));
      model::BatchEntry e{&kv, std::span<const int32_t>(prompt).subspan(start, count), {},
                          start, start + count == n ? model::LogitsMode::kLast
                                                    : model::LogitsMode::kNone};
      if (session != nullptr) e.capture = session->PrefillCapture(start, count);
      model::ForwardOutput out;
      EXPECT_TRUE(forward_->Forward({&e, 1}, *pool_, &out).ok());
      if (session != nullptr) {
        EXPECT_TRUE(session->AfterPrefillChunk().ok());
      }
      if (start + count == n) logits.assign(out.Row(0).begin(), out.Row(0).end());
    }
    if (session != nullptr) {
      auto st = session->Compress(kv, *pool_, forward_->Scoring(*pool_));
      EXPECT_TRUE(st.ok()) << st.status();
      if (st.ok() && stats != nullptr) *stats = *st;
    }
    EXPECT_EQ(pool_->num_used(), kv.num_blocks_held());
    return logits;
  }

  // One decode step of `token` at `position`, with the session's attention buffer and selector
  // unless `selector` / `probs` replace them, then the session's AfterDecodeStep. Returns the
  // step's logits.
  std::vector<float> DecodeStep(cache::SequenceKv& kv, int32_t token, int32_t position,
                                cache::CompressionSession* session,
                                cache::AttentionSelector* selector = nullptr,
                                std::vector<std::vector<float>>* probs = nullptr) {
    EXPECT_TRUE(kv.Reserve(*pool_, 1));
    model::BatchEntry e{&kv, std::span<const int32_t>(&token, 1), {}, position,
                        model::LogitsMode::kLast};
    if (session != nullptr) {
      e.attention_probs = session->DecodeAttentionBuffer();
      e.selector = session->selector();
    }
    if (selector != nullptr) e.selector = selector;
    if (probs != nullptr) e.attention_probs = probs;
    model::ForwardOutput out;
    EXPECT_TRUE(forward_->Forward({&e, 1}, *pool_, &out).ok());
    if (session != nullptr) {
      auto st = session->AfterDecodeStep(position, kv, *pool_);
      EXPECT_TRUE(st.ok()) << st.status();
    }
    return std::vector<float>(out.Row(0).begin(), out.Row(0).end());
  }

  static int32_t Argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
  }

  static inline model::Model* model_ = nullptr;
  static inline kernels::ThreadPool* threads_ = nullptr;
  static inline model::CpuForward* forward_ = nullptr;
  std::unique_ptr<cache::BlockPool> pool_;
};

}  // namespace winnow::testing_util
