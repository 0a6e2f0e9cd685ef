// Applies a policy's KeepPlan to one sequence's cache: each (layer, KV head) gathers its kept
// slots (or the means of its merge groups) to the front of the layer, then the layer shrinks and
// the blocks it no longer needs go back to the pool at once.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/keep_plan.h"
#include "cache/sequence_kv.h"

namespace winnow::cache {

struct CompactionStats {
  int32_t blocks_freed = 0;   // returned to the pool
  int64_t slots_removed = 0;  // summed over layers (a layer's slot holds every KV head)
  int32_t layers_changed = 0;
};

// Validates the plan against `kv` (InvalidArgument, nothing changed, when it is malformed),
// then compacts. Each head's kept rows are gathered into a scratch buffer first and written
// back front to back, so any valid plan (including merges) is safe in place; only the kept
// rows are copied, bit for bit (merged entries are float means). When the pool's data lives on
// a device (cache/kv_device.h) the rows move there; a device error is returned as it is, with
// the layers before it already compacted. With `data_moved` the device has compacted the data
// itself (ScoringBackend::CompactToWindowTopK) and only the tables shrink.
absl::StatusOr<CompactionStats> ApplyKeepPlan(const policies::KeepPlan& plan, SequenceKv& kv,
                                              BlockPool& pool, bool data_moved = false);

}  // namespace winnow::cache
