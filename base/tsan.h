// Happens-before edges that ThreadSanitizer cannot see on its own, stated by hand.
//
// Debian's gRPC is not built with TSan, so the ordering it guarantees between threads (a
// reactor handed from the thread that created it to the one that runs its reactions) is
// invisible, and TSan reports the reactor's own fields as racing. HappensBefore(p) before
// handing `p` to such a library and HappensAfter(p) where the library hands it back state
// that ordering. Both compile to nothing without -fsanitize=thread.
#pragma once

#include "absl/base/config.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace winnow::base {

#ifdef ABSL_HAVE_THREAD_SANITIZER
inline void HappensBefore(const void* p) { __tsan_release(const_cast<void*>(p)); }
inline void HappensAfter(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
#else
inline void HappensBefore(const void*) {}
inline void HappensAfter(const void*) {}
#endif

}  // namespace winnow::base
