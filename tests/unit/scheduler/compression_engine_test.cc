// Compression on the real default model (WINNOW_TEST_MODEL): the forward-level guarantees
// (budget 1 changes nothing; a compressed cache keeps generating sensibly) and the engine-level
// ones (freed blocks admit a waiting request; preemption compresses again; bad specs are
// INVALID_ARGUMENT).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "cache/compression.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "tests/unit/model/model_session_test_util.h"

namespace winnow {
namespace {

using cache::CompressionSession;

class CompressionModelTest : public testing_util::ModelSessionTest {
 protected:
  static constexpr int32_t kBlock = kModelBlock;

  struct Run {
    std::vector<std::vector<float>> logits;  // after the prompt, then after each decode step
    std::vector<int32_t> kept_per_layer;
    int32_t blocks_freed = 0;
    int32_t max_slots = 0;  // most slots any layer held after compression
  };

  // Prefills `prompt` in chunks of 24 (so observation rows span chunks), compresses with
  // `session` (null: none), then decodes `steps` greedy tokens. `selector` (optional) replaces
  // the session's during decode.
  Run Generate(const std::vector<int32_t>& prompt, int steps, CompressionSession* session,
               cache::AttentionSelector* selector = nullptr) {
    Run run;
    cache::SequenceKv kv(L(), kBlock);
    const int32_t n = static_cast<int32_t>(prompt.size());
    cache::CompactionStats stats;
    run.logits.push_back(PrefillAndCompress(prompt, 24, session, kv, &stats));
    if (session != nullptr) {
      run.kept_per_layer = session->stats().kept_per_layer;
      run.blocks_freed = stats.blocks_freed;
    }
    for (int s = 0; s < steps; ++s) {
      run.logits.push_back(DecodeStep(kv, Argmax(run.logits.back()), n + s, session, selector));
      for (int32_t l = 0; l < L(); ++l) run.max_slots = std::max(run.max_slots, kv.num_slots(l));
      EXPECT_EQ(pool_->num_used(), kv.num_blocks_held());
    }
    kv.Release(*pool_);
    EXPECT_EQ(pool_->num_used(), 0);
    return run;
  }
};

TEST_F(CompressionModelTest, BudgetOneGivesIdenticalLogits) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const Run full = Generate(prompt, 6, nullptr);
  for (const char* policy : {"streaming_llm", "h2o", "snapkv", "pyramidkv", "kvzip"}) {
    std::unique_ptr<CompressionSession> session =
        Session(policy, 1.0, static_cast<int32_t>(prompt.size()));
    const Run run = Generate(prompt, 6, session.get());
    EXPECT_EQ(run.blocks_freed, 0) << policy;
    ASSERT_EQ(run.logits.size(), full.logits.size());
    for (size_t i = 0; i < full.logits.size(); ++i) {
      EXPECT_EQ(run.logits[i], full.logits[i]) << policy << " step " << i;
    }
  }
}

// Selects every past slot: must be exactly the dense path.
class SelectAll : public cache::AttentionSelector {
 public:
  bool Select(int32_t, std::span<const float>, int32_t, int32_t past, const cache::SequenceKv&,
              std::vector<int32_t>* slots) override {
    for (int32_t i = 0; i < past; ++i) slots->push_back(i);
    return true;
  }
};

// Selects the first 4 and the last 8 past slots.
class SelectSinksAndRecent : public cache::AttentionSelector {
 public:
  bool Select(int32_t, std::span<const float>, int32_t, int32_t past, const cache::SequenceKv&,
              std::vector<int32_t>* slots) override {
    for (int32_t i = 0; i < past; ++i) {
      if (i < 4 || i >= past - 8) slots->push_back(i);
    }
    return true;
  }
};

TEST_F(CompressionModelTest, SelectorPathMatchesDenseAndSparseEqualsEviction) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const Run full = Generate(prompt, 4, nullptr);
  SelectAll all;
  const Run selected = Generate(prompt, 4, nullptr, &all);
  for (size_t i = 0; i < full.logits.size(); ++i) EXPECT_EQ(selected.logits[i], full.logits[i]);
  // Attending only to sinks + recent must differ from the full cache (the test is not vacuous).
  SelectSinksAndRecent sparse;
  const Run narrow = Generate(prompt, 1, nullptr, &sparse);
  EXPECT_NE(narrow.logits[1], full.logits[1]);
}

TEST_F(CompressionModelTest, CompressedCacheKeepsGeneratingTheSameContinuation) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int steps = 8;
  const Run full = Generate(prompt, steps, nullptr);
  for (const char* policy : {"snapkv", "pyramidkv", "kvzip", "h2o", "streaming_llm"}) {
    const bool evicts = std::string(policy) == "h2o" || std::string(policy) == "streaming_llm";
    std::unique_ptr<CompressionSession> session =
        evicts ? Session(policy, 0.5, n, {{"evict_every", 4.0}})
               : Session(policy, 0.5, n, {{"window", 8.0}});
    const Run run = Generate(prompt, steps, session.get());
    EXPECT_GT(run.blocks_freed, 0) << policy;
    int64_t kept = 0;
    for (int32_t k : run.kept_per_layer) kept += k;
    EXPECT_LE(kept, int64_t{L()} * (n / 2)) << policy;
    // The first token comes from the full cache; the next ones from the compressed one.
    EXPECT_EQ(run.logits[0], full.logits[0]);
    int agree = 0;
    for (int s = 1; s <= steps; ++s) agree += Argmax(run.logits[s]) == Argmax(full.logits[s]);
    EXPECT_GE(agree, steps - 2) << policy;
    if (evicts) {
      // Decode-time eviction keeps the cache within budget x tokens seen + the slack.
      EXPECT_LT(run.max_slots, (n + steps) / 2 + 4 + 1) << policy;
    }
  }
}

// A lookahead policy decodes its first tokens on the whole prompt (the full cache's logits
// exactly), then compresses with their attention and frees blocks.
TEST_F(CompressionModelTest, LookaheadCompressesAfterTheRepliesFirstTokens) {
  const std::vector<int32_t> prompt = CountingPrompt();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int steps = 8;
  const int lookahead = 4;
  const Run full = Generate(prompt, steps, nullptr);
  std::unique_ptr<CompressionSession> session =
      Session("winnowkv", 0.5, n, {{"window", 8.0}, {"lookahead", double{lookahead}}});
  ASSERT_EQ(session->LookaheadSteps(), lookahead);
  const Run run = Generate(prompt, steps, session.get());
  EXPECT_EQ(run.blocks_freed, 0);  // nothing at the end of the prefill
  for (int s = 0; s <= lookahead; ++s) EXPECT_EQ(run.logits[s], full.logits[s]) << s;
  EXPECT_FALSE(session->prompt_plan_pending());
  EXPECT_GT(session->stats().blocks_freed, 0);
  ASSERT_EQ(session->stats().kept_per_layer.size(), static_cast<size_t>(L()));
  int64_t kept = 0;
  for (int32_t k : session->stats().kept_per_layer) kept += k;
  // About half the prompt plus the lookahead's tokens, which are kept.
  EXPECT_LE(kept, int64_t{L()} * (n / 2 + 1 + lookahead));
  EXPECT_GT(kept, int64_t{L()} * lookahead);
  int agree = 0;
  for (int s = lookahead + 1; s <= steps; ++s) {
    agree += Argmax(run.logits[s]) == Argmax(full.logits[s]);
  }
  EXPECT_GE(agree, steps - lookahead - 1);
}

// ---------------------------------------------------------------------------------------------
// Engine.

class Sink : public scheduler::RequestSink {
 public:
  void OnTokens(const scheduler::TokenEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.insert(tokens_.end(), e.token_ids.begin(), e.token_ids.end());
  }
  void OnFinish(const scheduler::FinishEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    finish_ = e;
    done_ = true;
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(300), [this] { return done_; });
  }
  scheduler::FinishEvent finish() {
    std::lock_guard<std::mutex> lock(mu_);
    return finish_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  scheduler::FinishEvent finish_;
  bool done_ = false;
};

// Records the order of starts, finishes and compressions (engine thread; read after idle).
class Recorder : public scheduler::EngineObserver {
 public:
  void OnRequestStarted(uint64_t id, absl::Duration) override { Log(absl::StrCat("start ", id)); }
  void OnRequestFinished(const scheduler::RequestStats& s) override {
    Log(absl::StrCat("finish ", s.id));
  }
  void OnPreemption(uint64_t id) override { Log(absl::StrCat("preempt ", id)); }
  void OnCompression(const scheduler::CompressionEvent& e) override {
    Log(absl::StrCat(e.prefill ? "compress " : "evict ", e.id));
    EXPECT_LE(e.slots_after, e.slots_before);
  }
  void OnSchedulerState(const scheduler::SchedulerState& s) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_free_ = s.kv_blocks_free;
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int Index(const std::string& event) {
    const std::vector<std::string> e = events();
    auto it = std::find(e.begin(), e.end(), event);
    return it == e.end() ? -1 : static_cast<int>(it - e.begin());
  }
  int Count(const std::string& event) {
    const std::vector<std::string> e = events();
    return static_cast<int>(std::count(e.begin(), e.end(), event));
  }

 private:
  void Log(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(s));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
  int32_t last_free_ = -1;
};

class CompressionEngineTest : public CompressionModelTest {
 protected:
  std::unique_ptr<scheduler::Engine> MakeEngine(int32_t blocks_per_layer, Recorder* recorder) {
    scheduler::EngineOptions options;
    options.kv_blocks = L() * blocks_per_layer;
    options.block_size = kBlock;
    auto engine = scheduler::Engine::Create(model_, options, recorder);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  static std::vector<int32_t> Prompt(int n, int seed) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(200 + (seed * 7919 + i * 104729) % 20000);
    return ids;
  }
  static scheduler::GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens,
                                              const std::string& policy = "",
                                              double budget = 0.0) {
    scheduler::GenerationRequest r;
    r.prompt_tokens = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.compression.policy = policy;
    r.compression.budget = budget;
    return r;
  }
};

// The server validates specs (tests/unit/server/request_builder_test.cc); one that reaches the
// engine unvalidated is refused as a broken contract, still naming the field.
TEST_F(CompressionEngineTest, UnvalidatedBadSpecsAreRefusedNamingTheField) {
  Recorder recorder;
  auto engine = MakeEngine(40, &recorder);
  auto submit = [&](scheduler::GenerationRequest r) {
    return engine->Submit(std::move(r), std::make_shared<Sink>()).status();
  };
  struct Case {
    std::string policy;
    double budget;
    std::string field;
  };
  for (const Case& c : {Case{"lz77", 0.5, "compression.policy"},
                        Case{"snapkv", 0.0, "compression.budget"},
                        Case{"snapkv", 1.5, "compression.budget"},
                        Case{"h2o", -1, "compression.budget"}}) {
    absl::Status s = submit(Request(Prompt(20, 1), 4, c.policy, c.budget));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.policy << " " << c.budget;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s.message();
  }
  scheduler::GenerationRequest r = Request(Prompt(20, 1), 4, "snapkv", 0.5);
  r.compression.params["kernal"] = 5.0;
  absl::Status s = submit(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("compression.params.kernal"), absl::string_view::npos);
  r = Request(Prompt(20, 1), 4, "snapkv", 0.5);
  r.prompt_spans = {{cache::policies::SpanKind::kContext, 10, 30}};  // past the prompt
  EXPECT_EQ(submit(r).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(submit(Request(Prompt(20, 1), 2, "none")).ok());
  EXPECT_TRUE(submit(Request(Prompt(20, 1), 2, "snapkv", 1.0)).ok());
  EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(120)));
}

// A's compression frees blocks that B, waiting for room, uses while A is still decoding; with
// no compression B has to wait for A to finish.
TEST_F(CompressionEngineTest, FreedBlocksAdmitAWaitingRequest) {
  for (const bool compress : {true, false}) {
    Recorder recorder;
    auto engine = MakeEngine(20, &recorder);  // 320 tokens per layer
    auto a = std::make_shared<Sink>();
    auto b = std::make_shared<Sink>();
    absl::StatusOr<uint64_t> ia = engine->Submit(
        Request(Prompt(240, 1), 40, compress ? "snapkv" : "", compress ? 0.2 : 0.0), a);
    ASSERT_TRUE(ia.ok()) << ia.status();
    absl::StatusOr<uint64_t> ib = engine->Submit(Request(Prompt(240, 2), 4), b);
    ASSERT_TRUE(ib.ok()) << ib.status();
    ASSERT_TRUE(a->Wait());
    ASSERT_TRUE(b->Wait());
    EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(60)));
    const int b_start = recorder.Index(absl::StrCat("start ", *ib));
    const int a_finish = recorder.Index(absl::StrCat("finish ", *ia));
    ASSERT_GE(b_start, 0);
    ASSERT_GE(a_finish, 0);
    const scheduler::Usage usage = a->finish().usage;
    if (compress) {
      EXPECT_LT(recorder.Index(absl::StrCat("compress ", *ia)), b_start);
      EXPECT_LT(b_start, a_finish) << "B should run while A decodes";
      EXPECT_GE(usage.kv_blocks_freed_by_compression, L() * (15 - 3));
      ASSERT_EQ(usage.kv_tokens_kept_per_layer.size(), static_cast<size_t>(L()));
      for (int32_t k : usage.kv_tokens_kept_per_layer) EXPECT_EQ(k, 48);  // 0.2 x 240
      EXPECT_EQ(usage.kv_tokens_evicted, int64_t{L()} * (240 - 48));
      EXPECT_EQ(usage.completion_tokens, 40);
    } else {
      EXPECT_GT(b_start, a_finish) << "without compression B cannot fit next to A";
      EXPECT_EQ(usage.kv_blocks_freed_by_compression, 0);
    }
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
  }
}

// A lookahead request is compressed after its first tokens, reported as its prompt's
// compression; admission counts prompt + lookahead as its uncompressed peak.
TEST_F(CompressionEngineTest, LookaheadRequestIsCompressedAfterItsFirstTokens) {
  Recorder recorder;
  auto engine = MakeEngine(20, &recorder);  // 320 tokens per layer
  auto a = std::make_shared<Sink>();
  scheduler::GenerationRequest r = Request(Prompt(240, 5), 24, "winnowkv", 0.2);
  r.compression.params = {{"lookahead", 8.0}, {"allocation", std::string("uniform")}};
  absl::StatusOr<uint64_t> ia = engine->Submit(r, a);
  ASSERT_TRUE(ia.ok()) << ia.status();
  ASSERT_TRUE(a->Wait());
  EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(60)));
  EXPECT_EQ(recorder.Count(absl::StrCat("compress ", *ia)), 1);
  EXPECT_EQ(recorder.Count(absl::StrCat("evict ", *ia)), 0);
  const scheduler::Usage usage = a->finish().usage;
  ASSERT_EQ(usage.kv_tokens_kept_per_layer.size(), static_cast<size_t>(L()));
  for (int32_t k : usage.kv_tokens_kept_per_layer) EXPECT_EQ(k, 48 + 8);  // 0.2 x 240 + 8
  EXPECT_EQ(usage.kv_tokens_evicted, int64_t{L()} * (240 - 48));
  EXPECT_EQ(usage.completion_tokens, 24);
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);

  // 320 slots hold the 312-token prompt, not the prompt and 16 lookahead tokens.
  scheduler::GenerationRequest big = Request(Prompt(312, 6), 64, "winnowkv", 0.2);
  big.compression.params = {{"lookahead", 16.0}};
  absl::StatusOr<uint64_t> refused = engine->Submit(big, std::make_shared<Sink>());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  // With 4 it fits, and compressing after them leaves room for the 64 tokens.
  big.compression.params = {{"lookahead", 4.0}};
  auto b = std::make_shared<Sink>();
  ASSERT_TRUE(engine->Submit(big, b).ok());
  ASSERT_TRUE(b->Wait());
  EXPECT_EQ(b->finish().reason, scheduler::FinishReason::kLength);
  EXPECT_EQ(b->finish().usage.completion_tokens, 64);
  EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(60)));
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
}

// Two compressed requests outgrow the pool while decoding: the later one is preempted,
// recomputes its prompt + generated tokens uncompressed, and is compressed again.
TEST_F(CompressionEngineTest, PreemptedRequestIsCompressedAgain) {
  Recorder recorder;
  auto engine = MakeEngine(16, &recorder);
  auto a = std::make_shared<Sink>();
  auto b = std::make_shared<Sink>();
  absl::StatusOr<uint64_t> ia = engine->Submit(Request(Prompt(100, 3), 120, "snapkv", 0.5), a);
  absl::StatusOr<uint64_t> ib = engine->Submit(Request(Prompt(100, 4), 120, "snapkv", 0.5), b);
  ASSERT_TRUE(ia.ok()) << ia.status();
  ASSERT_TRUE(ib.ok()) << ib.status();
  ASSERT_TRUE(a->Wait());
  ASSERT_TRUE(b->Wait());
  EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(60)));
  EXPECT_EQ(a->finish().reason, scheduler::FinishReason::kLength);
  EXPECT_EQ(b->finish().reason, scheduler::FinishReason::kLength);
  EXPECT_EQ(b->finish().usage.completion_tokens, 120);
  ASSERT_GE(recorder.Count(absl::StrCat("preempt ", *ib)), 1);
  EXPECT_EQ(recorder.Count(absl::StrCat("compress ", *ib)),
            1 + recorder.Count(absl::StrCat("preempt ", *ib)));
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
}

}  // namespace
}  // namespace winnow
