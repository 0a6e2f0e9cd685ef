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
#include "model/chat_template.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/engine_observer.h"
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
  // Compressed-context reuse (empty when off): per stage of the context, the key under which it
  // is published once compressed, or attached (cache/compressed_prefix.h).
  std::vector<uint64_t> context_keys;
  // The stage of the context whose session is `compression` (0 unstaged), and the sessions of
  // the later stages, made at Submit: [i] is stage i's until it takes over (null then).
  int32_t stage = 0;
  std::vector<std::unique_ptr<cache::CompressionSession>> stage_sessions;
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
  // With req.trace.sampled: the compactions its spans show (RequestStats::compressions).
  std::vector<CompressionEvent> traced_compressions;
  int32_t untraced_compressions = 0;

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
  // The key the current stage of the context is published under (0: not published).
  uint64_t context_key() const { return context_keys.empty() ? 0 : context_keys[stage]; }
  int32_t num_stages() const { return req.compression.num_stages(); }
  // Stage `i`'s session: the current one, or a later one not yet started.
  const cache::CompressionSession& StageSession(int32_t i) const {
    return i == stage ? *compression : *stage_sessions[i];
  }
  // Whether the context may be attached compressed instead of computed: context keys, nothing
  // compressed yet, a token left to compute after it, and no prompt rows to score.
  bool MayAttachContext() const {
    return !context_keys.empty() && stage == 0 && awaits_compression() &&
           req.prompt_logprobs < 0 && req.compression.context_tokens < num_tokens();
  }
  // Stage `next` takes over after the stages before it were compressed (or attached) to
  // `history`, which `kv` holds: its session starts after them (the totals of the one it
  // replaces are kept). Nothing changes when that fails.
  absl::Status StartStage(int32_t next, const cache::policies::SlotPositions& history);
  // Stages up to `last` were attached compressed to `positions`: stage `last`'s session adopts
  // them, as if it had compressed them itself.
  absl::Status AdoptStages(int32_t last, const cache::policies::SlotPositions& positions);
  // Tokens from `computed` on that the sequence holds uncompressed before its policy runs: the
  // rest of its tokens, or, when a probe runs after a context or stage
  // (CompressionSession::SetProbe), what is left of it and the probe's longest segment if that
  // is more. (The rest while not compressing.)
  int32_t UncompressedPeak(int32_t computed) const {
    int32_t peak = num_tokens() - computed;
    if (!awaits_compression()) return peak;
    for (int32_t i = stage; i < num_stages(); ++i) {
      const cache::CompressionSession& c = StageSession(i);
      if (c.probe_pending()) peak = std::max(peak, c.num_tokens() + c.ProbeFootprint() - computed);
    }
    return peak;
  }
  // Free blocks a sequence that will publish its compressed context takes when it does: at
  // most one per layer (copies of partial blocks).
  int32_t ContextPublishBlocks() const {
    return context_key() != 0 && awaits_compression() ? kv.num_layers() : 0;
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
// the first req.compression.context_tokens when that is set, or that context's `stage`); null
// without a policy. Errors only for a spec the server did not validate.
absl::StatusOr<std::unique_ptr<cache::CompressionSession>> MakeCompressionSession(
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens,
    int32_t stage = 0);
// The sessions of every stage of `req`'s context after the first (Sequence::stage_sessions);
// InvalidArgument naming compression.scope for a policy that cannot compress in stages.
absl::StatusOr<std::vector<std::unique_ptr<cache::CompressionSession>>> MakeStageSessions(
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens);

// The context tokens a later segment of the repeat probe quotes from the piece before its own.
inline constexpr int32_t kRepeatProbeAnchor = 8;

// The repeat probe's frame (ProbeFrame) that `chat` renders: the text a user turn adds after a
// conversation, split around its content, up to the assistant's header. The plain frame when
// the template cannot say (its rendering of a longer conversation does not extend a shorter
// one's).
ProbeFrame ChatProbeFrame(const model::ChatTemplate& chat);

// The repeat probe of a context (ContextProbe::kRepeat, KVzip's reconstruction), in segments
// of at most `segment_tokens` tokens (InvalidArgument when that leaves no room for a piece),
// each an instruction in `frame` and the next piece of the context, scoring that piece:
// "Repeat the previous context exactly." for the first; "Repeat the part of the previous
// context exactly, starting with" and the previous piece's last kRepeatProbeAnchor tokens for
// the others. Each runs alone after the context
// (CompressionSession::SetProbe), so the probe adds one segment to the context's KV, not a
// second context.
absl::StatusOr<std::vector<cache::ProbeSegment>> RepeatProbeSegments(
    const model::Tokenizer& tokenizer, std::span<const int32_t> context, int32_t segment_tokens,
    const ProbeFrame& frame = {});

// The key under which stage `stage` of the compressed context of `req`
// (req.compression.context_tokens > 0) is published and found: the tokens and embedding rows
// (`hidden` floats each) up to its end, the salt, and everything the policy's plan depends on
// (policy, budget, params, the spans, the probe, where the earlier stages end).
uint64_t CompressedContextKey(const GenerationRequest& req, int32_t hidden, int32_t stage = 0);

}  // namespace winnow::scheduler
