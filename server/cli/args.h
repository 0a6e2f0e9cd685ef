// Minimal command-line parsing for winnow's subcommands: `--name value`, `--name=value` and
// boolean `--flag`. Unknown flags are an error so that typos never pass silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace winnow::cli {

class Args {
 public:
  // value_flags take a value; bool_flags do not. Both are given without the leading "--".
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<std::string>& value_flags,
                                    const std::vector<std::string>& bool_flags);

  bool Has(std::string_view name) const;
  std::string GetString(std::string_view name, std::string_view fallback = "") const;
  // Parse errors name the flag.
  absl::StatusOr<int64_t> GetInt(std::string_view name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(std::string_view name, double fallback) const;

 private:
  absl::flat_hash_map<std::string, std::string> values_;
  absl::flat_hash_set<std::string> present_;
};

}  // namespace winnow::cli
