// Turns a wire GenerateRequest into the engine's GenerationRequest: tokenizes text, renders chat
// messages, flattens segments. This is the one place a request is validated: every error names
// the field of the public API it is about (e.g. "segments[2].embedding.values",
// "sampling.temperature", "compression.params.window", "stopping.stop[2]"), and the engine
// trusts what comes out. Engine::Submit keeps only what depends on the engine's state: the
// context and KV-pool fit, a full queue, draining.
//
// A GenerationRequest returned by BuildGenerationRequest holds, by construction:
//   - prompt_tokens: non-empty, at most limits.max_prompt_tokens (when > 0), every id in the
//     vocabulary or model::kEmbeddingInput;
//   - embeddings: hidden_size finite floats per kEmbeddingInput position;
//   - prompt_spans: sorted, disjoint, non-empty and inside the prompt. The builder makes them
//     itself from the segments it flattens (one span per embedding or non-empty context
//     segment, in order), so they need no check: PromptLayout::Validate cannot fail on them;
//   - max_tokens in [1, limits.max_tokens_limit] (no upper bound when the limit is 0);
//   - sampling: passes model::SamplingParams::Validate; logit_bias ids are in the vocabulary,
//     sorted, with biases in [-100, 100];
//   - grammar: response_format's, or the tool calls a chat's tool_choice requires (null when
//     the reply is free); never together with ignore_eos;
//   - prompt_logprobs: -1 (off) or in [0, kMaxTopLogprobs];
//   - stop_strings: at most kMaxStopStrings, none empty; stop_token_ids in the vocabulary;
//   - compression: cache::policies::CreatePolicy accepts it with the context the engine will
//     build (model dimensions, limits.block_size, this prompt's length and spans), so the
//     policy's own parameters are checked here too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "winnow/v1/inference.pb.h"

namespace winnow::server {

struct RequestLimits {
  int32_t max_prompt_tokens = 0;  // 0: no limit here (the engine still checks the context)
  int32_t max_tokens_limit = 0;   // 0: no limit
  int32_t context_length = 0;
  // Used when the request leaves stopping.max_tokens unset, then capped by the limit and by
  // the context left after the prompt.
  int32_t default_max_tokens = 256;
  // The engine's KV block size: compression policies are built against it here, as the engine
  // builds them. The default is an engine's default.
  int32_t block_size = scheduler::EngineOptions{}.block_size;
  bool kv_logit_bias = false;  // as the engine's pool (mass-preserving merges need it)
};

// The limits of a running engine: what the daemon and `winnow generate` pass.
RequestLimits LimitsFor(const scheduler::EngineLimits& engine);

inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxCacheSaltBytes = 256;
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr int32_t kMaxSamples = 16;  // GenerateRequest.n

// Prompt token ids (and embedding rows) of a request's input, validated.
struct PromptInput {
  std::vector<int32_t> tokens;  // model::kEmbeddingInput marks embedding positions
  std::vector<float> embeddings;
  // Embedding and context segments as positions, for the compression policies.
  std::vector<cache::policies::PromptSpan> spans;
};

absl::StatusOr<PromptInput> BuildPrompt(const v1::GenerateRequest& request,
                                        const model::Model& model);

// Renders chat messages with the model's template and tokenizes them.
absl::StatusOr<std::vector<int32_t>> TokenizeChat(const v1::ChatMessages& chat,
                                                  const model::Model& model, bool add_special,
                                                  const std::string& field);

// Validates the whole request (see the top of this file) and builds the engine's request.
// Errors: InvalidArgument naming the field; FailedPrecondition for chat input on a model without
// a recognised chat template. request_id is copied as given (may be empty) and deadline left
// unset: the caller owns both.
absl::StatusOr<scheduler::GenerationRequest> BuildGenerationRequest(
    const v1::GenerateRequest& request, const model::Model& model, const RequestLimits& limits);

// The seed sample (choice) i of a seeded n > 1 request draws from, on either API: the request's
// seed + i, so that n samples differ and each is reproducible alone.
inline uint64_t SampleSeed(uint64_t seed, int32_t i) { return seed + static_cast<uint64_t>(i); }

// The engine's requests for the request's `n` samples (0 or 1: one), the prompt tokenized once:
// the first as BuildGenerationRequest builds it, sample i drawing from SampleSeed and without
// prompt_logprobs. InvalidArgument naming "n" when it is out of [0, kMaxSamples].
absl::StatusOr<std::vector<scheduler::GenerationRequest>> BuildSamples(
    const v1::GenerateRequest& request, const model::Model& model, const RequestLimits& limits);

}  // namespace winnow::server
