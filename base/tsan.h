// Happens-before edges that ThreadSanitizer cannot see on its own, stated by hand.
//
// Debian's gRPC is not built with TSan, so the ordering it guarantees between threads (a
// reactor handed from the thread that created it to the one that runs its reactions) is
// invisible, and TSan reports the reactor's own fields as racing. HappensBefore(p) before
// handing `p` to such a library and HappensAfter(p) where the library hands it back state
// that ordering. Both compile to nothing without -fsanitize=thread.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define WINNOW_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WINNOW_TSAN 1
#endif
#endif

#ifdef WINNOW_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace winnow::base {

inline void HappensBefore(const void* p) {
#ifdef WINNOW_TSAN
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

inline void HappensAfter(const void* p) {
#ifdef WINNOW_TSAN
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace winnow::base
