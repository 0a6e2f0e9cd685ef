#include "scheduler/stop_strings.h"

#include <algorithm>
#include <utility>

namespace winnow::scheduler {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStringMatcher::Append(std::string_view delta, bool* matched) {
  *matched = false;
  if (stops_.empty()) return std::string(delta);
  held_.append(delta);

  // Earliest match wins: it is where the client-visible text must end. Only held_ needs
  // searching, because everything emitted before could not start any stop string.
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t pos = held_.find(stop);
    if (pos < earliest) earliest = pos;
  }
  if (earliest != std::string::npos) {
    *matched = true;
    std::string out = held_.substr(0, earliest);
    held_.clear();
    return out;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string. Stop strings and
  // held_ are valid UTF-8, and a stop string starts on a character boundary, so the cut never
  // splits a character.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(stop).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace winnow::scheduler
