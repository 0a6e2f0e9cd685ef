// The task queue behind cpp-httplib's server: one thread per open connection, up to a cap.
// httplib serves a connection (keep-alive included) on one thread with blocking I/O, and an
// SSE stream holds its thread until the generation ends. A fixed pool as small as httplib's
// default (8) would leave /health and /metrics queued behind long streams on a busy pod, so
// that readiness probes time out; threads here are started as connections need them and stay
// for reuse. Connections beyond the cap wait in the queue.
#pragma once

#include <cstddef>
#include <functional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "httplib.h"

namespace winnow::server::http {

class ConnectionPool final : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionPool() override { shutdown(); }

  // void in cpp-httplib 0.11 (Debian 12), bool ("accepted") from 0.12 on (Ubuntu 24.04's 0.14,
  // the CUDA image): take whichever the installed header declares.
  using EnqueueResult =
      decltype(std::declval<httplib::TaskQueue&>().enqueue(std::function<void()>()));
  EnqueueResult enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins every thread. Idempotent.
  void shutdown() override;

 private:
  void Work();

  const size_t max_threads_;
  base::Mutex mu_;
  std::vector<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);  // FIFO via head_
  size_t head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace winnow::server::http
