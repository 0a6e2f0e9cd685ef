// The decode-time cache cap shared by the baselines that evict while decoding (StreamingLLM, H2O),
// so both bound the cache the same way.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {

struct DecodeCap {
  enum class Mode { kRelative, kFixed, kOff };
  Mode mode = Mode::kRelative;
  double budget = 1.0;
  int32_t prefill_kept = 0;  // slots per layer kept at prefill (kFixed's cap)
  int32_t slack = 16;        // slots allowed above the cap before evicting (amortises compaction)

  // Reads params "decode" and "evict_every".
  static absl::StatusOr<DecodeCap> FromConfig(const PolicyConfig& config, const ModelDims& dims);
  // Slots a layer may keep once `tokens_seen` tokens have been written.
  int32_t Cap(int32_t tokens_seen) const;
  // True when a layer holding `slots` slots should be trimmed to Cap(tokens_seen).
  bool ShouldEvict(int32_t slots, int32_t tokens_seen) const;
  // Admission bound on slots per layer after `generated` more tokens.
  int64_t MaxSlotsPerLayer(int32_t prompt_tokens, int32_t generated) const;
  // The policy's SteadyStateSlots: MaxSlotsPerLayer in every layer.
  int64_t SteadyStateSlots(const ModelDims& dims, int32_t prompt_tokens, int32_t generated) const {
    return int64_t{dims.num_layers} * MaxSlotsPerLayer(prompt_tokens, generated);
  }
};

}  // namespace winnow::cache::policies
