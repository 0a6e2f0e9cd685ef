// Hooks through which the engine reports what it does, so that the server can keep Prometheus
// metrics and per-request logs without the scheduler depending on either. Every hook runs on
// the engine thread, between iterations: implementations must be cheap and must not block, and
// must not call back into the Engine except for its const, lock-free accessors (limits()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/trace_context.h"
#include "cache/compression_times.h"
#include "scheduler/request.h"

namespace winnow::scheduler {

// One engine iteration: a single varlen forward over the scheduled batch.
struct IterationStats {
  int32_t batch_tokens = 0;    // prefill chunk tokens + decode tokens fed to the forward
  int32_t batch_seqs = 0;      // sequences in the batch
  int32_t prefill_tokens = 0;  // tokens of entries that produced no sample or >1 token
  int32_t decode_tokens = 0;   // entries of exactly one token that produced a sample
  int32_t preemptions = 0;     // sequences preempted while building this batch
  absl::Duration forward_time;
  // Sampling after the forward, structured-output token masks included.
  absl::Duration sampling_time;
  // After the forward: the sequences' compression hooks (scoring, the policies' decisions,
  // compaction), on the engine thread; zero when no sequence compresses.
  absl::Duration compression_time;
  cache::CompressionPhaseTimes compression_phases;  // its split (cache/compression.h)
};

// Queue and pool state; published after every engine loop turn that changed anything, so the
// gauges (running, waiting, KV usage) stay true even when no forward runs (e.g. after a cancel
// empties the engine).
struct SchedulerState {
  int32_t running = 0;  // sequences holding KV blocks (admitted, prefilling or decoding)
  int32_t waiting = 0;  // queued: never admitted yet, or preempted and waiting to recompute
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  int64_t preemptions_total = 0;
  int32_t compressed_contexts = 0;  // published compressed contexts still resident
};

// One compaction of a sequence's KV by its compression policy: after its prefill, or a
// decode-time eviction.
struct CompressionEvent {
  uint64_t id = 0;
  std::string policy;
  bool prefill = true;         // the prompt's compression (after a lookahead too); false:
                               // decode-time eviction
  int64_t slots_before = 0;    // KV slots summed over layers, before and after
  int64_t slots_after = 0;
  int32_t blocks_freed = 0;    // returned to the pool by this compaction
  absl::Time start;            // the sequence's compression hook, around this compaction
  absl::Time end;
  cache::CompressionPhaseTimes time;  // that hook's split
};

// A traced request keeps this many of its compactions for its spans; later ones are counted.
inline constexpr int32_t kMaxTracedCompressions = 64;

// Everything worth logging or histogramming about a request once it has finished.
struct RequestStats {
  uint64_t id = 0;              // the engine's id (Submit's return value)
  std::string request_id;       // the client's id, if it gave one
  FinishReason reason = FinishReason::kStop;
  absl::Status status;          // OK unless reason is kError (then the forward's error)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t preemptions = 0;
  int32_t kv_blocks_peak = 0;
  std::string compression_policy;           // empty: none
  int32_t kv_blocks_freed_by_compression = 0;
  bool started = false;         // false: finished while still queued (never scheduled)
  bool has_first_token = false;
  absl::Duration queue_time;    // submit -> first scheduled (0 when never started)
  absl::Duration ttft;          // submit -> first generated token (when has_first_token)
  absl::Duration e2e;           // submit -> finish

  // For the request's trace (server/tracing/request_tracer.h).
  base::TraceContext trace;
  absl::Time submit_time;
  absl::Time start_time;        // when started
  absl::Time first_token_time;  // when has_first_token
  absl::Time finish_time;
  int32_t cached_prompt_tokens = 0;
  // With trace.sampled: the compactions in order (at most kMaxTracedCompressions), and how many
  // more there were.
  std::vector<CompressionEvent> compressions;
  int32_t compressions_untraced = 0;
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;

  // The engine thread took the request from the submit queue into its waiting queue.
  virtual void OnRequestQueued(uint64_t id, int32_t prompt_tokens) {}
  // First time the request got a prefill chunk; queue_time counts from Submit().
  virtual void OnRequestStarted(uint64_t id, absl::Duration queue_time) {}
  // The first generated token (count it as a generated token too).
  virtual void OnFirstToken(uint64_t id, absl::Duration ttft) {}
  // Every generated token after the first, with the time since the previous one.
  virtual void OnToken(uint64_t id, absl::Duration inter_token_latency) {}
  // The sequence lost its KV blocks and will recompute them later.
  virtual void OnPreemption(uint64_t id) {}
  // A request was admitted with prefix caching on: `hit_tokens` of its `queried_tokens` prompt
  // tokens had their K/V in the cache (vLLM's prefix_cache_queries / prefix_cache_hits).
  virtual void OnPrefixCacheLookup(int32_t queried_tokens, int32_t hit_tokens) {}
  // A request that compresses its context alone looked for it published compressed
  // (cache/compressed_prefix.h) at admission: `queried_tokens` is the context's length, and on a
  // hit `hit_tokens` the same (their prefill skipped) with `hit_kv_bytes` of K/V attached.
  virtual void OnCompressedContextLookup(int32_t queried_tokens, int32_t hit_tokens,
                                         int64_t hit_kv_bytes) {}
  // A forward failed so that none can run again (base::IsFatal: the device's context is
  // lost). Every request has ended with an error and Submit refuses new ones; a server should
  // stop serving and exit so that its supervisor restarts it. Once, on the engine thread.
  virtual void OnFatalError(const absl::Status& status) {}
  // The sequence's KV was compacted by its compression policy.
  virtual void OnCompression(const CompressionEvent& event) {}
  virtual void OnRequestFinished(const RequestStats& stats) {}
  virtual void OnIteration(const IterationStats& stats) {}
  virtual void OnSchedulerState(const SchedulerState& state) {}
};

}  // namespace winnow::scheduler
