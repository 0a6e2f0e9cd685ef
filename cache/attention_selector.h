// Decode-time sparse attention without eviction (TokenSelect-style): before a layer's attention,
// the forward asks the sequence's selector which of its past slots the new tokens attend to.
// Nothing is freed; only the attention work shrinks. The selector reads the keys through the
// scoring backend it was handed (cache/scoring_backend.h, the forward's own), so the forward
// calls into cache/ and the device work comes back through the backend the forward provides.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/sequence_kv.h"

namespace winnow::cache {

class AttentionSelector {
 public:
  virtual ~AttentionSelector() = default;

  // `q`: the post-RoPE query rows of the sequence's new tokens in `layer`, num_new x num_heads x
  // head_dim floats. `past_slots`: slots of `layer` that precede the new tokens (the new tokens'
  // own K/V are already written after them and are always attended, causally).
  // Return false to attend densely. Return true after filling `slots` with ascending, unique
  // slot indices < past_slots, shared by every KV head of the layer: the new tokens then attend
  // to exactly those past slots plus themselves. Called on the engine thread, once per layer per
  // forward in which the sequence takes part.
  virtual bool Select(int32_t layer, std::span<const float> q, int32_t num_new,
                      int32_t past_slots, const SequenceKv& kv, std::vector<int32_t>* slots) = 0;
  // An error the selection met (a call into its scoring backend): the forward
  // fails with it after Select, whatever Select returned.
  virtual absl::Status error() const { return absl::OkStatus(); }
};

// InternalError unless `slots` is a list Select may return for `past_slots` past slots
// (ascending, unique, in [0, past_slots)): a bad list would read other sequences' blocks, so
// the forwards refuse it rather than trust it.
inline absl::Status CheckSelection(std::span<const int32_t> slots, int32_t past_slots,
                                   int32_t layer) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= past_slots || (i > 0 && slots[i] <= slots[i - 1])) {
      return absl::InternalError(
          absl::StrCat("attention selector returned an invalid slot list for layer ", layer));
    }
  }
  return absl::OkStatus();
}

}  // namespace winnow::cache
