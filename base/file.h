// Whole-file reads for the small text inputs the daemon and CLI take (config, keys,
// certificates, token lists), so each caller does not open-code the stream dance.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace winnow::base {

// The bytes of the file at `path`, or nullopt when it cannot be opened.
inline std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace winnow::base
