// Command-line parsing shared by the `winnow` subcommands, `winnow serve` and the C++
// benchmarks, on top of CLI11: one set of conventions (repeated flags, --help, exit codes,
// messages that name the flag) instead of one per program.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"

namespace winnow::base {

// Settings every winnow program shares: a repeated flag keeps its last value (scripts append
// overrides to a base command line), --help shows each option's default, and unknown arguments
// are collected rather than thrown so that ParseCommandLine can name the closest known flag.
void ConfigureApp(CLI::App& app);

// Parses the words after the program (or subcommand) name into `app`. std::nullopt: go on and
// run. Otherwise the exit status to return at once: 0 after printing --help to stdout, 2 after
// printing a usage error to stderr as "<app name>: <message>" (the message names the flag).
std::optional<int> ParseCommandLine(CLI::App& app, std::vector<std::string> args);
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv);  // argv[0] skipped

// The same parse for callers that report errors themselves: returns the usage error, "" on
// success. --help is left to the caller (CLI::CallForHelp propagates if `app` has the flag).
std::string ParseArgs(CLI::App& app, std::vector<std::string> args);

// Numeric checks for CLI::Option::check, whose failures read "--flag: must be >= 1, got '0'"
// (CLI11 2.1's own PositiveNumber and friends print DBL_MAX in full).
CLI::Validator AtLeast(double lo);             // [lo, inf)
CLI::Validator Above(double lo);               // (lo, inf)
CLI::Validator InRange(double lo, double hi);  // [lo, hi]
CLI::Validator AboveAtMost(double lo, double hi);  // (lo, hi]

// Levenshtein distance between two ASCII names.
size_t EditDistance(std::string_view a, std::string_view b);

struct NameMatch {
  std::string name;  // empty when there were no candidates
  size_t distance = 0;
};
// The candidate nearest to `name` by edit distance (the first of equals).
NameMatch ClosestName(std::string_view name, const std::vector<std::string>& candidates);
// Whether `match` is near enough to `name` to be offered as "did you mean": at most a third of
// the name's length away, and at least 2 edits are always allowed.
bool IsLikelyTypo(std::string_view name, const NameMatch& match);

}  // namespace winnow::base
