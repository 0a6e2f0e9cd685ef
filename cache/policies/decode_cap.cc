#include "cache/policies/decode_cap.h"

#include <algorithm>

#include "base/status_macros.h"
#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

absl::StatusOr<DecodeCap> DecodeCap::FromConfig(const PolicyConfig& config,
                                                const ModelDims& dims) {
  DecodeCap cap;
  cap.budget = config.budget();
  cap.mode = Mode::kRelative;
  WINNOW_RETURN_IF_ERROR(config.ReadChoice<Mode>(
      "decode", &cap.mode,
      {{"relative", Mode::kRelative}, {"fixed", Mode::kFixed}, {"off", Mode::kOff}}));
  cap.slack = std::max(1, dims.block_size);
  WINNOW_RETURN_IF_ERROR(config.ReadInt("evict_every", &cap.slack, 1, 1 << 20));
  return cap;
}

int32_t DecodeCap::Cap(int32_t tokens_seen) const {
  switch (mode) {
    case Mode::kRelative:
      return KeepCount(budget, tokens_seen);
    case Mode::kFixed:
      return std::max(prefill_kept, 1);
    case Mode::kOff:
      break;
  }
  return INT32_MAX;
}

bool DecodeCap::ShouldEvict(int32_t slots, int32_t tokens_seen) const {
  if (mode == Mode::kOff) return false;
  return slots >= static_cast<int64_t>(Cap(tokens_seen)) + slack;
}

int64_t DecodeCap::MaxSlotsPerLayer(int32_t prompt_tokens, int32_t generated) const {
  const int32_t kept = KeepCount(budget, prompt_tokens);
  if (mode == Mode::kOff) return int64_t{kept} + generated;
  // Never more than the cap plus the slack, and never more than without eviction.
  const int64_t capped = int64_t{Cap(prompt_tokens + generated)} + slack;
  return std::min<int64_t>(int64_t{kept} + generated, capped);
}

}  // namespace winnow::cache::policies
