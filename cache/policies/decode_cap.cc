#include "cache/policies/decode_cap.h"

#include <algorithm>

#include "cache/policies/scoring_helpers.h"

namespace winnow::cache::policies {

absl::StatusOr<DecodeCap> DecodeCap::FromConfig(const PolicyConfig& config,
                                                const ModelDims& dims) {
  DecodeCap cap;
  cap.budget = config.budget();
  absl::StatusOr<std::string> mode =
      config.GetEnum("decode", "relative", {"relative", "fixed", "off"});
  if (!mode.ok()) return mode.status();
  cap.mode = *mode == "relative" ? Mode::kRelative : *mode == "fixed" ? Mode::kFixed : Mode::kOff;
  absl::StatusOr<int64_t> slack =
      config.GetInt("evict_every", std::max(1, dims.block_size), 1, 1 << 20);
  if (!slack.ok()) return slack.status();
  cap.slack = static_cast<int32_t>(*slack);
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
