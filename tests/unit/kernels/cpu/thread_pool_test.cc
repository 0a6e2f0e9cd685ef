#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace winnow::kernels {
namespace {

// Runs one ParallelFor and checks that every index in [0, n) is visited exactly once, that
// chunk boundaries sit on multiples of the grain, and that no more chunks than threads ran.
void CheckCoverage(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> chunks{0};
  std::atomic<bool> misaligned{false};
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    chunks.fetch_add(1);
    const int64_t g = std::max<int64_t>(grain, 1);
    if (begin % g != 0 || (end != n && end % g != 0) || begin >= end) misaligned = true;
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
  }
  EXPECT_FALSE(misaligned.load()) << "n=" << n << " grain=" << grain;
  EXPECT_LE(chunks.load(), pool.num_threads());
  if (n == 0) {
    EXPECT_EQ(chunks.load(), 0);
  }
}

TEST(ThreadPoolTest, DefaultUsesHardwareConcurrency) {
  ThreadPool pool;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(pool.num_threads(), hw > 0 ? hw : 1);
  ThreadPool negative(-3);
  EXPECT_EQ(negative.num_threads(), pool.num_threads());
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1000, 12345}) {
      for (int64_t grain : {-1, 0, 1, 2, 3, 7, 16, 64, 1000, 100000}) {
        CheckCoverage(pool, n, grain);
      }
    }
  }
}

TEST(ThreadPoolTest, ManyTinyCallsInARow) {
  // The decode pattern: hundreds of small back-to-back jobs.
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  int64_t expected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const int64_t n = 1 + iter % 37;
    expected += n * (n - 1) / 2;
    pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
      int64_t local = 0;
      for (int64_t i = begin; i < end; ++i) local += i;
      total.fetch_add(local, std::memory_order_relaxed);
    });
  }
  EXPECT_EQ(total.load(), expected);
}

TEST(ThreadPoolTest, WorksAfterWorkersFallAsleep) {
  ThreadPool pool(3);
  for (int iter = 0; iter < 5; ++iter) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin window
    CheckCoverage(pool, 999, 10);
  }
}

TEST(ThreadPoolTest, ChunksRunOnDistinctThreadsWithCallerFirst) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::thread::id> ids(4);
  pool.ParallelFor(4, 1, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t i = begin; i < end; ++i) ids[i] = std::this_thread::get_id();
  });
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), 4u);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  int calls = 0;
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 100);
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPoolTest, CallersMayTakeTurns) {
  // Only one caller at a time, but it need not be the thread that built the pool.
  ThreadPool pool(3);
  for (int round = 0; round < 4; ++round) {
    std::thread caller([&] { CheckCoverage(pool, 500, 3); });
    caller.join();
  }
}

}  // namespace
}  // namespace winnow::kernels
