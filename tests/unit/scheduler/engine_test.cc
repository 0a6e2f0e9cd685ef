#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "model/model.h"
#include "kernels/cpu/thread_pool.h"
#include "cache/sequence_kv.h"
#include "cache/block_pool.h"
#include "cache/compression.h"
#include "model/cpu_forward.h"
#include "scheduler/model_worker.h"
#include "scheduler/engine.h"
#include "tests/unit/scheduler/engine_test_util.h"

namespace winnow::scheduler {
namespace {

// ---------------------------------------------------------------------------------------------
// Engine, against the real model.

using testing_util::CollectingSink;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("WINNOW_TEST_MODEL");
    if (path == nullptr) return;
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(path);
    if (m.ok()) model_ = std::move(*m).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "WINNOW_TEST_MODEL not set or not loadable";
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions options, EngineObserver* observer = nullptr) {
    // A small pool keeps the tests fast; the tests that need a tiny one set kv_blocks.
    options.kv_cache_bytes = int64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, options, observer);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // Submits `r` alone and waits for it: its tokens and usage (the request must succeed).
  static std::pair<std::vector<int32_t>, Usage> RunToEnd(Engine& engine,
                                                         const GenerationRequest& r) {
    auto sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE(engine.Submit(r, sink).ok());
    EXPECT_TRUE(sink->WaitDone());
    EXPECT_TRUE(sink->finish().status.ok()) << sink->finish().status;
    return std::make_pair(sink->tokens(), sink->finish().usage);
  }

  // A deterministic prompt of `n` ordinary token ids (no tokenizer needed), different per seed.
  static std::vector<int32_t> Prompt(int n, int seed) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(200 + (seed * 7919 + i * 104729) % 20000);
    return ids;
  }

  static GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest r;
    r.prompt_tokens = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;  // fixed lengths make outputs comparable
    return r;
  }

  // Runs each request alone on a fresh default engine.
  std::vector<std::vector<int32_t>> RunAlone(const std::vector<GenerationRequest>& requests) {
    std::vector<std::vector<int32_t>> out;
    std::unique_ptr<Engine> engine = MakeEngine({});
    for (const GenerationRequest& r : requests) {
      auto sink = std::make_shared<CollectingSink>();
      EXPECT_TRUE(engine->Submit(r, sink).ok());
      EXPECT_TRUE(sink->WaitDone());
      out.push_back(sink->tokens());
    }
    return out;
  }

  static model::Model* model_;
};

model::Model* EngineTest::model_ = nullptr;

// Counts hooks; all run on the engine thread, the test reads after the engine is idle.
class CountingObserver : public EngineObserver {
 public:
  void OnRequestQueued(uint64_t, int32_t) override { ++queued; }
  void OnRequestStarted(uint64_t, absl::Duration) override { ++started; }
  void OnFirstToken(uint64_t, absl::Duration) override { ++tokens; }
  void OnToken(uint64_t, absl::Duration) override { ++tokens; }
  void OnPreemption(uint64_t) override { ++preemptions; }
  void OnRequestFinished(const RequestStats& stats) override {
    ++finished;
    completion_tokens += stats.completion_tokens;
  }
  void OnPrefixCacheLookup(int32_t queried, int32_t hit) override {
    prefix_queried += queried;
    prefix_hits += hit;
  }
  void OnCompressedContextLookup(int32_t queried, int32_t hit, int64_t bytes) override {
    context_queried += queried;
    context_hits += hit;
    context_hit_bytes += bytes;
  }
  void OnIteration(const IterationStats& stats) override {
    ++iterations;
    prefill_tokens += stats.prefill_tokens;
    max_batch_tokens = std::max(max_batch_tokens.load(), stats.batch_tokens);
  }
  void OnSchedulerState(const SchedulerState& state) override {
    std::lock_guard<std::mutex> lock(mu);
    last_state = state;
  }
  SchedulerState state() {
    std::lock_guard<std::mutex> lock(mu);
    return last_state;
  }

  std::atomic<int> queued{0}, started{0}, tokens{0}, preemptions{0}, finished{0};
  std::atomic<int> completion_tokens{0}, iterations{0}, max_batch_tokens{0};
  std::atomic<int> prefill_tokens{0}, prefix_queried{0}, prefix_hits{0};
  std::atomic<int> context_queried{0}, context_hits{0};
  std::atomic<int64_t> context_hit_bytes{0};

 private:
  std::mutex mu;
  SchedulerState last_state;
};

std::vector<GenerationRequest> MixedRequests(int count, int max_tokens) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < count; ++i) {
    GenerationRequest r;
    // Mixed prompt lengths, so prefill chunks and decode tokens share iterations.
    for (int j = 0; j < 5 + (i * 13) % 40; ++j) {
      r.prompt_tokens.push_back(200 + (i * 7919 + j * 104729) % 20000);
    }
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST_F(EngineTest, ConcurrentGreedyMatchesAlone) {
  const std::vector<GenerationRequest> requests = MixedRequests(8, 12);
  const std::vector<std::vector<int32_t>> alone = RunAlone(requests);

  EngineOptions options;
  options.max_batched_tokens = 24;  // forces chunked prefill alongside decodes
  std::unique_ptr<Engine> engine = MakeEngine(options);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const GenerationRequest& r : requests) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitDone());
    EXPECT_EQ(sinks[i]->finish().reason, FinishReason::kLength);
    EXPECT_EQ(sinks[i]->tokens(), alone[i]) << "request " << i;
    EXPECT_EQ(sinks[i]->finish().usage.completion_tokens, 12);
    EXPECT_EQ(sinks[i]->finish_calls(), 1);
  }
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  const EngineSnapshot snap = engine->Snapshot();
  EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);
  EXPECT_EQ(snap.running, 0);
  EXPECT_EQ(snap.waiting, 0);
}

TEST_F(EngineTest, AutoMaxSeqsIsWhatThePoolHoldsWithinTheTokenBudget) {
  const int32_t layers = model_->config().num_layers;
  EngineOptions options;
  options.block_size = 8;
  options.max_batched_tokens = 64;
  options.kv_blocks = layers * 5;  // five blocks per layer: at most five sequences hold KV
  ASSERT_EQ(options.max_seqs, 0);  // auto is the default
  EXPECT_EQ(MakeEngine(options)->Snapshot().limits.max_seqs, 5);
  options.kv_blocks = layers * 500;  // the token budget bounds it: a decode row per sequence
  EXPECT_EQ(MakeEngine(options)->Snapshot().limits.max_seqs, 64);
  options.max_batched_tokens = 4096;  // and kMaxSeqsAuto
  options.block_size = 1;             // (a pool of 1100 one-token blocks per layer stays small)
  options.kv_blocks = layers * (kMaxSeqsAuto + 76);
  EXPECT_EQ(MakeEngine(options)->Snapshot().limits.max_seqs, kMaxSeqsAuto);
  options.max_seqs = 3;  // a number is taken as given
  EXPECT_EQ(MakeEngine(options)->Snapshot().limits.max_seqs, 3);
  options.max_seqs = -1;
  EXPECT_EQ(Engine::Create(model_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, TinyPoolPreemptsWithIdenticalOutputs) {
  const std::vector<GenerationRequest> requests = MixedRequests(6, 16);
  const std::vector<std::vector<int32_t>> alone = RunAlone(requests);

  EngineOptions options;
  options.max_batched_tokens = 32;
  options.block_size = 8;
  // Eight 8-token blocks per layer: 64 tokens, enough for the longest request alone (44 prompt
  // + 16 generated) but far from all six at once.
  options.kv_blocks = model_->config().num_layers * 8;
  CountingObserver observer;
  std::unique_ptr<Engine> engine = MakeEngine(options, &observer);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const GenerationRequest& r : requests) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
  }
  int preemptions = 0;
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitDone());
    EXPECT_EQ(sinks[i]->tokens(), alone[i]) << "request " << i;
    EXPECT_LE(sinks[i]->finish().usage.kv_blocks_peak, options.kv_blocks);
    preemptions += sinks[i]->finish().usage.preemptions;
  }
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  const EngineSnapshot snap = engine->Snapshot();
  EXPECT_GT(snap.preemptions_total, 0);
  EXPECT_EQ(snap.preemptions_total, preemptions);
  EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);

  EXPECT_EQ(observer.queued, 6);
  EXPECT_EQ(observer.started, 6);
  EXPECT_EQ(observer.finished, 6);
  EXPECT_EQ(observer.tokens, 6 * 16);
  EXPECT_EQ(observer.completion_tokens, 6 * 16);
  EXPECT_EQ(observer.preemptions, preemptions);
  EXPECT_LE(observer.max_batch_tokens, options.max_batched_tokens);
  EXPECT_GT(observer.iterations, 16);
  const SchedulerState state = observer.state();
  EXPECT_EQ(state.running + state.waiting, 0);
  EXPECT_EQ(state.kv_blocks_free, state.kv_blocks_total);
  EXPECT_EQ(state.preemptions_total, preemptions);
}

TEST_F(EngineTest, CancelFreesAllBlocks) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto sink = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> id = engine->Submit(Greedy(Prompt(20, 1), 500), sink);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sink->WaitTokens(2));
  EXPECT_TRUE(engine->Cancel(*id));
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->finish().reason, FinishReason::kCancelled);
  EXPECT_GT(sink->finish().usage.kv_blocks_at_finish, 0);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  const EngineSnapshot snap = engine->Snapshot();
  EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);
  EXPECT_FALSE(engine->Cancel(*id));  // already finished
}

TEST_F(EngineTest, DeadlineExpiryFreesAllBlocks) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto sink = std::make_shared<CollectingSink>();
  GenerationRequest r = Greedy(Prompt(20, 2), 500);
  r.deadline = absl::Now() + absl::Milliseconds(200);
  ASSERT_TRUE(engine->Submit(r, sink).ok());
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->finish().reason, FinishReason::kDeadline);
  EXPECT_LT(sink->tokens().size(), 500u);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
}

TEST_F(EngineTest, RequestThatCanNeverFitIsRejectedAtOnce) {
  EngineOptions options;
  options.kv_blocks = model_->config().num_layers * 2;  // 32 tokens per sequence
  std::unique_ptr<Engine> engine = MakeEngine(options);
  auto sink = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> id = engine->Submit(Greedy(Prompt(30, 3), 8), sink);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(id.status().message().find("KV blocks"), std::string::npos) << id.status();
  // SmolLM2 has no sliding layers, so the message does not mention them.
  EXPECT_EQ(id.status().message().find("sliding"), std::string::npos) << id.status();

  const int32_t context = model_->config().context_length;
  id = engine->Submit(Greedy(Prompt(10, 3), context), sink);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(id.status().message().find("context"), std::string::npos) << id.status();
  EXPECT_EQ(sink->finish_calls(), 0);

  // Exactly at the edge: 30 + 3 tokens store 32 slots, which fits.
  id = engine->Submit(Greedy(Prompt(30, 3), 3), sink);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
}

// The server validates requests (tests/unit/server/request_builder_test.cc); the engine only
// refuses, without touching the sink, what would break its forward or its loop.
TEST_F(EngineTest, UnvalidatedRequestsAreRefusedAsFailedPrecondition) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto sink = std::make_shared<CollectingSink>();
  auto expect_refused = [&](GenerationRequest r) {
    absl::StatusOr<uint64_t> id = engine->Submit(std::move(r), sink);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition) << id.status();
  };
  expect_refused(Greedy({}, 4));
  expect_refused(Greedy({1, model_->config().vocab_size}, 4));
  expect_refused(Greedy({1, -7}, 4));
  expect_refused(Greedy(Prompt(4, 0), 0));
  GenerationRequest r = Greedy({1, model::kEmbeddingInput, 2}, 4);
  r.embeddings.assign(model_->config().hidden_size - 1, 0.0f);
  expect_refused(r);
  r = Greedy(Prompt(4, 0), 4);
  r.compression.policy = "snapkv-typo";
  expect_refused(r);
  EXPECT_EQ(sink->finish_calls(), 0);

  // Still serving.
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(4, 0), 2), sink).ok());
  ASSERT_TRUE(sink->WaitDone());
}

TEST_F(EngineTest, EmbeddingInputsMatchTokenEmbeddingsAreAccepted) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto sink = std::make_shared<CollectingSink>();
  GenerationRequest r = Greedy({1, model::kEmbeddingInput, model::kEmbeddingInput, 2}, 3);
  r.embeddings.assign(2 * model_->config().hidden_size, 0.01f);
  ASSERT_TRUE(engine->Submit(r, sink).ok());
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
  EXPECT_EQ(sink->tokens().size(), 3u);
}

// The real CPU worker, held at the start of its first Execute until the test opens the gate:
// the test acts while an iteration is in flight.
class GatedWorker : public Worker {
 public:
  struct Gate {
    absl::Mutex mu;
    bool entered ABSL_GUARDED_BY(mu) = false;
    bool open ABSL_GUARDED_BY(mu) = false;
  };
  GatedWorker(const model::Model& model, cache::BlockPool& pool, Gate* gate)
      : inner_(MakeCpuWorker(model, pool)), gate_(gate) {}

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override {
    {
      absl::MutexLock lock(&gate_->mu);
      gate_->entered = true;
      gate_->mu.Await(absl::Condition(&gate_->open));
    }
    return inner_->Execute(chunks);
  }

 private:
  std::unique_ptr<ModelWorker> inner_;
  Gate* const gate_;
};

TEST_F(EngineTest, QueueFullIsResourceExhausted) {
  GatedWorker::Gate gate;
  EngineOptions options;
  options.max_seqs = 1;
  options.max_queue = 1;
  options.worker_factory = [&gate](model::Model& m, cache::BlockPool& pool) {
    return std::make_unique<GatedWorker>(m, pool, &gate);
  };
  std::unique_ptr<Engine> engine = MakeEngine(options);
  auto open_gate = [&gate] {
    absl::MutexLock lock(&gate.mu);
    gate.open = true;
  };
  absl::Cleanup open_on_exit = open_gate;  // a failed ASSERT must not leave the engine held
  auto a = std::make_shared<CollectingSink>();
  auto b = std::make_shared<CollectingSink>();
  auto c = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> id_a = engine->Submit(Greedy(Prompt(8, 4), 400), a);
  ASSERT_TRUE(id_a.ok());
  {
    absl::MutexLock lock(&gate.mu);
    gate.mu.Await(absl::Condition(&gate.entered));
  }
  // a's first forward is in flight: a is running and the queue is empty, so b is accepted
  // (it once counted a as waiting until the forward ended) and c finds the queue full.
  EXPECT_EQ(engine->Snapshot().running, 1);
  EXPECT_EQ(engine->Snapshot().waiting, 0);
  absl::StatusOr<uint64_t> id_b = engine->Submit(Greedy(Prompt(8, 5), 2), b);
  ASSERT_TRUE(id_b.ok()) << id_b.status();
  absl::StatusOr<uint64_t> id_c = engine->Submit(Greedy(Prompt(8, 6), 2), c);
  ASSERT_FALSE(id_c.ok());
  EXPECT_EQ(id_c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(id_c.status().message().find("queue"), std::string::npos);
  EXPECT_EQ(engine->Snapshot().waiting, 1);
  EXPECT_EQ(engine->Snapshot().running, 1);
  open_gate();
  engine->Cancel(*id_a);
  ASSERT_TRUE(b->WaitDone());
  EXPECT_EQ(b->finish().reason, FinishReason::kLength);
}

TEST_F(EngineTest, DrainRejectsNewWorkAndFinishesInFlight) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto a = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(10, 7), 6), a).ok());
  engine->BeginDrain();
  EXPECT_TRUE(engine->Snapshot().draining);
  auto b = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> id = engine->Submit(Greedy(Prompt(10, 8), 6), b);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(60)));
  EXPECT_EQ(a->finish().reason, FinishReason::kLength);
  EXPECT_EQ(a->tokens().size(), 6u);
}

// A request submitted while the engine thread is inside a forward waits in the inbox until the
// next iteration; a Shutdown in between must still give it its one terminal event.
TEST_F(EngineTest, ShutdownCancelsRequestsNotYetTakenFromTheInbox) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto a = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(200, 11), 1000), a).ok());
  ASSERT_TRUE(a->WaitTokens(2));
  // The engine thread is now decoding `a`: `b` lands in the inbox, and Shutdown follows at
  // once, before the next iteration takes it.
  auto b = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(10, 12), 1000), b).ok());
  engine->Shutdown();
  EXPECT_EQ(b->finish_calls(), 1);
  EXPECT_EQ(b->finish().reason, FinishReason::kCancelled);
  EXPECT_EQ(b->finish().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a->finish().reason, FinishReason::kCancelled);
  EXPECT_EQ(engine->Snapshot().waiting, 0);
}

TEST_F(EngineTest, ShutdownCancelsRemaining) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  auto a = std::make_shared<CollectingSink>();
  auto b = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(10, 9), 1000), a).ok());
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(10, 10), 1000), b).ok());
  ASSERT_TRUE(a->WaitTokens(1));
  engine->Shutdown();
  EXPECT_EQ(a->finish().reason, FinishReason::kCancelled);
  EXPECT_EQ(b->finish().reason, FinishReason::kCancelled);
  EXPECT_EQ(a->finish().status.code(), absl::StatusCode::kUnavailable);
  auto c = std::make_shared<CollectingSink>();
  EXPECT_EQ(engine->Submit(Greedy(Prompt(4, 0), 2), c).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(EngineTest, StopStringTrimsOutputAndSeededSamplingIsReproducible) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  GenerationRequest r = Greedy(Prompt(12, 11), 16);
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 42;
  auto first = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, first).ok());
  ASSERT_TRUE(first->WaitDone());
  const std::string text = first->text();
  auto again = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, again).ok());
  ASSERT_TRUE(again->WaitDone());
  EXPECT_EQ(again->tokens(), first->tokens());
  EXPECT_EQ(again->text(), text);

  // Stop at a string taken from the middle of that output: the text ends right before it.
  if (text.size() < 6) GTEST_SKIP() << "output too short for a stop-string check";
  size_t cut = text.size() / 2;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  const std::string stop = text.substr(cut, 2);
  const size_t first_at = text.find(stop);
  r.stop_strings = {stop};
  auto stopped = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, stopped).ok());
  ASSERT_TRUE(stopped->WaitDone());
  EXPECT_EQ(stopped->finish().reason, FinishReason::kStop);
  EXPECT_EQ(stopped->text(), text.substr(0, first_at));
}

TEST_F(EngineTest, HigherPriorityRunsFirst) {
  EngineOptions options;
  options.max_seqs = 1;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  auto blocker = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> blocker_id = engine->Submit(Greedy(Prompt(8, 12), 400), blocker);
  ASSERT_TRUE(blocker_id.ok());
  ASSERT_TRUE(blocker->WaitTokens(1));
  // Both queue behind the blocker; the later, more important one must be admitted first.
  auto low = std::make_shared<CollectingSink>();
  auto high = std::make_shared<CollectingSink>();
  GenerationRequest low_req = Greedy(Prompt(8, 13), 4);
  GenerationRequest high_req = Greedy(Prompt(8, 14), 4);
  high_req.priority = 5;
  ASSERT_TRUE(engine->Submit(low_req, low).ok());
  ASSERT_TRUE(engine->Submit(high_req, high).ok());
  engine->Cancel(*blocker_id);
  ASSERT_TRUE(high->WaitDone());
  // With max_seqs 1, low cannot have produced anything before high finished.
  EXPECT_TRUE(low->tokens().empty());
  ASSERT_TRUE(low->WaitDone());
}

// A pool that holds one of these requests at a time: 8 blocks of 8 tokens per layer.
EngineOptions OneRequestPool(const model::Model& m) {
  EngineOptions options;
  options.block_size = 8;
  options.kv_blocks = m.config().num_layers * 8;
  return options;
}

TEST_F(EngineTest, HigherPriorityDisplacesLowerPriorityWhenThePoolIsFull) {
  GenerationRequest low_req = Greedy(Prompt(40, 21), 20);
  GenerationRequest high_req = Greedy(Prompt(30, 22), 8);
  high_req.priority = 5;
  const std::vector<std::vector<int32_t>> alone = RunAlone({low_req, high_req});

  std::unique_ptr<Engine> engine = MakeEngine(OneRequestPool(*model_));
  auto low = std::make_shared<CollectingSink>();
  auto high = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(low_req, low).ok());
  ASSERT_TRUE(low->WaitTokens(1));
  // Low holds 6 of the 8 blocks per layer after its prefill; high's 30-token prompt needs 4, so
  // it cannot even start beside low: low is preempted (recompute) and resumes after high.
  ASSERT_TRUE(engine->Submit(high_req, high).ok());
  ASSERT_TRUE(high->WaitDone());
  EXPECT_FALSE(low->finish_calls() > 0) << "low finished before the more important request";
  ASSERT_TRUE(low->WaitDone());
  EXPECT_EQ(high->tokens(), alone[1]);
  EXPECT_EQ(low->tokens(), alone[0]);  // recomputation does not change greedy output
  EXPECT_GE(low->finish().usage.preemptions, 1);
  EXPECT_EQ(high->finish().usage.preemptions, 0);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  const EngineSnapshot snap = engine->Snapshot();
  EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);
}

TEST_F(EngineTest, EqualPriorityWaitsInsteadOfPreempting) {
  std::unique_ptr<Engine> engine = MakeEngine(OneRequestPool(*model_));
  auto first = std::make_shared<CollectingSink>();
  auto second = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(40, 23), 20), first).ok());
  ASSERT_TRUE(first->WaitTokens(1));
  // As above, the second cannot start beside the first; at equal priority it waits.
  ASSERT_TRUE(engine->Submit(Greedy(Prompt(30, 24), 8), second).ok());
  ASSERT_TRUE(first->WaitDone());
  ASSERT_TRUE(second->WaitDone());
  EXPECT_EQ(first->finish().usage.preemptions, 0);
  EXPECT_EQ(engine->Snapshot().preemptions_total, 0);
}

// ---------------------------------------------------------------------------------------------
// Prefix caching on the real model.

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(EngineTest, PrefixCachingComputesASharedPrefixOnceWithIdenticalOutputs) {
  // A 64-token "system prompt" (4 blocks of 16) shared by four requests.
  const std::vector<int32_t> system = Prompt(64, 9);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(Greedy(Concat(system, Prompt(10, i)), 6));

  auto run = [&](bool caching, CountingObserver* observer) {
    EngineOptions options;
    options.enable_prefix_caching = caching;
    std::unique_ptr<Engine> engine = MakeEngine(options, observer);
    std::vector<std::vector<int32_t>> outputs;
    std::vector<int32_t> cached;
    // The first alone, so its blocks are published; then the rest at once.
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (size_t i = 0; i < requests.size(); ++i) {
      sinks.push_back(std::make_shared<CollectingSink>());
      EXPECT_TRUE(engine->Submit(requests[i], sinks.back()).ok());
      if (i == 0) {
        EXPECT_TRUE(sinks[0]->WaitDone());
      }
    }
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->WaitDone());
      outputs.push_back(sink->tokens());
      cached.push_back(sink->finish().usage.cached_prompt_tokens);
    }
    EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
    return std::make_pair(outputs, cached);
  };
  CountingObserver off_stats, on_stats;
  const auto off = run(false, &off_stats);
  const auto on = run(true, &on_stats);
  EXPECT_EQ(on.first, off.first);  // greedy outputs identical with caching on and off
  EXPECT_EQ(off.second, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(on.second, (std::vector<int32_t>{0, 64, 64, 64}));
  // Prefill token counts prove it: the shared 64 tokens were computed once, not four times.
  EXPECT_EQ(off_stats.prefill_tokens.load() - on_stats.prefill_tokens.load(), 3 * 64);
  EXPECT_EQ(on_stats.prefix_queried.load(), 4 * 74);
  EXPECT_EQ(on_stats.prefix_hits.load(), 3 * 64);
}

TEST_F(EngineTest, CompressingASharerLeavesTheOthersOutputUnchanged) {
  const std::vector<int32_t> shared = Prompt(96, 11);
  const GenerationRequest plain = Greedy(Concat(shared, Prompt(8, 1)), 24);
  const std::vector<int32_t> alone = RunAlone({plain})[0];

  std::unique_ptr<Engine> engine = MakeEngine({});
  auto first = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(plain, first).ok());
  ASSERT_TRUE(first->WaitTokens(2));  // its prompt blocks are published
  // SnapKV observes only its last 32 rows, so the shared blocks before them are reused, then
  // copied before its compaction.
  GenerationRequest squeezed = Greedy(Concat(shared, Prompt(40, 2)), 8);
  squeezed.compression.policy = "snapkv";
  squeezed.compression.budget = 0.3;
  auto second = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(squeezed, second).ok());
  ASSERT_TRUE(second->WaitDone());
  ASSERT_TRUE(first->WaitDone());
  EXPECT_GT(second->finish().usage.cached_prompt_tokens, 0);
  EXPECT_GT(second->finish().usage.kv_blocks_freed_by_compression, 0);
  EXPECT_EQ(first->tokens(), alone);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
}

// CompressionSpec::context_tokens by hand, following cache/compression.h's protocol with the
// engine's forward, KV dtype and block size: the context prefilled and compressed alone, the
// rest of the prompt prefilled over it, then greedy decode steps. Returns the tokens.
std::vector<int32_t> ContextScopeByHand(const model::Model& m, const GenerationRequest& r,
                                        int32_t threads) {
  const model::ModelConfig& c = m.config();
  constexpr int32_t kBlock = 16;
  auto pool = *cache::BlockPool::Create(m.KvLayoutFor(kBlock, kernels::KvDtype::kF16),
                                        c.num_layers * 64);
  kernels::ThreadPool pool_threads(threads);
  model::CpuForward forward(m, pool_threads);
  cache::policies::PolicyContext context;
  context.dims = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, kBlock};
  context.layout.num_tokens = r.compression.context_tokens;
  std::unique_ptr<cache::CompressionSession> session =
      *cache::CompressionSession::Create(
          r.compression.policy,
          cache::policies::PolicyConfig(r.compression.budget, r.compression.params), context);
  cache::SequenceKv kv(c.num_layers, kBlock);
  // One forward of `tokens` from `start`; the greedy next token when it asks for logits.
  auto run = [&](std::span<const int32_t> tokens, int32_t start, cache::QueryCapture* capture) {
    EXPECT_TRUE(kv.Reserve(*pool, static_cast<int32_t>(tokens.size())));
    model::BatchEntry e{&kv, tokens, {}, start, model::LogitsMode::kLast};
    e.capture = capture;
    model::ForwardOutput out;
    EXPECT_TRUE(forward.Forward({&e, 1}, *pool, &out).ok());
    const std::span<const float> row = out.Row(0);
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  const std::span<const int32_t> prompt(r.prompt_tokens);
  const int32_t n = r.compression.context_tokens;
  run(prompt.first(n), 0, session->PrefillCapture(0, n));
  EXPECT_TRUE(session->AfterPrefillChunk().ok());
  EXPECT_TRUE(session->Compress(kv, *pool, forward.Scoring(*pool)).ok());
  const int32_t rest = static_cast<int32_t>(prompt.size()) - n;
  std::vector<int32_t> tokens = {run(prompt.subspan(n), n, nullptr)};
  EXPECT_TRUE(session->AfterUncompressedTokens(n, rest, kv).ok());
  for (int32_t position = static_cast<int32_t>(prompt.size());
       static_cast<int32_t>(tokens.size()) < r.max_tokens; ++position) {
    tokens.push_back(run(std::span<const int32_t>(&tokens.back(), 1), position, nullptr));
    EXPECT_TRUE(session->AfterDecodeStep(position, kv, *pool).ok());
  }
  kv.Release(*pool);
  return tokens;
}

TEST_F(EngineTest, AContextIsCompressedBeforeTheRestOfThePromptIsComputed) {
  GenerationRequest r = Greedy(Concat(Prompt(160, 21), Prompt(24, 22)), 12);
  r.compression.policy = "snapkv";
  r.compression.budget = 0.25;
  r.compression.context_tokens = 160;
  const std::vector<int32_t> want = ContextScopeByHand(*model_, r, 2);

  EngineOptions options;
  options.worker.num_threads = 2;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, sink).ok());
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->tokens(), want);
  // Only the context was compressed: 75% of its 160 slots went, the question's 24 stayed.
  EXPECT_GT(sink->finish().usage.kv_blocks_freed_by_compression, 0);
  ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);

  // In small chunks the scheduler ends one where the context ends, and the request completes.
  options.max_batched_tokens = 48;
  std::unique_ptr<Engine> chunked = MakeEngine(options);
  auto small = std::make_shared<CollectingSink>();
  ASSERT_TRUE(chunked->Submit(r, small).ok());
  ASSERT_TRUE(small->WaitDone());
  EXPECT_TRUE(small->finish().status.ok()) << small->finish().status;
  EXPECT_EQ(small->tokens().size(), 12u);
  EXPECT_GT(small->finish().usage.kv_blocks_freed_by_compression, 0);

  // A policy that evicts while decoding cannot compress a context alone.
  r.compression.policy = "streaming_llm";
  const absl::Status refused = engine->Submit(r, std::make_shared<CollectingSink>()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("compression.context_tokens"), std::string::npos) << refused;
}

// Questions over one document whose context is compressed alone: the first request compresses
// and publishes it, the others attach it and compute only their question.
TEST_F(EngineTest, AnAttachedCompressedContextGivesTheTokensOfCompressingItThere) {
  const std::vector<int32_t> document = Prompt(160, 31);
  for (const std::string policy : {"snapkv", "winnowkv"}) {
    SCOPED_TRACE(policy);
    std::vector<GenerationRequest> questions;
    for (int q = 0; q < 3; ++q) {
      GenerationRequest r = Greedy(Concat(document, Prompt(12 + 8 * q, 40 + q)), 10);
      r.compression.policy = policy;
      r.compression.budget = 0.25;
      r.compression.context_tokens = 160;
      questions.push_back(std::move(r));
    }
    CountingObserver stats;
    std::unique_ptr<Engine> engine = MakeEngine({}, &stats);
    // Each question compressing the document itself (its own salt: nothing shared), ...
    std::vector<std::vector<int32_t>> want;
    for (size_t q = 0; q < questions.size(); ++q) {
      GenerationRequest alone = questions[q];
      alone.cache_salt = "alone " + std::to_string(q);
      auto sink = std::make_shared<CollectingSink>();
      ASSERT_TRUE(engine->Submit(alone, sink).ok());
      ASSERT_TRUE(sink->WaitDone());
      want.push_back(sink->tokens());
    }
    // ... then the first publishing it and the other two attaching it, at once.
    auto first = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(questions[0], first).ok());
    ASSERT_TRUE(first->WaitDone());
    const int prefilled_before = stats.prefill_tokens.load();
    std::vector<std::shared_ptr<CollectingSink>> sinks = {first};
    for (size_t q = 1; q < questions.size(); ++q) {
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(engine->Submit(questions[q], sinks.back()).ok());
    }
    for (size_t q = 0; q < questions.size(); ++q) {
      ASSERT_TRUE(sinks[q]->WaitDone());
      EXPECT_EQ(sinks[q]->tokens(), want[q]) << "question " << q;
      const Usage& usage = sinks[q]->finish().usage;
      EXPECT_EQ(usage.cached_prompt_tokens, q == 0 ? 0 : 160);
      EXPECT_EQ(usage.kv_tokens_kept_per_layer, first->finish().usage.kv_tokens_kept_per_layer);
    }
    // Only the two questions were prefilled.
    EXPECT_EQ(stats.prefill_tokens.load() - prefilled_before, 20 + 28);
    // Four lookups missed (three salts and the publisher), two hit.
    EXPECT_EQ(stats.context_queried.load(), 6 * 160);
    EXPECT_EQ(stats.context_hits.load(), 2 * 160);
    EXPECT_GT(stats.context_hit_bytes.load(), 0);

    // A different budget or salt is another context.
    GenerationRequest other = questions[1];
    other.compression.budget = 0.5;
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(other, sink).ok());
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->finish().usage.cached_prompt_tokens, 0);

    ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
    EXPECT_EQ(stats.state().compressed_contexts, 5);  // 3 salts, the shared one, budget 0.5
  }
}

// A capture that asks for its rows' probabilities folded (QueryCapture::fold) gets them from
// the CPU attention itself, in every layer and chunk, as the scoring kernel computes them from
// the captured rows; the rows before first_position are not folded.
TEST_F(EngineTest, TheCpuAttentionFoldsTheCapturedRowsAsTheScoringKernelDoes) {
  const model::ModelConfig& c = model_->config();
  constexpr int32_t kBlock = 16;
  auto pool = *cache::BlockPool::Create(model_->KvLayoutFor(kBlock, kernels::KvDtype::kF16),
                                        c.num_layers * 16);
  kernels::ThreadPool threads(2);
  model::CpuForward forward(*model_, threads);
  const std::vector<int32_t> prompt = Prompt(100, 31);
  for (const kernels::ColumnReduce reduce : {kernels::ColumnReduce::kSum,
                                             kernels::ColumnReduce::kMax}) {
    cache::SequenceKv kv(c.num_layers, kBlock);
    cache::QueryCapture capture;
    capture.first_position = 10;
    capture.fold = reduce;
    int32_t layers_folded = 0;
    double worst = 0.0;
    capture.layer_done = [&](int32_t layer, const cache::SequenceKv& seq,
                             cache::ScoringBackend& scoring) {
      if (capture.folded_layer != layer) return;
      ++layers_folded;
      const std::vector<float>& rows_q = capture.per_layer[layer];
      const int32_t rows = static_cast<int32_t>(rows_q.size() / (c.num_heads * c.head_dim));
      std::vector<int32_t> visible(rows);
      for (int32_t r = 0; r < rows; ++r) {
        visible[r] = capture.positions[capture.positions.size() - rows + r] + 1;
      }
      kernels::ScoreInput in{seq.block_table(layer).data(), seq.num_slots(layer), rows_q.data(),
                             rows, visible.data(), c.num_heads, c.AttentionScale(), reduce};
      std::vector<float> want(static_cast<size_t>(c.num_heads) * in.num_slots, 0.0f);
      ASSERT_TRUE(scoring.AccumulateAttentionColumns(in, want.data(), {}).ok());
      ASSERT_EQ(capture.folded.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(double{capture.folded[i]} - want[i]) /
                                    std::max(1.0, double{want[i]}));
      }
      capture.per_layer[layer].clear();
    };
    for (const auto& [start, count] : {std::pair{0, 60}, std::pair{60, 40}}) {
      ASSERT_TRUE(kv.Reserve(*pool, count));
      capture.positions.clear();
      model::BatchEntry e{&kv, std::span<const int32_t>(prompt).subspan(start, count), {}, start,
                          model::LogitsMode::kNone};
      e.capture = &capture;
      model::ForwardOutput out;
      ASSERT_TRUE(forward.Forward({&e, 1}, *pool, &out).ok());
    }
    EXPECT_EQ(layers_folded, 2 * c.num_layers);
    EXPECT_LT(worst, 1e-5);  // relative, for sums of up to 50 rows
    kv.Release(*pool);
  }
}

// The repeat probe's segments cover the context in order, each scoring its own piece and ending
// with it; a later one quotes the previous piece's last tokens so the model knows where to start.
TEST_F(EngineTest, TheRepeatProbeScoresEachPieceOfTheContextOnce) {
  const std::vector<int32_t> context = Prompt(1200, 3);
  const std::vector<cache::ProbeSegment> segments =
      *RepeatProbeSegments(model_->tokenizer(), context, 512);
  ASSERT_EQ(segments.size(), 3u);
  int32_t next = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const cache::ProbeSegment& s = segments[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(s.scored_begin, next);
    EXPECT_LE(s.tokens.size(), 512u);
    const std::vector<int32_t> piece(context.begin() + s.scored_begin,
                                     context.begin() + s.scored_end);
    const std::vector<int32_t> tail(s.tokens.end() - piece.size(), s.tokens.end());
    EXPECT_EQ(tail, piece);
    auto encode = [this](const char* text) {
      return model_->tokenizer().Encode(text, /*add_special=*/false, /*parse_special=*/false);
    };
    const std::vector<int32_t> instruction(s.tokens.begin(), s.tokens.end() - piece.size());
    if (i == 0) {
      EXPECT_EQ(instruction, encode("\n\nRepeat the previous context exactly.\n"));
    } else {
      std::vector<int32_t> want =
          encode("\n\nRepeat the part of the previous context exactly, starting with");
      want.insert(want.end(), context.begin() + s.scored_begin - kRepeatProbeAnchor,
                  context.begin() + s.scored_begin);
      const std::vector<int32_t> newline = encode("\n");
      want.insert(want.end(), newline.begin(), newline.end());
      EXPECT_EQ(instruction, want);
    }
    next = s.scored_end;
  }
  EXPECT_EQ(next, 1200);

  // A chat model's probe asks in a user turn and repeats as the assistant.
  ASSERT_TRUE(model_->chat_template().ok());
  const ProbeFrame chat = ChatProbeFrame(*model_->chat_template());
  EXPECT_EQ(chat.before, "<|im_start|>user\n");
  EXPECT_EQ(chat.after, "<|im_end|>\n<|im_start|>assistant\n");
  const cache::ProbeSegment first =
      (*RepeatProbeSegments(model_->tokenizer(), context, 512, chat))[0];
  const std::vector<int32_t> instruction(first.tokens.begin(),
                                         first.tokens.end() - first.scored_end);
  EXPECT_EQ(model_->tokenizer().Decode(instruction, /*render_special=*/true),
            chat.before + "Repeat the previous context exactly." + chat.after);
}

// The probe runs at the positions after the context, so its segments shrink to what the model's
// context leaves there; a context that leaves too few for the instruction is refused at submit,
// naming the field, before anything runs.
TEST_F(EngineTest, TheRepeatProbeFitsInTheModelsContextOrIsRefused) {
  EXPECT_FALSE(RepeatProbeSegments(model_->tokenizer(), Prompt(100, 3), 10).ok());

  std::unique_ptr<Engine> engine = MakeEngine({});
  const int32_t positions = model_->config().context_length;
  GenerationRequest r = Greedy(Prompt(positions - 2, 5), 1);
  r.compression.policy = "kvzip";
  r.compression.budget = 0.2;
  r.compression.context_tokens = positions - 12;
  r.compression.probe = ContextProbe::kRepeat;
  const absl::Status refused = engine->Submit(r, std::make_shared<CollectingSink>()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("compression.probe"), std::string::npos) << refused;
  EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
}

// A context scored with the repeat probe: the probe runs once, where the context is compressed;
// requests that attach the published context get the tokens of compressing it themselves, and
// a context compressed without the probe is another context.
TEST_F(EngineTest, AContextScoredWithARepeatProbeIsPublishedAndAttachedLikeAnyOther) {
  // Longer than one probe segment of 256 tokens: scored in two.
  const std::vector<int32_t> document = Prompt(300, 71);
  // snapkv sums the probe's rows; kvzip takes their maximum and ranks across layers.
  for (const char* policy : {"snapkv", "kvzip"}) {
    SCOPED_TRACE(policy);
    auto question = [&](int q, ContextProbe probe, std::string salt) {
      GenerationRequest r = Greedy(Concat(document, Prompt(16, 80 + q)), 8);
      r.compression.policy = policy;
      r.compression.budget = 0.25;
      r.compression.context_tokens = 300;
      r.compression.probe = probe;
      r.cache_salt = std::move(salt);
      return r;
    };
    CountingObserver stats;
    EngineOptions options;
    options.probe_segment_tokens = 256;
    std::unique_ptr<Engine> engine = MakeEngine(options, &stats);
    auto run = [&](const GenerationRequest& r) { return RunToEnd(*engine, r); };
    const auto alone = run(question(1, ContextProbe::kRepeat, "alone"));
    const auto first = run(question(0, ContextProbe::kRepeat, ""));
    const auto attached = run(question(1, ContextProbe::kRepeat, ""));
    const auto unprobed = run(question(1, ContextProbe::kNone, ""));
    EXPECT_EQ(first.second.cached_prompt_tokens, 0);
    EXPECT_EQ(attached.second.cached_prompt_tokens, 300);
    EXPECT_EQ(attached.first, alone.first);
    EXPECT_EQ(unprobed.second.cached_prompt_tokens, 0);
    EXPECT_GT(alone.second.kv_blocks_freed_by_compression, 0);
    ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
  }
}

// A context compressed in stages (a chat's history, compress as it grows): a request attaches
// the longest of its stages published by earlier requests and compresses only the later ones,
// getting the tokens of a request that compressed every stage itself; the kept slots grow at
// the budget's rate.
TEST_F(EngineTest, AContextCompressedInStagesAttachesItsEarlierStagesAndCompressesTheRest) {
  const std::vector<int32_t> history = Prompt(200, 91);
  for (const bool probe : {false, true}) {
    SCOPED_TRACE(probe ? "kvzip, repeat probe" : "snapkv");
    auto request = [&](std::vector<int32_t> stage_ends, std::string salt) {
      const int32_t context = stage_ends.back();
      std::vector<int32_t> prompt(history.begin(), history.begin() + context);
      GenerationRequest r = Greedy(Concat(prompt, Prompt(16, 7)), 8);
      r.compression.policy = probe ? "kvzip" : "snapkv";
      r.compression.budget = 0.25;
      r.compression.context_tokens = context;
      r.compression.stage_ends = std::move(stage_ends);
      r.compression.probe = probe ? ContextProbe::kRepeat : ContextProbe::kNone;
      r.cache_salt = std::move(salt);
      return r;
    };
    CountingObserver stats;
    std::unique_ptr<Engine> engine = MakeEngine({}, &stats);
    auto run = [&](const GenerationRequest& r) { return RunToEnd(*engine, r); };
    const auto alone = run(request({100, 200}, "alone"));  // both stages compressed here
    run(request({100}, ""));                                // the first turn: stage one
    const auto second = run(request({100, 200}, ""));       // attaches it, compresses stage two
    const auto third = run(request({100, 200}, ""));        // attaches both
    const auto at_once = run(request({200}, ""));           // one stage: another cache
    EXPECT_EQ(alone.second.cached_prompt_tokens, 0);
    EXPECT_EQ(second.second.cached_prompt_tokens, 100);
    EXPECT_EQ(third.second.cached_prompt_tokens, 200);
    EXPECT_EQ(at_once.second.cached_prompt_tokens, 0);
    EXPECT_EQ(second.first, alone.first);
    EXPECT_EQ(third.first, alone.first);
    // Looked up: each request's whole context; found: the stages attached.
    EXPECT_EQ(stats.context_queried, 200 + 100 + 200 + 200 + 200);
    EXPECT_EQ(stats.context_hits, 100 + 200);
    // Each stage keeps about a quarter of its tokens; the question and reply stay whole.
    const std::vector<int32_t>& kept = alone.second.kv_tokens_kept_per_layer;
    ASSERT_FALSE(kept.empty());
    const double mean = std::accumulate(kept.begin(), kept.end(), 0.0) / kept.size();
    EXPECT_LT(mean, 0.25 * 200 + 2 * 8 + 16 + 8) << "kept per layer";
    EXPECT_EQ(third.second.kv_tokens_kept_per_layer, kept);
    ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
    // alone's two stages, the first turn's (shared with the second), the second's, at_once's.
    EXPECT_EQ(stats.state().compressed_contexts, 5);
  }
}

// A policy that cannot plan a stage from its own columns is refused at Submit, naming the field.
TEST_F(EngineTest, APolicyThatCannotCompressInStagesIsRefused) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  GenerationRequest r = Greedy(Prompt(80, 5), 4);
  r.compression.policy = "vl_cache";
  r.compression.budget = 0.5;
  r.compression.context_tokens = 60;
  r.compression.stage_ends = {30, 60};
  const absl::StatusOr<uint64_t> refused =
      engine->Submit(r, std::make_shared<CollectingSink>());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("compression.scope"), std::string::npos)
      << refused.status();
}

// The pool holds one document's uncompressed prefill at a time: requests that attach the
// published context keep running beside one that compresses, and preemptions and the reclaiming
// of published contexts leak nothing.
TEST_F(EngineTest, CompressedContextsUnderPoolPressureLeakNoBlock) {
  // With the repeat probe the prefill's peak is the context twice over: a pool that holds it
  // and the three published contexts, one compressing request at a time.
  for (const ContextProbe probe : {ContextProbe::kNone, ContextProbe::kRepeat}) {
    SCOPED_TRACE(probe == ContextProbe::kNone ? "no probe" : "repeat probe");
    EngineOptions options;
    options.kv_blocks = model_->config().num_layers * (probe == ContextProbe::kNone ? 14 : 32);
    options.max_batched_tokens = 64;
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < (probe == ContextProbe::kNone ? 8 : 6); ++i) {
      GenerationRequest r = Greedy(Concat(Prompt(160, 50 + i % 3), Prompt(10, i)), 12);
      r.compression.policy = "snapkv";
      r.compression.budget = 0.2;
      r.compression.context_tokens = 160;
      r.compression.probe = probe;
      requests.push_back(std::move(r));
    }
    CountingObserver stats;
    std::unique_ptr<Engine> engine = Engine::Create(model_, options, &stats).value();
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const GenerationRequest& r : requests) {
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
    }
    EngineOptions no_reuse;
    no_reuse.enable_prefix_caching = false;
    std::unique_ptr<Engine> reference = MakeEngine(no_reuse);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(sinks[i]->WaitDone());
      EXPECT_TRUE(sinks[i]->finish().status.ok()) << sinks[i]->finish().status;
      auto alone = std::make_shared<CollectingSink>();
      ASSERT_TRUE(reference->Submit(requests[i], alone).ok());
      ASSERT_TRUE(alone->WaitDone());
      EXPECT_EQ(sinks[i]->tokens(), alone->tokens()) << "request " << i;
    }
    ASSERT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
    EXPECT_GT(stats.context_hits.load(), 0);
    if (probe == ContextProbe::kNone) {
      EXPECT_GT(stats.preemptions.load(), 0);
    }
  }
}

}  // namespace
}  // namespace winnow::scheduler

namespace winnow::scheduler {
namespace {

TEST_F(EngineTest, PromptLogprobsDoNotDependOnChunkingOrThePrefixCache) {
  GenerationRequest r = Greedy(Prompt(300, 5), 2);
  r.prompt_logprobs = 3;
  auto run = [&](EngineOptions options, int times) {
    std::unique_ptr<Engine> engine = MakeEngine(options);
    std::vector<std::vector<TokenLogprob>> out;
    for (int i = 0; i < times; ++i) {
      auto sink = std::make_shared<CollectingSink>();
      EXPECT_TRUE(engine->Submit(r, sink).ok());
      EXPECT_TRUE(sink->WaitDone());
      out.push_back(sink->prompt_logprobs());
    }
    EXPECT_TRUE(engine->WaitForIdle(absl::Seconds(10)));
    EXPECT_EQ(engine->Snapshot().kv_blocks_free, engine->Snapshot().kv_blocks_total);
    return out;
  };
  EngineOptions chunked;
  chunked.max_batched_tokens = 48;
  // Twice on one engine: the second finds the prompt in the prefix cache and still scores it.
  const auto whole = run({}, 2);
  const auto small = run(chunked, 1);
  ASSERT_EQ(whole[0].size(), 299u);
  for (size_t i = 0; i < whole[0].size(); ++i) {
    EXPECT_EQ(whole[0][i].id, r.prompt_tokens[i + 1]);
    EXPECT_LE(whole[0][i].logprob, 0.0f);
    ASSERT_EQ(whole[0][i].top.size(), 3u);
    EXPECT_GE(whole[0][i].top[0].second, whole[0][i].logprob);
    EXPECT_EQ(whole[1][i].logprob, whole[0][i].logprob) << i;
    EXPECT_NEAR(small[0][i].logprob, whole[0][i].logprob, 1e-4) << i;
  }
}

}  // namespace
}  // namespace winnow::scheduler
