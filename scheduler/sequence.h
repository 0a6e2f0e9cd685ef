// One request inside the engine, from Submit to finish: its tokens, how many of them have K/V
// in the pool, its KV block tables, compression session, sampler and stream state. The engine
// owns sequences; the scheduler, worker and output processor each touch their own fields, all
// on the engine thread once the sequence has left the submit inbox.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/compression.h"
#include "cache/policies/policy.h"
#include "cache/sequence_kv.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/request.h"
#include "scheduler/stop_strings.h"

namespace winnow::scheduler {

enum class SequenceState {
  kWaiting,   // holds no KV blocks: never admitted yet, or preempted and waiting to recompute
  kRunning,   // admitted: holds KV blocks, prefilling or decoding
  kFinished,  // its finish event was delivered and its blocks freed
};

// What the output processor needs to turn tokens into a client's stream.
struct OutputStream {
  OutputStream(const model::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
               std::shared_ptr<RequestSink> request_sink)
      : detok(tokenizer), stops(std::move(stop_strings)), sink(std::move(request_sink)) {}

  model::StreamingDetokenizer detok;
  StopStringMatcher stops;
  std::shared_ptr<RequestSink> sink;  // reset right after OnFinish
};

struct Sequence {
  Sequence(GenerationRequest request, int32_t num_layers, int32_t block_size);

  // --- Identity. ---
  uint64_t id = 0;
  uint64_t arrival = 0;  // submit order; breaks priority ties (earlier first)
  GenerationRequest req;

  // --- Tokens and KV (scheduler and worker). ---
  // Prompt then generated tokens; position i of the request is tokens[i]. After a preemption
  // the whole list is recomputed, which is why generated tokens live here too.
  std::vector<int32_t> tokens;
  // emb_prefix[i]: how many kEmbeddingInput positions precede prompt position i (size
  // prompt_len + 1), so a chunk finds its embedding rows without scanning.
  std::vector<int32_t> emb_prefix;
  int32_t prompt_len = 0;
  int32_t num_computed = 0;  // leading tokens whose K/V sit in `kv`
  int32_t num_generated = 0;
  SequenceState state = SequenceState::kWaiting;
  cache::SequenceKv kv;
  // The session of the current prefill (null without a policy); recreated on preemption so the
  // recomputed cache is compressed again.
  std::unique_ptr<cache::CompressionSession> compression;
  model::Sampler sampler;
  // prompt_logprobs: what the prefill chunks have scored so far (prompt tokens 1..), sent with
  // the first token.
  std::vector<TokenLogprob> prompt_logprobs;
  // Structured output (null without a grammar): which tokens may come next.
  std::unique_ptr<structured::Constraint> constraint;
  // Prefix caching (empty when off): content keys of the prompt's full blocks, and how many of
  // them this sequence has published (keyed) in the pool.
  std::vector<uint64_t> prefix_keys;
  int32_t published_blocks = 0;
  // Compressed-context reuse (0 when off): the key of the context this sequence compresses
  // (cache/compressed_prefix.h), under which it is published once compressed, or attached.
  uint64_t context_key = 0;
  // Blocks attached from the prefix cache at admission (every layer): a compressing sequence
  // copies those still shared before its compaction, so admission reserves room for them.
  int32_t attached_cached_blocks = 0;

  // --- Stream (output processor); null where no client listens (scheduler tests). ---
  std::unique_ptr<OutputStream> output;

  // --- Timings and totals for usage, metrics and logs. ---
  absl::Time submit_time;
  bool started = false;  // admitted at least once
  absl::Time start_time;
  bool has_first_token = false;
  absl::Time first_token_time;
  absl::Time last_token_time;
  int32_t preemptions = 0;
  int32_t kv_blocks_peak = 0;
  int32_t cached_prompt_tokens = 0;  // prefix-cache hit at the first admission
  // Compression totals of sessions lost to preemptions, and the last prefill's kept slots.
  int32_t compression_blocks_freed = 0;
  int64_t compression_slots_evicted = 0;
  std::vector<int32_t> compression_kept_per_layer;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  // Tokens whose K/V the next iterations must still compute (1 for a decoding sequence).
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool running() const { return state == SequenceState::kRunning; }
  bool finished() const { return state == SequenceState::kFinished; }
  // True while the sequence will hold its whole prompt uncompressed before its policy runs:
  // what admission must reserve for (the prefill peak).
  bool awaits_compression() const {
    return compression != nullptr && !compression->compressed();
  }
  // Whether the context may be attached compressed instead of computed: a context key, the
  // compression not yet run, a token left to compute after it, and no prompt rows to score.
  bool MayAttachContext() const {
    return context_key != 0 && awaits_compression() && req.prompt_logprobs < 0 &&
           compression->num_tokens() < num_tokens();
  }
  // Tokens from `computed` on that the sequence holds uncompressed before its policy runs: the
  // rest of its tokens, or, when a probe runs after the context (CompressionSession::SetProbe),
  // the context's rest and the probe's longest segment if that is more. (The rest while not
  // compressing.)
  int32_t UncompressedPeak(int32_t computed) const {
    int32_t peak = num_tokens() - computed;
    if (awaits_compression() && compression->probe_pending()) {
      const int32_t probe = compression->ProbeFootprint();
      peak = std::max(peak, compression->num_tokens() + probe - computed);
    }
    return peak;
  }
  // Free blocks a sequence that will publish its compressed context takes when it does: at
  // most one per layer (copies of partial blocks).
  int32_t ContextPublishBlocks() const {
    return context_key != 0 && awaits_compression() ? kv.num_layers() : 0;
  }
  // How many leading prompt tokens may come from the prefix cache: whole blocks, never the
  // last token (its logits are needed), and for a compressing sequence none its policy
  // observes (their query rows must be computed).
  int32_t CacheablePrefix() const;
  // Whether the chunk from `start` needs every row's logits (prompt_logprobs still to score).
  bool ScoresPrompt(int32_t start) const {
    return req.prompt_logprobs >= 0 && num_generated == 0 && start < prompt_len &&
           static_cast<int32_t>(prompt_logprobs.size()) < prompt_len - 1;
  }
};

// Scheduling order: higher priority first, then earlier arrival. Preemption victims are taken
// from the other end.
bool ScheduledBefore(const Sequence* a, const Sequence* b);

// The compression session for a prefill of `num_tokens` tokens of `req` (of which it compresses
// the first req.compression.context_tokens when that is set); null without a policy. Errors
// only for a spec the server did not validate.
absl::StatusOr<std::unique_ptr<cache::CompressionSession>> MakeCompressionSession(
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens);

// Tokens in one segment of the repeat probe, its instruction included.
inline constexpr int32_t kRepeatProbeSegment = 512;

// The repeat probe of a context (ContextProbe::kRepeat, as KVzip reconstructs it), in segments
// of at most kRepeatProbeSegment tokens: "Repeat the previous context:" and the next piece of
// the context. Each runs alone after the context (CompressionSession::SetProbe), so the probe
// adds one segment to the context's KV, not a second context.
std::vector<std::vector<int32_t>> RepeatProbeSegments(const model::Tokenizer& tokenizer,
                                                      std::span<const int32_t> context);

// The key under which the compressed context of `req` (req.compression.context_tokens > 0) is
// published and found: its tokens and embedding rows (`hidden` floats each), the salt, and
// everything the policy's plan depends on (policy, budget, params, the context's spans, the
// probe).
uint64_t CompressedContextKey(const GenerationRequest& req, int32_t hidden);

}  // namespace winnow::scheduler
