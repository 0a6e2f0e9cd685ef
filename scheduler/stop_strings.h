// Stop-string matching over a stream of text deltas. Text that could still turn into a stop
// string is held back, so a client never sees the beginning of a stop string that later
// completes, and the stop string itself is never emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace winnow::scheduler {

class StopStringMatcher {
 public:
  // Empty strings in `stops` are ignored (the engine rejects them at submit).
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `delta` and returns the text that is now safe to emit. When a stop string
  // completes, sets *matched, returns only the text before the earliest match and drops the
  // rest; the matcher must not be fed again after that.
  std::string Append(std::string_view delta, bool* matched);
  // Returns whatever is held back (the stream ended without a match).
  std::string Flush();

  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace winnow::scheduler
