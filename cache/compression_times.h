// The compression hooks' time by phase: small enough for the engine's observer interface to carry
// without the compression machinery's headers.
#pragma once

#include "absl/time/time.h"

namespace winnow::cache {

// Where a session's hook time went, by the host's clock (so a device backend's waits for its
// kernels count where they happen). The column sums a forward accumulates while it runs
// (accumulate_all_rows) are the forward's time, not these.
struct CompressionPhaseTimes {
  absl::Duration scoring;     // the scoring backend's calls after the prefill
  absl::Duration planning;    // the policy's decisions: ObserveLayer, Plan, OnDecodeStep
  absl::Duration compaction;  // applying plans (ApplyKeepPlan): frees, device copies queued

  CompressionPhaseTimes& operator+=(const CompressionPhaseTimes& other) {
    scoring += other.scoring;
    planning += other.planning;
    compaction += other.compaction;
    return *this;
  }
  CompressionPhaseTimes operator-(const CompressionPhaseTimes& other) const {
    return {scoring - other.scoring, planning - other.planning, compaction - other.compaction};
  }
};

}  // namespace winnow::cache
