// A mutex that ThreadSanitizer sees and Clang's thread-safety analysis checks
// (ABSL_GUARDED_BY and friends work with it as with absl::Mutex).
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt library compiled without TSan, and
// absl::Mutex synchronises through its own futex calls, which TSan does not model. A
// -fsanitize=thread build would see none of the engine's locking and report every guarded
// access as a race. This wraps std::mutex (whose pthread calls TSan intercepts) with the same
// Await semantics: every Unlock wakes the waiters, which re-check their condition under the
// lock.
#pragma once

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace winnow::base {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes the waiters before releasing: once mu_ is free, the next owner may destroy this
  // Mutex (an object that holds one is often freed by the last thread to lock it), so
  // nothing here may touch cv_ after the unlock. A live daemon under TSan caught the reverse
  // order (docs/reliability.md).
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    cv_.notify_all();
    mu_.unlock();
  }

  // Releases the lock until `cond()` holds (evaluated with the lock held), then returns with
  // the lock held again.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv_.wait(lock, cond);
    lock.release();
  }
  // Like Await, but gives up after `timeout`; returns whether `cond()` holds.
  template <typename Cond>
  bool AwaitWithTimeout(Cond cond, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (timeout == absl::InfiniteDuration()) {
      Await(cond);
      return true;
    }
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool met = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), cond);
    lock.release();
    return met;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace winnow::base
