// The inference engine: one thread that owns the model and the paged KV pool and runs
// iteration-level continuous batching with chunked prefill over every admitted request.
//
// scheduler/ holds the engine and everything it runs each iteration: this loop (engine.h),
// the scheduler that decides (scheduler.h), the worker that executes (worker.h, the interface;
// model_worker.h, the one implementation over a CPU or CUDA forward backend; forward_batch.h,
// its batch, hooks and sampling), the output processor (output_processor.h), the requests and
// sequences (request.h, sequence.h), and the choice of device and worker (device.h).
//
// Threading: Submit, Cancel, Snapshot, BeginDrain, WaitForIdle and Shutdown may be called from
// any thread. RequestSink and EngineObserver callbacks run on the engine thread and must not
// block (push into your own queue and return).
//
// One iteration: cancellations, expired deadlines and shutdown free their sequences' blocks;
// the scheduler plans (scheduler/scheduler.h: admission, chunked prefill, preemption,
// priorities); the worker executes the plan (scheduler/model_worker.h: forward, compression
// hooks, sampling); the output processor streams the tokens and finishes requests
// (scheduler/output_processor.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/model.h"
#include "scheduler/device.h"
#include "scheduler/engine_observer.h"
#include "scheduler/request.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

// Makes the worker that executes every iteration's plan over the engine's model and pool (both
// outlive it).
using WorkerFactory = std::function<std::unique_ptr<Worker>(model::Model&, cache::BlockPool&)>;

// max_seqs 0 ("auto") resolves to as many sequences as the pool holds at one block per layer
// each (the least a running sequence holds), within the token budget (every running sequence
// takes a row of each decode step) and this cap, which bounds an iteration's host work and the
// device's logits scratch (kMaxSeqsAuto x vocabulary floats): compression decides how many
// requests fit, not a fixed number.
inline constexpr int32_t kMaxSeqsAuto = 1024;

struct EngineOptions {
  int32_t max_batched_tokens = 2048;  // tokens fed to one forward (prefill chunks + decodes)
  int32_t max_seqs = 0;               // sequences holding KV blocks at once; 0: auto (above)
  int32_t max_queue = 256;            // waiting requests (incl. preempted) before Submit refuses
  int32_t block_size = 16;            // token slots per KV block
  int64_t kv_cache_bytes = int64_t{512} << 20;  // pool size, used when kv_blocks is 0
  int32_t kv_blocks = 0;                        // > 0: exact pool size in blocks
  // > 0 (cuda only, up to 1) and kv_blocks == 0: the pool takes what this fraction of the GPU's
  // memory leaves after the weights, activations and what is already in use (replaces
  // kv_cache_bytes; KvBytesForGpuMemory in scheduler/device.h).
  double gpu_memory_utilization = 0.0;
  int32_t max_prompt_tokens = 0;  // 0: the model's context length
  int32_t max_tokens_limit = 0;   // upper bound on GenerationRequest::max_tokens; 0: none
  // Share the KV of full prompt blocks between requests with the same prefix (and salt).
  bool enable_prefix_caching = true;
  // The repeat probe's segment length (RepeatProbeSegments): longer segments score a context
  // more like one whole repeat (better on the needle benchmark) and hold more KV while it runs.
  // A segment is cut shorter where the model's context has fewer positions after the context.
  int32_t probe_segment_tokens = kDefaultProbeSegment;
  // How K/V rows are stored: f16 halves f32's bytes (llama.cpp's default cache type too), so
  // the same kv_cache_bytes holds twice the tokens; q8_0 about 3.8x. Attention converts rows
  // to float32 as it reads them.
  kernels::KvDtype kv_cache_dtype = kernels::KvDtype::kF16;
  // Where the forward runs. On cuda the KV data lives in the GPU's arena (the pool here keeps
  // only its books) and must be bf16.
  Device device;
  // cuda: decode-only iterations replay CUDA graphs (model::CudaModel::set_cuda_graphs).
  bool cuda_graphs = true;
  // The worker's threads and the CPU forward's activations (scheduler/worker.h).
  WorkerOptions worker;
  // Empty: the device's worker (MakeWorker, scheduler/device.h). Otherwise this makes the
  // worker, over the pool built for `device`: the fault-injection tests wrap the CPU worker in
  // one that fails on purpose.
  WorkerFactory worker_factory;
  // Testing a supervisor's restart: > 0 makes the forward of that engine iteration (1-based)
  // report a lost device (base/fatal_error.h), after it ran; the engine then stops
  // (EngineObserver::OnFatalError). 0: never.
  int64_t inject_fatal_error_at = 0;
};

// The most sequences `options` let hold KV at once before the pool is sized: max_seqs, or for
// auto the bound it resolves within (the pool then lowers it). Sizes the forward's scratch.
int32_t MaxSeqsBound(const EngineOptions& options);

struct EngineLimits {
  int32_t max_batched_tokens = 0;
  int32_t max_seqs = 0;
  int32_t max_queue = 0;
  int32_t block_size = 0;
  int32_t max_prompt_tokens = 0;
  int32_t max_tokens_limit = 0;  // 0: none beyond the context
  int32_t context_length = 0;
  int32_t kv_blocks_total = 0;
  bool prefix_caching = false;
  int32_t probe_segment_tokens = 0;
  kernels::KvDtype kv_cache_dtype = kernels::KvDtype::kF32;
  int64_t kv_bytes_per_token = 0;  // K, V (pool dtype) and logit biases of a token, all layers
  bool kv_logit_bias = false;      // the pool has per-slot logit biases (host pools)
  // Tokens one sequence could hold if it had the whole pool (kv_blocks_total / layers * size).
  int64_t max_tokens_in_pool = 0;
  std::string device;  // DescribeDevice: "cpu" or "cuda:0 (<GPU name>)"
};

struct EngineSnapshot {
  int32_t running = 0;
  int32_t waiting = 0;  // includes requests submitted but not yet seen by the engine thread
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  int64_t preemptions_total = 0;
  bool draining = false;
  EngineLimits limits;
};

class Engine {
 public:
  // Sizes the pool, then starts the engine thread. The model must outlive the engine; the
  // observer (optional) too. InvalidArgument for bad options, ResourceExhausted when the pool
  // cannot be allocated or cannot hold even one token.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(model::Model* model,
                                                        const EngineOptions& options,
                                                        EngineObserver* observer = nullptr);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request the server has validated (server/request_builder.h); returns the id that
  // Cancel takes. Errors, all immediate:
  //   ResourceExhausted when the queue is full, or prompt + max_tokens can never fit the
  //     context or the KV pool (the message gives the numbers; with compression the pool must
  //     hold the uncompressed prompt and the compressed footprint at max_tokens);
  //   Unavailable while draining or after shutdown;
  //   FailedPrecondition for a request that breaks the engine's input contract (a token id
  //     outside the vocabulary, embedding rows that do not match, max_tokens < 1, an invalid
  //     compression spec): a caller that skipped validation, not a client error.
  // On error the sink is never called.
  absl::StatusOr<uint64_t> Submit(GenerationRequest request, std::shared_ptr<RequestSink> sink);

  // Finishes the request with kCancelled within one iteration and frees its blocks. Returns
  // false when the id is unknown or already finished (then nothing happens).
  bool Cancel(uint64_t id);

  EngineSnapshot Snapshot() const;
  const EngineLimits& limits() const { return limits_; }
  const model::Model& model() const { return *model_; }

  // From now on Submit returns Unavailable; in-flight requests keep running.
  void BeginDrain();
  // Blocks until no request is running or waiting, or `timeout` passes; true when idle.
  bool WaitForIdle(absl::Duration timeout);
  // Cancels every remaining request (sinks get kCancelled with an Unavailable status), frees
  // their blocks and joins the engine thread. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  Engine(model::Model* model, EngineLimits limits);

  model::Model* model_;
  EngineLimits limits_;
  ProbeFrame probe_frame_;  // the repeat probe's instruction frame (the model's chat turn)
  std::unique_ptr<Impl> impl_;
};

}  // namespace winnow::scheduler
