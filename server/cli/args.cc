#include "server/cli/args.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace winnow::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& value_flags,
                                 const std::vector<std::string>& bool_flags) {
  auto contains = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (contains(bool_flags, name)) {
      if (inline_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      args.present_.insert(name);
    } else if (contains(value_flags, name)) {
      if (inline_value) {
        args.values_[name] = *inline_value;
      } else if (i + 1 < argv.size()) {
        args.values_[name] = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      args.present_.insert(name);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return args;
}

bool Args::Has(std::string_view name) const { return present_.contains(std::string(name)); }

std::string Args::GetString(std::string_view name, std::string_view fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? std::string(fallback) : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(std::string_view name, int64_t fallback) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(std::string_view name, double fallback) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(name), " must be a number, got '", it->second, "'"));
  }
  return v;
}

}  // namespace winnow::cli
