#include "base/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace winnow::base {
namespace {

// "--name=value" -> "--name".
std::string FlagName(const std::string& arg) { return arg.substr(0, arg.find('=')); }

std::vector<std::string> LongNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  }
  return names;
}

// The first leftover argument as a usage error; empty when there is none.
std::string LeftoverError(const CLI::App& app) {
  const std::vector<std::string> rest = app.remaining();
  if (rest.empty()) return "";
  const std::string& arg = rest.front();
  if (arg.rfind("--", 0) != 0) return absl::StrCat("unexpected argument '", arg, "'");
  const std::string flag = FlagName(arg);
  std::string message = absl::StrCat("unknown flag ", flag);
  const NameMatch match = ClosestName(flag, LongNames(app));
  if (IsLikelyTypo(flag, match)) absl::StrAppend(&message, " (did you mean ", match.name, "?)");
  return message;
}

// A CLI::Validator from a predicate on the parsed number; `want` completes "must be ...".
CLI::Validator NumberCheck(std::function<bool(double)> ok, std::string want) {
  return CLI::Validator(
      [ok, want](std::string& text) -> std::string {
        double v;
        if (!absl::SimpleAtod(text, &v) || std::isnan(v)) {
          return absl::StrCat("must be a number, got '", text, "'");
        }
        if (!ok(v)) return absl::StrCat("must be ", want, ", got '", text, "'");
        return "";
      },
      want);
}

}  // namespace

void ConfigureApp(CLI::App& app) {
  app.option_defaults()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->always_capture_default();
  app.allow_extras();
}

std::string ParseArgs(CLI::App& app, std::vector<std::string> args) {
  try {
    // CLI11 consumes the vector from the back.
    std::reverse(args.begin(), args.end());
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    throw;
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return LeftoverError(app);
}

std::optional<int> ParseCommandLine(CLI::App& app, std::vector<std::string> args) {
  std::string error;
  try {
    error = ParseArgs(app, std::move(args));
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (error.empty()) return std::nullopt;
  std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), error.c_str());
  return 2;
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  return ParseCommandLine(app, std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
}

CLI::Validator AtLeast(double lo) {
  return NumberCheck([lo](double v) { return v >= lo; }, absl::StrCat(">= ", lo));
}

CLI::Validator Above(double lo) {
  return NumberCheck([lo](double v) { return v > lo; }, absl::StrCat("> ", lo));
}

CLI::Validator InRange(double lo, double hi) {
  return NumberCheck([lo, hi](double v) { return v >= lo && v <= hi; },
                     absl::StrCat("in [", lo, ", ", hi, "]"));
}

CLI::Validator AboveAtMost(double lo, double hi) {
  return NumberCheck([lo, hi](double v) { return v > lo && v <= hi; },
                     absl::StrCat("in (", lo, ", ", hi, "]"));
}

size_t EditDistance(std::string_view a, std::string_view b) {
  // One row of the dynamic-programming table at a time.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

NameMatch ClosestName(std::string_view name, const std::vector<std::string>& candidates) {
  NameMatch best;
  best.distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(name, c);
    if (d < best.distance) best = {c, d};
  }
  if (best.name.empty()) best.distance = 0;
  return best;
}

bool IsLikelyTypo(std::string_view name, const NameMatch& match) {
  return !match.name.empty() && match.distance <= std::max<size_t>(2, name.size() / 3);
}

}  // namespace winnow::base
