// The YAML config layer of `winnow serve` (server/options.cc): the input is the --config file's
// contents, injected through OptionSources::read_file, then parsed, applied under the
// environment and flag layers, and validated as a whole.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/options.h"

namespace {

const std::string* config_text = nullptr;

std::string ReadConfig(const std::string&, std::string*) { return *config_text; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  config_text = &text;
  winnow::server::OptionSources sources;
  sources.args = {"--config", "fuzz.yaml"};  // the model, too, comes from the file
  sources.read_file = &ReadConfig;
  auto options = winnow::server::ParseServeOptions(sources);
  if (options.ok()) (void)options->DebugString();
  config_text = nullptr;
  return 0;
}
