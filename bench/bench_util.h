// Shared by the C++ benchmarks: the clock and policy entries. (Flags: base/cli.h.)
#pragma once

#include <time.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/policies/policy.h"

namespace winnow::bench {

// Seconds on the chosen clock: wall (steady) or this thread's CPU time.
inline double Now(bool cpu_time) {
  if (cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A --policies entry: a policy name, optionally with parameters of its own after '+'
// ("winnowkv_docs+lookahead=16+window=48"), typed as a client would send them (numbers as
// params, the rest as options: cache::policies::ParsePolicyParam). Benchmarks report a run under
// the whole entry, so variants sit next to the default.
struct PolicyEntry {
  std::string name;
  cache::policies::PolicyParams params;
};

inline absl::StatusOr<PolicyEntry> ParsePolicyEntry(const std::string& entry) {
  const std::vector<std::string> parts = absl::StrSplit(entry, '+');
  PolicyEntry parsed{parts[0], {}};
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("policy entry ", entry, ": expected k=v"));
    }
    parsed.params[parts[i].substr(0, eq)] =
        cache::policies::ParsePolicyParam(parts[i].substr(eq + 1));
  }
  return parsed;
}

}  // namespace winnow::bench
