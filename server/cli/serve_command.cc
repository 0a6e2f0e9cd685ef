// `winnow serve`: the gRPC inference daemon. Flags, WINNOW_* variables and --config are merged
// by server/options.h; everything else lives in server/daemon.cc.
#include <cstdio>
#include <string>
#include <vector>

#include "server/cli/commands.h"
#include "server/daemon.h"
#include "server/options.h"

namespace winnow::cli {

int RunServe(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(server::ServeUsage().c_str(), stdout);
      return 0;
    }
  }
  server::OptionSources sources;
  sources.args = args;
  sources.env = server::WinnowEnvironment();
  auto options = server::ParseServeOptions(sources);
  if (!options.ok()) {
    std::fprintf(stderr, "winnow serve: %s\n\n%s", std::string(options.status().message()).c_str(),
                 server::ServeUsage().c_str());
    return 2;
  }
  return server::RunDaemon(*options);
}

}  // namespace winnow::cli
