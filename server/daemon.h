// The `winnow serve` process: gRPC server (Inference, health, reflection) and metrics come up
// first with health NOT_SERVING, then the model loads and the engine starts, then health flips
// to SERVING. SIGTERM/SIGINT start a drain: health NOT_SERVING, new Generate calls UNAVAILABLE,
// in-flight requests finish for up to --drain-timeout, the rest are cancelled; exit 0.
#pragma once

#include "server/options.h"

namespace winnow::server {

// Runs until a signal has drained the daemon. Returns the process exit code: 0 after a drain,
// 1 when start-up fails (the reason is logged).
int RunDaemon(const ServeOptions& options);

}  // namespace winnow::server
