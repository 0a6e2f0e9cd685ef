// What a client hands the engine (a validated, typed request and a sink for its stream) and
// what it gets back (token events, then one finish event with usage).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/trace_context.h"
#include "cache/policies/policy.h"
#include "cache/probe_segment.h"
#include "model/sampler.h"
#include "structured/constraint.h"

namespace winnow::scheduler {

// Prompt tokens per prefill chunk when their logits are all kept (prompt_logprobs): rows x
// vocabulary floats per chunk.
inline constexpr int32_t kPromptLogprobsChunk = 256;

enum class FinishReason {
  kStop,       // end-of-generation token, a stop token id or a stop string
  kLength,     // max_tokens reached, or the model's context length
  kCancelled,  // Cancel(), or Shutdown() with the request still in flight
  kDeadline,   // the request's deadline passed
  kError,      // the forward pass failed; FinishEvent::status says why
};

// "stop", "length", "cancelled", "deadline", "error": stable names for logs and metric labels.
const char* FinishReasonName(FinishReason reason);

// What a context compressed alone is scored with (CompressionSpec::probe).
enum class ContextProbe {
  kNone,    // the context's own last rows (the policy's observation window)
  kRepeat,  // "Repeat the previous context exactly." and the context again, run after it and
            // dropped, in segments (RepeatProbeSegments)
};

// The repeat probe's segment length unless the engine is told otherwise
// (EngineOptions::probe_segment_tokens): a context up to about this long is scored by one
// whole repeat.
inline constexpr int32_t kDefaultProbeSegment = 2048;

// The text around the repeat probe's instruction: for a chat model, a user turn and the
// assistant's header after it, so that the repeated piece is the assistant's reply (as KVzip
// asks it); else blank lines before and a line break after.
struct ProbeFrame {
  std::string before = "\n\n";
  std::string after = "\n";
};

// Which KV-compression policy a request asks for ("" or "none": no compression). budget, in
// (0, 1], is the fraction of the prompt's KV kept; params are the policy's own, typed (numbers
// stay doubles; see docs/compression.md).
struct CompressionSpec {
  std::string policy;
  double budget = 0.0;
  cache::policies::PolicyParams params;
  // 0: compress the whole prompt once it is prefilled (the policy may read the question at its
  // end: query-aware). n > 0: compress only the prompt's first n tokens (the context), once they
  // are prefilled and before the rest of the prompt is, which is then computed over the
  // compressed context: the plan depends on the context alone (query-agnostic). Policies that
  // evict while decoding, plan after a lookahead or select per token cannot (the engine refuses).
  int32_t context_tokens = 0;
  // With context_tokens: where the context's stages end, ascending, the last at context_tokens
  // (empty: one stage, the whole context). Each stage is compressed after the ones before it,
  // which stay as they are (CompressionSession::StartAfter), and published on its own, so that
  // a chat's next turn attaches its history's stages and compresses only what is new.
  std::vector<int32_t> stage_ends;
  // With context_tokens: what the context is scored with. The engine fills stage_probes (per
  // stage, the repeat probe's segments, each run alone at the positions after the stage) at
  // Submit.
  ContextProbe probe = ContextProbe::kNone;
  std::vector<std::vector<cache::ProbeSegment>> stage_probes;

  bool enabled() const { return !policy.empty() && policy != "none"; }
  int32_t num_stages() const {
    return stage_ends.empty() ? 1 : static_cast<int32_t>(stage_ends.size());
  }
  int32_t StageBegin(int32_t stage) const { return stage == 0 ? 0 : stage_ends[stage - 1]; }
  int32_t StageEnd(int32_t stage) const {
    return stage_ends.empty() ? context_tokens : stage_ends[stage];
  }
};

// A request as the engine takes it. The server builds it from the wire request and validates
// every field there (server/request_builder.h); the engine trusts it and checks only what
// depends on its own state (context, pool, queue).
struct GenerationRequest {
  std::string request_id;  // the client's id, echoed in RequestStats/logs; may be empty
  // Prompt token ids. model::kEmbeddingInput (-1) marks a position whose input is the next row
  // of `embeddings` instead of a token embedding.
  std::vector<int32_t> prompt_tokens;
  // Rows of the model's hidden size, one per kEmbeddingInput position, in order.
  std::vector<float> embeddings;
  model::SamplingParams sampling;  // sampling.top_logprobs: alternatives per token when logprobs
  bool logprobs = false;           // report each generated token's log-probability
  // >= 0: also report each prompt token's log-probability given the tokens before it (and
  // this many alternatives), in the first TokenEvent; -1: off. Such a prompt is computed whole
  // (no prefix-cache hit) in chunks of at most kPromptLogprobsChunk tokens.
  int32_t prompt_logprobs = -1;
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
  // Prefix caching: only requests with equal salts share cached KV blocks.
  std::string cache_salt;
  // Structured output: the generated text is a JSON value of this grammar (null: free text).
  // Incompatible with ignore_eos (the output ends where the value does).
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  // The W3C trace the request belongs to (the edge reads traceparent); with trace.sampled the
  // engine keeps what its spans need (RequestStats).
  base::TraceContext trace;
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
  // The first event of a request with prompt_logprobs >= 0: prompt tokens 1.. (the first has no
  // context), in order; an embedding position has id -1 and log-probability 0.
  std::vector<TokenLogprob> prompt_logprobs;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
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

  // The request ran to its end (a stop or its length), not cut short by a failure or a cancel.
  bool succeeded() const {
    return reason == FinishReason::kStop || reason == FinishReason::kLength;
  }
};

// Receives one request's stream. OnTokens may be called any number of times, then OnFinish
// exactly once (also for cancelled, expired and failed requests); no call follows OnFinish, and
// the engine drops its reference to the sink right after it. Both run on the engine thread and
// must not block.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnTokens(const TokenEvent& event) = 0;
  virtual void OnFinish(const FinishEvent& event) = 0;
};

}  // namespace winnow::scheduler
