// The inference engine: one thread that owns the model and the paged KV pool and runs
// iteration-level continuous batching with chunked prefill over every admitted request.
//
// Threading: Submit, Cancel, Snapshot, BeginDrain, WaitForIdle and Shutdown may be called from
// any thread. RequestSink and EngineObserver callbacks run on the engine thread and must not
// block (push into your own queue and return).
//
// Scheduling, per iteration (see engine.cc for the details and the reasons):
//   1. cancellations, expired deadlines and shutdown free their sequences' blocks;
//   2. running sequences get their next decode token, then partially-prefilled ones their next
//      prefill chunk, in priority order (higher priority first, then earlier arrival), within
//      max_batched_tokens and max_seqs; when the pool cannot hold what a sequence writes this
//      iteration, the lowest-priority, latest-arrived running sequence is preempted by
//      recompute (its blocks are freed; it is requeued and later re-prefills prompt + generated
//      tokens, keeping its sampler state, so its stream continues unchanged);
//   3. if nothing was preempted, waiting sequences are admitted in priority order while their
//      first chunk fits in the pool and the budgets (compression-aware: see engine.cc,
//      "Admission", and docs/compression.md);
//   4. one forward; sampling; stop checks; events to the sinks;
//   5. sequences whose prefill completed are compressed by their policy (blocks freed at once,
//      so waiting requests are admitted into them next iteration); decode steps may evict.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/policies/policy.h"
#include "model/model.h"
#include "model/sampler.h"
#include "scheduler/engine_observer.h"

namespace winnow::scheduler {

struct EngineOptions {
  int32_t max_batched_tokens = 2048;  // tokens fed to one forward (prefill chunks + decodes)
  int32_t max_seqs = 64;              // sequences holding KV blocks at once
  int32_t max_queue = 256;            // waiting requests (incl. preempted) before Submit refuses
  int32_t block_size = 16;            // token slots per KV block
  int64_t kv_cache_bytes = int64_t{512} << 20;  // pool size, used when kv_blocks is 0
  int32_t kv_blocks = 0;                        // > 0: exact pool size in blocks
  int32_t max_prompt_tokens = 0;  // 0: the model's context length
  int32_t max_tokens_limit = 0;   // upper bound on GenerationRequest::max_tokens; 0: none
};

// Which KV-compression policy a request asks for ("" or "none": no compression). budget, in
// (0, 1], is the fraction of the prompt's KV kept; params are the policy's own (see
// docs/compression.md). Validated at Submit by cache::policies::CreatePolicy.
struct CompressionSpec {
  std::string policy;
  double budget = 0.0;
  cache::policies::PolicyParams params;
};

struct GenerationRequest {
  std::string request_id;  // the client's id, echoed in RequestStats/logs; may be empty
  // Prompt token ids. model::kEmbeddingInput (-1) marks a position whose input is the next row
  // of `embeddings` instead of a token embedding.
  std::vector<int32_t> prompt_tokens;
  // Rows of the model's hidden size, one per kEmbeddingInput position, in order.
  std::vector<float> embeddings;
  model::SamplingParams sampling;  // sampling.top_logprobs: alternatives per token when logprobs
  bool logprobs = false;           // report each generated token's log-probability
  int32_t max_tokens = 16;         // generated tokens, >= 1
  std::vector<std::string> stop_strings;  // generation stops before the first match (trimmed)
  std::vector<int32_t> stop_token_ids;    // generation stops after emitting one of these ids
  bool ignore_eos = false;                // do not stop on the model's end-of-generation ids
  int32_t priority = 0;                   // larger = more important; ties go by arrival
  absl::Time deadline = absl::InfiniteFuture();
  CompressionSpec compression;
  // Image-embedding and client-marked context spans of the prompt ([begin, end) positions,
  // sorted, disjoint): what modality-aware policies score and evict; the text after the last
  // one is their observation window. Empty: a plain text prompt.
  std::vector<cache::policies::PromptSpan> prompt_spans;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // highest first; sampling.top_logprobs entries
};

// Generated tokens and the text they complete. Text is always valid UTF-8; text that might be
// the start of a stop string is held back until it is known not to be, and a matched stop
// string is never emitted. So `text` can be empty while `token_ids` is not, and (for the last
// event before OnFinish) the reverse.
struct TokenEvent {
  std::vector<int32_t> token_ids;      // includes a final EOS/stop token id
  std::string text;
  std::vector<TokenLogprob> logprobs;  // parallel to token_ids when the request asked
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t kv_blocks_peak = 0;       // most blocks (all layers) the sequence held at once
  int32_t kv_blocks_at_finish = 0;  // blocks held just before they were freed
  std::vector<int32_t> kv_tokens_per_layer;  // slots held per layer at finish
  int32_t preemptions = 0;
  // Compression (zero / empty without a policy). Summed over every prefill (a preempted
  // request is compressed again when it recomputes) and every decode-time eviction.
  int32_t kv_blocks_freed_by_compression = 0;
  int64_t kv_tokens_evicted = 0;              // slots removed, summed over layers
  std::vector<int32_t> kv_tokens_kept_per_layer;  // slots per layer right after the last
                                                  // prefill compression
};

struct FinishEvent {
  FinishReason reason = FinishReason::kStop;
  absl::Status status;  // OK, except for kError (why), kCancelled/kDeadline (a matching code)
  Usage usage;
};

// Receives one request's stream. OnTokens may be called any number of times, then OnFinish
// exactly once (also for cancelled, expired and failed requests); no call follows OnFinish, and
// the engine drops its reference to the sink right after it.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnTokens(const TokenEvent& event) = 0;
  virtual void OnFinish(const FinishEvent& event) = 0;
};

struct EngineLimits {
  int32_t max_batched_tokens = 0;
  int32_t max_seqs = 0;
  int32_t max_queue = 0;
  int32_t block_size = 0;
  int32_t max_prompt_tokens = 0;
  int32_t max_tokens_limit = 0;  // 0: none beyond the context
  int32_t context_length = 0;
  int32_t kv_blocks_total = 0;
  // Tokens one sequence could hold if it had the whole pool (kv_blocks_total / layers * size).
  int64_t max_tokens_in_pool = 0;
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

  // Validates and queues a request; returns the id that Cancel takes. Errors, all immediate:
  //   InvalidArgument naming the field (empty prompt, token id out of range, embedding rows of
  //     the wrong width or count, max_tokens < 1 or above the limit, bad sampling, unknown
  //     compression policy, budget outside (0, 1] or bad policy params, bad prompt spans,
  //     prompt longer than max_prompt_tokens);
  //   ResourceExhausted when the queue is full, or prompt + max_tokens can never fit the
  //     context or the KV pool (the message gives the numbers; with compression the pool must
  //     hold the uncompressed prompt and the compressed footprint at max_tokens);
  //   Unavailable while draining or after shutdown.
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
  std::unique_ptr<Impl> impl_;
};

}  // namespace winnow::scheduler
