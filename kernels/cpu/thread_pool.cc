#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace winnow::kernels {
namespace {

// Decode issues a few hundred tiny ParallelFor calls per token with little serial work between
// them, so workers that just finished a job are likely to get the next one within microseconds.
// Spinning for this long keeps them off the futex path (tens of microseconds to wake) for
// back-to-back jobs while still letting an idle daemon sleep.
constexpr auto kWorkerSpin = std::chrono::microseconds(100);

// Chunk counts live in the low bits of the published state word (see Impl::state).
constexpr int kChunkBits = 16;
constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
constexpr int kMaxThreads = static_cast<int>(kChunkMask);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

struct ThreadPool::Impl {
  explicit Impl(int n);
  ~Impl();

  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  void WorkerLoop(int index);
  uint64_t WaitForNewState(uint64_t seen);
  void RunChunk(int chunk, int num_chunks) const;
  void WaitForWorkers() const;

  int num_threads;
  std::vector<std::thread> workers;

  // The job, written by the caller before it publishes `state` (release) and read by a worker
  // only after it saw that state (acquire) and only if it takes part; the caller then waits for
  // every participant before it may write the next job, so these need no atomics.
  const std::function<void(int64_t, int64_t)>* job_fn = nullptr;
  int64_t job_n = 0;
  int64_t job_grain = 1;
  int64_t job_units = 0;
  uint64_t sequence = 0;  // caller-only

  // (sequence << kChunkBits) | num_chunks. Packing the chunk count into the word a worker waits
  // on lets a worker with nothing to do in this job decide so without reading the job fields,
  // which the caller may already be rewriting for the next job.
  alignas(64) std::atomic<uint64_t> state{0};
  alignas(64) std::atomic<int> pending{0};  // participating workers not yet done
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
};

ThreadPool::Impl::Impl(int n) : num_threads(std::clamp(n, 1, kMaxThreads)) {
  workers.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::Impl::~Impl() {
  stop.store(true, std::memory_order_relaxed);
  state.store((++sequence) << kChunkBits, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(mu);
  }
  cv.notify_all();
  for (std::thread& t : workers) t.join();
}

uint64_t ThreadPool::Impl::WaitForNewState(uint64_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + kWorkerSpin;
  for (uint32_t i = 1;; ++i) {
    const uint64_t s = state.load(std::memory_order_acquire);
    if (s != seen) return s;
    CpuRelax();
    if ((i & 63) == 0) {
      // Reading the clock costs ~20ns, so only every 64 pauses. The yield matters when the
      // machine is oversubscribed: a spinning worker must not hold a core that the thread it
      // is waiting for (the caller, or a peer still on its chunk) needs to make progress.
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::yield();
    }
  }
  // Dekker-style handshake with ParallelFor: we announce ourselves in `sleepers` before the last
  // look at `state`, and the caller bumps `state` before it reads `sleepers`, so at least one of
  // us sees the other and no wake-up is lost. Both sides use seq_cst for that reason.
  std::unique_lock<std::mutex> lock(mu);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  uint64_t s;
  while ((s = state.load(std::memory_order_seq_cst)) == seen) cv.wait(lock);
  sleepers.fetch_sub(1, std::memory_order_relaxed);
  return s;
}

void ThreadPool::Impl::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    seen = WaitForNewState(seen);
    if (stop.load(std::memory_order_relaxed)) return;
    const int num_chunks = static_cast<int>(seen & kChunkMask);
    if (index < num_chunks) {
      RunChunk(index, num_chunks);
      pending.fetch_sub(1, std::memory_order_release);
    }
  }
}

// Chunk boundaries fall on multiples of the grain, so callers can use the grain as an alignment
// (e.g. a panel of weight rows) and never see a split unit.
void ThreadPool::Impl::RunChunk(int chunk, int num_chunks) const {
  const int64_t unit_begin = job_units * chunk / num_chunks;
  const int64_t unit_end = job_units * (chunk + 1) / num_chunks;
  const int64_t begin = unit_begin * job_grain;
  const int64_t end = std::min(job_n, unit_end * job_grain);
  if (begin < end) (*job_fn)(begin, end);
}

void ThreadPool::Impl::WaitForWorkers() const {
  // The caller just ran its own chunk, so the others should be close behind: spin, but yield
  // now and then in case a worker was descheduled on an oversubscribed machine.
  for (uint32_t i = 1; pending.load(std::memory_order_acquire) != 0; ++i) {
    CpuRelax();
    if ((i & 63) == 0) std::this_thread::yield();
  }
}

void ThreadPool::Impl::ParallelFor(int64_t n, int64_t grain,
                                   const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int num_chunks = static_cast<int>(std::min<int64_t>(units, num_threads));
  if (num_chunks == 1) {
    fn(0, n);  // nothing to share: skip the hand-off entirely
    return;
  }
  job_fn = &fn;
  job_n = n;
  job_grain = grain;
  job_units = units;
  pending.store(num_chunks - 1, std::memory_order_relaxed);
  state.store(((++sequence) << kChunkBits) | static_cast<uint64_t>(num_chunks),
              std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    // Taking the mutex orders this notify after a sleeper's wait() has released it.
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
  RunChunk(0, num_chunks);
  WaitForWorkers();
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  impl_ = new Impl(num_threads);
}

ThreadPool::~ThreadPool() { delete impl_; }

int ThreadPool::num_threads() const { return impl_->num_threads; }

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  impl_->ParallelFor(n, grain, fn);
}

}  // namespace winnow::kernels
