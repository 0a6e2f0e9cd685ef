// Turns a wire GenerateRequest into the engine's GenerationRequest: tokenizes text, renders chat
// messages, flattens segments, and validates everything whose error should name a field of the
// public API (e.g. "segments[2].embedding.values"). The engine re-checks what it relies on
// (vocabulary, sampling ranges, context and pool fit) and phrases those errors itself.
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
};

inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxStopStrings = 64;

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

absl::StatusOr<scheduler::GenerationRequest> BuildGenerationRequest(
    const v1::GenerateRequest& request, const model::Model& model, const RequestLimits& limits);

}  // namespace winnow::server
