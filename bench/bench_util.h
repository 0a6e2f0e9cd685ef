// Shared by the C++ benchmarks: the clock, and flag values read through the CLI's parser
// (server/cli/args.h), so every bench accepts `--name value` and `--name=value` and rejects
// unknown flags and bad values with a message naming the flag.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/cli/args.h"

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

// Parses argv[1..] with cli::Args.
inline absl::StatusOr<cli::Args> ParseArgs(int argc, char** argv,
                                           const std::vector<std::string>& value_flags,
                                           const std::vector<std::string>& bool_flags = {}) {
  return cli::Args::Parse(std::vector<std::string>(argv + 1, argv + argc), value_flags,
                          bool_flags);
}

// --name as an integer, at least `min`.
inline absl::StatusOr<int32_t> IntFlag(const cli::Args& args, std::string_view name,
                                       int64_t fallback, int64_t min) {
  absl::StatusOr<int64_t> v = args.GetInt(name, fallback);
  if (!v.ok()) return v.status();
  if (*v < min || *v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--", std::string(name), " must be at least ", min));
  }
  return static_cast<int32_t>(*v);
}

// --name as a comma-separated list of numbers (T = int32_t or double), `fallback` when absent;
// an empty list is an error.
template <typename T>
absl::StatusOr<std::vector<T>> ListFlag(const cli::Args& args, std::string_view name,
                                        std::vector<T> fallback) {
  if (!args.Has(name)) return fallback;
  std::vector<T> out;
  // (Debian's Abseil has its own string_view: names go through std::string.)
  const std::string flag(name);
  for (absl::string_view part : absl::StrSplit(args.GetString(name), ',', absl::SkipEmpty())) {
    T v{};
    bool ok;
    if constexpr (std::is_same_v<T, double>) {
      ok = absl::SimpleAtod(part, &v);
    } else {
      ok = absl::SimpleAtoi(part, &v);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad number '", part, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

}  // namespace winnow::bench
