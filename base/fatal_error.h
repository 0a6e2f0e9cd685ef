// Errors after which the process cannot serve any more: a device whose context is lost (a
// "sticky" CUDA error: every later call on that context fails too). Marked by a payload on an
// ordinary absl::Status, so that the layers in between pass it on unchanged; the engine stops on
// one (scheduler/engine.h) and the daemon exits non-zero so that its supervisor (Kubernetes)
// restarts it (docs/reliability.md, "When the device is lost").
#pragma once

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace winnow::base {

inline constexpr absl::string_view kFatalPayload = "type.winnow.dev/fatal";

// `status` marked fatal (an OK status stays OK).
inline absl::Status MarkFatal(absl::Status status) {
  if (!status.ok()) status.SetPayload(kFatalPayload, absl::Cord("device lost"));
  return status;
}

inline bool IsFatal(const absl::Status& status) {
  return status.GetPayload(kFatalPayload).has_value();
}

}  // namespace winnow::base
