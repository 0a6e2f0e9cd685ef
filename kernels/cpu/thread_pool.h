// A fixed pool of worker threads for data-parallel loops inside one forward pass.
#pragma once

#include <cstdint>
#include <functional>

namespace winnow::kernels {

class ThreadPool {
 public:
  // num_threads <= 0 means one per hardware thread. The calling thread participates, so a pool
  // of N threads starts N - 1 workers.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;

  // Splits [0, n) into contiguous chunks of at least `grain` items and runs fn(begin, end) on
  // them across the pool; returns when all are done. Not reentrant: fn must not call
  // ParallelFor on the same pool. Only one thread may call ParallelFor at a time.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace winnow::kernels
