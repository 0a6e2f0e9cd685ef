// Subcommands of the `winnow` binary. Each takes the arguments after its name and returns the
// process exit code; errors are printed to stderr.
#pragma once

#include <string>
#include <vector>

namespace winnow::cli {

// Default model path: $WINNOW_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string DefaultModelPath();

int RunGenerate(const std::vector<std::string>& args);
int RunTokenize(const std::vector<std::string>& args);
int RunScore(const std::vector<std::string>& args);
int RunInspect(const std::vector<std::string>& args);
int RunServe(const std::vector<std::string>& args);

}  // namespace winnow::cli
