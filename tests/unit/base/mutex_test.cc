// base::Mutex: Await semantics, and that the last thread to lock a Mutex may destroy it.
#include "base/mutex.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "absl/time/time.h"

namespace winnow::base {
namespace {

struct Guarded {
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
};

TEST(MutexTest, AwaitReturnsOnceTheConditionHolds) {
  Guarded g;
  std::thread setter([&] {
    MutexLock lock(&g.mu);
    g.done = true;
  });
  {
    MutexLock lock(&g.mu);
    g.mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return g.done; });
    EXPECT_TRUE(g.done);
  }
  setter.join();
}

TEST(MutexTest, AwaitWithTimeoutGivesUp) {
  Guarded g;
  MutexLock lock(&g.mu);
  EXPECT_FALSE(g.mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return g.done; },
                                     absl::Milliseconds(10)));
}

// The pattern of a gRPC reactor's OnDone: the owner polls under the lock and frees the object
// as soon as it sees the flag, possibly while the setter is still inside Unlock. Unlock must
// not touch the Mutex after releasing it; under `make test-tsan` the old order (unlock, then
// notify) is reported here as a race with the delete.
TEST(MutexTest, TheNextOwnerMayDestroyItRightAfterUnlock) {
  for (int round = 0; round < 200; ++round) {
    auto g = std::make_unique<Guarded>();
    std::thread setter([p = g.get()] {
      MutexLock lock(&p->mu);
      p->done = true;
    });
    for (bool done = false; !done;) {
      MutexLock lock(&g->mu);
      done = g->done;
    }
    g.reset();
    setter.join();
  }
}

}  // namespace
}  // namespace winnow::base
