// Token selection from logits: greedy, temperature, top-k, top-p, min-p, and repetition,
// frequency and presence penalties; seeded, so a seed makes sampling deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace winnow::model {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy
  int32_t top_k = 0;               // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off; applies to prompt and generated tokens
  float frequency_penalty = 0.0f;  // applies to generated tokens
  float presence_penalty = 0.0f;   // applies to generated tokens
  uint64_t seed = 0;
  int32_t top_logprobs = 0;        // how many top log-probabilities to report per token
  // Added to the logits of these token ids before sampling (OpenAI's logit_bias: -100 bans a
  // token, 100 all but forces it).
  std::vector<std::pair<int32_t, float>> logit_bias;

  // InvalidArgument naming the field for NaN, negative or out-of-range values.
  absl::Status Validate() const;
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;  // log-probability of `id` under the unmodified distribution
  std::vector<std::pair<int32_t, float>> top_logprobs;  // highest first
};

// The log-probability of `id` under `logits` and the `top` most likely tokens: what Sampler
// reports for a sampled token, and what scoring given tokens (prompt log-probabilities)
// reports. `log_norm` as for Sample; `scratch`, when given, is reused for the ranking.
SampledToken ScoreToken(std::span<const float> logits, int32_t id, int32_t top,
                        std::optional<float> log_norm = std::nullopt,
                        std::vector<int32_t>* scratch = nullptr);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Registers prompt tokens (seen by the repetition penalty).
  void AddPromptTokens(std::span<const int32_t> tokens);
  // Picks the next token from `logits` (vocab_size floats) and records it as generated.
  // `log_norm`, when given, is log(sum(exp(logits))) computed elsewhere (on the GPU), which
  // spares the pass over the vocabulary that log-probabilities otherwise need. `allowed`, when
  // not empty, is a bit mask over the vocabulary (bit id % 64 of word id / 64): only those
  // tokens may be picked (constrained decoding); at least one must be set.
  SampledToken Sample(std::span<const float> logits,
                      std::optional<float> log_norm = std::nullopt,
                      std::span<const uint64_t> allowed = {});

 private:
  // Penalties and logit biases applied to work_, a copy of the logits.
  void ApplyPenalties();
  // Tokens outside `allowed` get -inf in work_.
  void ApplyMask(std::span<const uint64_t> allowed);
  // Temperature, top-k, top-p and min-p over work_, then a seeded draw among what is left.
  int32_t SampleWithTemperature();
  // Orders candidate ids in order_ by descending work_ logit (ties: lower id first), only as far
  // as top-k needs; returns how many are kept.
  int32_t RankCandidates();
  // Draws one of order_'s first `keep` ids in proportion to `probs`.
  int32_t Draw(const std::vector<double>& probs, int32_t keep);
  // The result for `chosen` (ScoreToken under the raw logits); records it as generated.
  SampledToken Finish(std::span<const float> logits, int32_t chosen,
                      std::optional<float> log_norm);

  SamplingParams params_;
  std::mt19937_64 rng_;
  absl::flat_hash_map<int32_t, int32_t> prompt_counts_;
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

}  // namespace winnow::model
