// Subcommands of the `winnow` binary. Each takes the arguments after its name and returns the
// process exit code: 0, 1 when the command failed, 2 for a usage error (unknown flag, bad
// value); errors are printed to stderr.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cpu/kv_dtype.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::cli {

// Default model path: $WINNOW_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string DefaultModelPath();

// Flags every command takes.
struct CommonFlags {
  std::string model = DefaultModelPath();
  std::string chat_template;  // replaces the model's chat template when set
  int32_t threads = 0;  // 0: one per hardware thread
  model::CpuActivations activations = model::kDefaultCpuActivations;
  std::optional<kernels::GgmlType> cpu_weight_type;  // --cpu-weight-type; unset: none

  scheduler::WorkerOptions Worker() const { return {threads, activations}; }
  // What Model::Load quantises for the CPU forward; commands on the CUDA forward pass {}.
  model::CpuWeightOptions CpuWeights() const { return {cpu_weight_type, threads}; }
};
// Sets up `app` with base::ConfigureApp and adds --model, --threads, --cpu-activations and
// --cpu-weight-type.
void AddCommonFlags(CLI::App& app, CommonFlags* flags);

// --kv-cache-dtype f32|f16|bf16|q8_0 (default f16, as the daemon's), stored in *dtype.
void AddKvCacheDtypeFlag(CLI::App& app, kernels::KvDtype* dtype);

int RunGenerate(const std::vector<std::string>& args);
int RunTokenize(const std::vector<std::string>& args);
int RunScore(const std::vector<std::string>& args);
int RunInspect(const std::vector<std::string>& args);
int RunServe(const std::vector<std::string>& args);

}  // namespace winnow::cli
