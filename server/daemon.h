// The `winnow serve` process: gRPC server (Inference, health, reflection) and metrics come up
// first with health NOT_SERVING, then the model loads and the engine starts, then health flips
// to SERVING. SIGTERM/SIGINT start a drain: health NOT_SERVING, new Generate calls UNAVAILABLE,
// in-flight requests finish for up to --drain-timeout, the rest are cancelled; exit 0. A lost
// device (the engine stops: every request errors) turns health off and exits 3.
#pragma once

#include "server/options.h"

namespace winnow::server {

// The exit code after the device was lost (a sticky CUDA error, base/fatal_error.h): the
// engine could run nothing more, so the process ends for its supervisor to restart it.
inline constexpr int kExitDeviceLost = 3;

// Runs until a signal has drained the daemon, or the device is lost. Returns the process exit
// code: 0 after a drain, 1 when start-up fails, 2 for a bad configuration (the reason is
// logged), kExitDeviceLost.
int RunDaemon(const ServeOptions& options);

}  // namespace winnow::server
