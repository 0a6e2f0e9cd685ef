// Faults and overload on the real model (WINNOW_TEST_MODEL; skipped without it).
//
// Fault injection: the engine takes a worker that wraps the real CPU worker and fails on a
// chosen iteration, either the whole forward (WorkerOutput::status) or one sequence's chunk
// (ChunkResult::status). Only the requests hit by the fault may end in kError; every other one
// must produce exactly the greedy tokens it produces without the fault, every KV block must be
// back in the pool, and the engine must keep serving.
//
// Overload: a request that can never fit the pool, even compressed, is refused at Submit.
// (The queue-full and uncompressed never-fit cases are in engine_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "base/fatal_error.h"
#include "model/model.h"
#include "scheduler/model_worker.h"
#include "scheduler/engine.h"
#include "tests/unit/scheduler/engine_test_util.h"

namespace winnow::scheduler {
namespace {

using testing_util::CollectingSink;

// Which failure to inject, and when.
struct Fault {
  int iteration = 1;  // the first Execute call (1-based) that may fail
  // Empty: the whole forward of that iteration fails. Otherwise only the chunk of the request
  // with this request_id fails, at the first iteration >= `iteration` that runs it.
  std::string only_request = {};
};

// What the fault hit; written on the engine thread, read by the test.
class FaultRecord {
 public:
  void Fired(std::vector<uint64_t> failed, size_t batch_size) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = std::move(failed);
    batch_size_ = batch_size;
    ++times_;
  }
  std::vector<uint64_t> failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  size_t batch_size() {
    std::lock_guard<std::mutex> lock(mu_);
    return batch_size_;
  }
  int times() {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }

 private:
  std::mutex mu_;
  std::vector<uint64_t> failed_;  // engine ids of the sequences the fault hit
  size_t batch_size_ = 0;         // sequences in the failed iteration
  int times_ = 0;
};

// The real CPU worker, then the fault, once: the kernels have run and written K/V when the
// failure is reported, as with a device error detected after the launch.
class FaultInjectingWorker : public Worker {
 public:
  FaultInjectingWorker(const model::Model& model, cache::BlockPool& pool, Fault fault,
                       FaultRecord* record)
      : inner_(MakeCpuWorker(model, pool)), fault_(std::move(fault)), record_(record) {}

  absl::Status Admits(const GenerationRequest& request) const override {
    return inner_->Admits(request);
  }

  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override {
    WorkerOutput out = inner_->Execute(chunks);
    ++iterations_;
    if (fired_ || iterations_ < fault_.iteration || !out.status.ok()) return out;
    if (fault_.only_request.empty()) {
      std::vector<uint64_t> ids;
      for (const ScheduledChunk& c : chunks) ids.push_back(c.seq->id);
      Fire(std::move(ids), chunks.size());
      out.status = absl::InternalError("injected fault: the forward failed");
      out.chunks.clear();
      return out;
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].seq->req.request_id != fault_.only_request) continue;
      Fire({chunks[i].seq->id}, chunks.size());
      out.chunks[i].status = absl::DataLossError("injected fault: this sequence failed");
      out.chunks[i].token.reset();
      break;
    }
    return out;
  }

 private:
  void Fire(std::vector<uint64_t> ids, size_t batch_size) {
    fired_ = true;
    record_->Fired(std::move(ids), batch_size);
  }

  std::unique_ptr<ModelWorker> inner_;
  const Fault fault_;
  FaultRecord* const record_;
  int iterations_ = 0;
  bool fired_ = false;
};

class EngineFaultTest : public ::testing::Test {
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

  static std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
    if (options.kv_blocks == 0) options.kv_cache_bytes = int64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  static EngineOptions WithFault(EngineOptions options, Fault fault, FaultRecord* record) {
    options.worker_factory = [fault, record](model::Model& m, cache::BlockPool& pool) {
      return std::make_unique<FaultInjectingWorker>(m, pool, fault, record);
    };
    return options;
  }

  // Six greedy requests of mixed prompt lengths (5..45 tokens), fixed output lengths.
  static std::vector<GenerationRequest> Requests(int max_tokens) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r;
      for (int j = 0; j < 5 + (i * 13) % 41; ++j) {
        r.prompt_tokens.push_back(200 + (i * 7919 + j * 104729) % 20000);
      }
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      r.request_id = "r" + std::to_string(i);
      requests.push_back(std::move(r));
    }
    return requests;
  }

  // Each request alone on a fresh engine without faults: the reference outputs.
  static std::vector<std::vector<int32_t>> RunAlone(const std::vector<GenerationRequest>& rs) {
    std::unique_ptr<Engine> engine = MakeEngine({});
    std::vector<std::vector<int32_t>> out;
    for (const GenerationRequest& r : rs) {
      auto sink = std::make_shared<CollectingSink>();
      EXPECT_TRUE(engine->Submit(r, sink).ok());
      EXPECT_TRUE(sink->WaitDone());
      out.push_back(sink->tokens());
    }
    return out;
  }

  struct Submitted {
    std::vector<uint64_t> ids;
    std::vector<std::shared_ptr<CollectingSink>> sinks;
  };
  static Submitted SubmitAll(Engine& engine, const std::vector<GenerationRequest>& rs) {
    Submitted s;
    for (const GenerationRequest& r : rs) {
      s.sinks.push_back(std::make_shared<CollectingSink>());
      absl::StatusOr<uint64_t> id = engine.Submit(r, s.sinks.back());
      EXPECT_TRUE(id.ok()) << id.status();
      s.ids.push_back(id.ok() ? *id : 0);
    }
    for (auto& sink : s.sinks) EXPECT_TRUE(sink->WaitDone());
    return s;
  }

  static void ExpectIdleAndPoolFree(Engine& engine) {
    ASSERT_TRUE(engine.WaitForIdle(absl::Seconds(10)));
    const EngineSnapshot snap = engine.Snapshot();
    EXPECT_EQ(snap.running, 0);
    EXPECT_EQ(snap.waiting, 0);
    EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);
  }

  // The engine still serves: a fresh request gives its reference output.
  static void ExpectStillServing(Engine& engine, const GenerationRequest& r,
                                 const std::vector<int32_t>& reference) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine.Submit(r, sink).ok());
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
    EXPECT_EQ(sink->tokens(), reference);
    ExpectIdleAndPoolFree(engine);
  }

  static bool StartsWith(const std::vector<int32_t>& v, const std::vector<int32_t>& prefix) {
    return prefix.size() <= v.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
  }

  static model::Model* model_;
};

model::Model* EngineFaultTest::model_ = nullptr;

TEST_F(EngineFaultTest, FailedForwardErrorsOnlyThatIterationsRequests) {
  const std::vector<GenerationRequest> requests = Requests(12);
  const std::vector<std::vector<int32_t>> alone = RunAlone(requests);

  EngineOptions options;
  options.max_seqs = 2;             // at most two in the failing batch; the rest wait
  options.max_batched_tokens = 24;  // chunked prefill beside decodes
  FaultRecord record;
  std::unique_ptr<Engine> engine = MakeEngine(WithFault(options, {.iteration = 4}, &record));
  const Submitted run = SubmitAll(*engine, requests);

  ASSERT_EQ(record.times(), 1);
  const std::vector<uint64_t> failed_ids = record.failed();
  const absl::flat_hash_set<uint64_t> failed(failed_ids.begin(), failed_ids.end());
  ASSERT_FALSE(failed.empty());
  EXPECT_LE(failed.size(), 2u);
  int errored = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const FinishEvent finish = run.sinks[i]->finish();
    EXPECT_EQ(run.sinks[i]->finish_calls(), 1) << "request " << i;
    if (failed.contains(run.ids[i])) {
      ++errored;
      EXPECT_EQ(finish.reason, FinishReason::kError) << "request " << i;
      EXPECT_EQ(finish.status.code(), absl::StatusCode::kInternal) << finish.status;
      EXPECT_NE(finish.status.message().find("injected fault"), std::string::npos);
      // What streamed before the fault is what the request produces alone.
      EXPECT_TRUE(StartsWith(alone[i], run.sinks[i]->tokens())) << "request " << i;
      EXPECT_LT(run.sinks[i]->tokens().size(), alone[i].size());
    } else {
      EXPECT_EQ(finish.reason, FinishReason::kLength) << "request " << i;
      EXPECT_TRUE(finish.status.ok()) << finish.status;
      EXPECT_EQ(run.sinks[i]->tokens(), alone[i]) << "request " << i;
    }
  }
  EXPECT_EQ(errored, static_cast<int>(failed.size()));
  ExpectIdleAndPoolFree(*engine);
  ExpectStillServing(*engine, requests[3], alone[3]);
}

TEST_F(EngineFaultTest, FailedChunkErrorsOnlyItsSequence) {
  const std::vector<GenerationRequest> requests = Requests(12);
  const std::vector<std::vector<int32_t>> alone = RunAlone(requests);

  // Everyone fits at once, so the victim fails in a batch it shares with the others.
  FaultRecord record;
  std::unique_ptr<Engine> engine =
      MakeEngine(WithFault({}, {.iteration = 3, .only_request = "r2"}, &record));
  const Submitted run = SubmitAll(*engine, requests);

  ASSERT_EQ(record.times(), 1);
  ASSERT_EQ(record.failed(), std::vector<uint64_t>{run.ids[2]});
  EXPECT_GT(record.batch_size(), 1u) << "the victim ran alone: nothing shared its iteration";
  for (size_t i = 0; i < requests.size(); ++i) {
    const FinishEvent finish = run.sinks[i]->finish();
    EXPECT_EQ(run.sinks[i]->finish_calls(), 1) << "request " << i;
    if (i == 2) {
      EXPECT_EQ(finish.reason, FinishReason::kError);
      EXPECT_EQ(finish.status.code(), absl::StatusCode::kDataLoss) << finish.status;
      EXPECT_TRUE(StartsWith(alone[i], run.sinks[i]->tokens()));
      EXPECT_LT(run.sinks[i]->tokens().size(), alone[i].size());
    } else {
      EXPECT_EQ(finish.reason, FinishReason::kLength) << "request " << i;
      EXPECT_EQ(run.sinks[i]->tokens(), alone[i]) << "request " << i;
    }
  }
  ExpectIdleAndPoolFree(*engine);
  ExpectStillServing(*engine, requests[2], alone[2]);
}

TEST_F(EngineFaultTest, FailedChunkIsNotOfferedToThePrefixCache) {
  GenerationRequest r = Requests(4)[3];  // a 44-token prompt: two full blocks of 16
  r.request_id = "victim";
  FaultRecord record;
  std::unique_ptr<Engine> engine =
      MakeEngine(WithFault({}, {.iteration = 1, .only_request = "victim"}, &record));
  auto failed = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, failed).ok());
  ASSERT_TRUE(failed->WaitDone());
  ASSERT_EQ(failed->finish().reason, FinishReason::kError);

  // The same prompt again computes everything; once that one succeeded, a third reuses it.
  r.request_id = "again";
  for (int32_t expected_cached : {0, 32}) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(r, sink).ok());
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
    EXPECT_EQ(sink->finish().usage.cached_prompt_tokens, expected_cached);
  }
  ExpectIdleAndPoolFree(*engine);
}

TEST_F(EngineFaultTest, AContextWhoseCompressionFailedIsNeverPublished) {
  // A 100-token context compressed alone (one chunk: the forward and the compression that fail
  // together), then a question.
  GenerationRequest r = Requests(4)[3];
  const std::vector<int32_t> context = Requests(4)[3].prompt_tokens;
  r.prompt_tokens.insert(r.prompt_tokens.begin(), context.begin(), context.end());
  r.prompt_tokens.insert(r.prompt_tokens.begin(), context.begin(), context.end());
  r.compression.policy = "snapkv";
  r.compression.budget = 0.25;
  r.compression.context_tokens = 2 * static_cast<int32_t>(context.size());
  r.request_id = "victim";
  FaultRecord record;
  EngineOptions options;
  options.max_batched_tokens = r.compression.context_tokens;  // the context's chunk ends there
  std::unique_ptr<Engine> engine =
      MakeEngine(WithFault(options, {.iteration = 1, .only_request = "victim"}, &record));
  auto failed = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(r, failed).ok());
  ASSERT_TRUE(failed->WaitDone());
  ASSERT_EQ(failed->finish().reason, FinishReason::kError);

  // The same request again compresses the context itself; once it has, a third attaches it.
  r.request_id = "again";
  for (int32_t expected_cached : {0, r.compression.context_tokens}) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(r, sink).ok());
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
    EXPECT_EQ(sink->finish().usage.cached_prompt_tokens, expected_cached);
  }
  ExpectIdleAndPoolFree(*engine);
}

// A forward that fails in the middle of preemption churn: a pool that holds one or two of these
// requests at a time, so the fault lands on sequences that were preempted and recomputed.
TEST_F(EngineFaultTest, FailureUnderPreemptionLeaksNoBlock) {
  const std::vector<GenerationRequest> requests = Requests(16);
  const std::vector<std::vector<int32_t>> alone = RunAlone(requests);

  EngineOptions options;
  options.block_size = 8;
  options.kv_blocks = model_->config().num_layers * 8;  // 64 tokens per layer
  options.max_batched_tokens = 32;
  for (int iteration : {6, 20}) {
    FaultRecord record;
    std::unique_ptr<Engine> engine =
        MakeEngine(WithFault(options, {.iteration = iteration}, &record));
    const Submitted run = SubmitAll(*engine, requests);
    ASSERT_EQ(record.times(), 1) << "iteration " << iteration;
    const std::vector<uint64_t> failed_ids = record.failed();
    const absl::flat_hash_set<uint64_t> failed(failed_ids.begin(), failed_ids.end());
    for (size_t i = 0; i < requests.size(); ++i) {
      const FinishEvent finish = run.sinks[i]->finish();
      if (failed.contains(run.ids[i])) {
        EXPECT_EQ(finish.reason, FinishReason::kError) << "request " << i;
      } else {
        EXPECT_EQ(finish.reason, FinishReason::kLength) << "request " << i;
        EXPECT_EQ(run.sinks[i]->tokens(), alone[i]) << "request " << i;
      }
    }
    EXPECT_GT(engine->Snapshot().preemptions_total, 0) << "iteration " << iteration;
    ExpectIdleAndPoolFree(*engine);
    ExpectStillServing(*engine, requests[5], alone[5]);
  }
}

TEST_F(EngineFaultTest, FactoryWithoutAWorkerIsRefused) {
  EngineOptions options;
  options.worker_factory = [](model::Model&, cache::BlockPool&) -> std::unique_ptr<Worker> {
    return nullptr;
  };
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Overload: never-fit requests with compression.

TEST_F(EngineFaultTest, CompressedRequestThatCanNeverFitIsRefusedAtOnce) {
  const int32_t layers = model_->config().num_layers;
  EngineOptions options;
  options.kv_blocks = layers * 4;  // 64 tokens per sequence at 16 per block
  std::unique_ptr<Engine> engine = MakeEngine(options);
  auto sink = std::make_shared<CollectingSink>();
  auto request = [](int prompt, int max_tokens, const std::string& policy) {
    GenerationRequest r;
    for (int j = 0; j < prompt; ++j) r.prompt_tokens.push_back(300 + (j * 104729) % 20000);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.compression.policy = policy;
    r.compression.budget = 0.25;
    return r;
  };
  // The uncompressed prompt (80 tokens, 5 blocks per layer) must be held before compression.
  absl::StatusOr<uint64_t> id = engine->Submit(request(80, 4, "h2o"), sink);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(id.status().message().find("compression policy h2o"), std::string::npos)
      << id.status();

  // 60 + 60 tokens are twice the pool uncompressed; h2o keeps a quarter of what it has seen,
  // so compressed the request fits and runs.
  id = engine->Submit(request(60, 60, ""), sink);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sink->finish_calls(), 0);
  id = engine->Submit(request(60, 60, "h2o"), sink);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->finish().reason, FinishReason::kLength);
  EXPECT_EQ(sink->tokens().size(), 60u);
  ExpectIdleAndPoolFree(*engine);
}


// Hears OnFatalError (engine thread) for the test.
class FatalRecord : public EngineObserver {
 public:
  void OnFatalError(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    statuses_.push_back(status);
  }
  std::vector<absl::Status> statuses() {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_;
  }

 private:
  std::mutex mu_;
  std::vector<absl::Status> statuses_;
};

TEST_F(EngineFaultTest, LostDeviceEndsEveryRequestAndRefusesNewOnes) {
  // The forward of iteration 3 reports a lost device (base/fatal_error.h): the requests of that
  // batch end with its error, every other one (waiting, max_seqs 2) with UNAVAILABLE, the
  // observer hears it once, Submit refuses from then on, and no block is held.
  EngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  options.max_seqs = 2;
  options.inject_fatal_error_at = 3;
  FatalRecord record;
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(model_, options, &record);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  const Submitted s = SubmitAll(engine, Requests(/*max_tokens=*/16));
  for (const auto& sink : s.sinks) {
    EXPECT_EQ(sink->finish().reason, FinishReason::kError);
    EXPECT_FALSE(sink->finish().status.ok());
  }
  const std::vector<absl::Status> fatal = record.statuses();
  ASSERT_EQ(fatal.size(), 1u);
  EXPECT_TRUE(base::IsFatal(fatal[0])) << fatal[0];
  auto late = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> refused = engine.Submit(Requests(4)[0], late);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("device"));
  ExpectIdleAndPoolFree(engine);
}

TEST(FatalErrorTest, MarksAndRecognisesAFatalStatus) {
  EXPECT_FALSE(base::IsFatal(absl::InternalError("an ordinary error")));
  const absl::Status fatal = base::MarkFatal(absl::InternalError("device lost"));
  EXPECT_TRUE(base::IsFatal(fatal));
  EXPECT_EQ(fatal.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(base::MarkFatal(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace winnow::scheduler
