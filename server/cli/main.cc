// Entry point of the `winnow` binary: dispatches to a subcommand.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "model/weight_quantize.h"
#include "server/cli/commands.h"
#include "server/logging.h"

namespace {

constexpr const char* kUsage =
    "usage: winnow <command> [flags]\n"
    "\n"
    "commands:\n"
    "  generate  --prompt TEXT [--chat] [--max-tokens N] [sampling flags]  stream a completion\n"
    "  tokenize  --text TEXT [--no-special] [--no-parse-special]         print token ids (JSON)\n"
    "  score     --tokens-file F                                         logits/logprobs (JSON)\n"
    "  inspect   [--tensors] [--dump-tensor NAME]                         GGUF metadata/tensors\n"
    "  serve     [--port 50051] [--metrics-port 9090] ... (serve --help)  gRPC inference daemon\n"
    "\n"
    "every command takes --model PATH (default: $WINNOW_MODEL or\n"
    "models/SmolLM2-135M-Instruct.Q4_1.gguf), --threads N, --cpu-activations q8|f32,\n"
    "--cpu-weight-type none|q8_0|q4_0|q4_1|q5_0|q5_1 and --help.\n";

}  // namespace

namespace winnow::cli {
namespace {

// Adds `name`, whose value `parse` turns into *out; other values are a usage error that says
// `error`. `choices` is what --help shows as the value's type.
template <typename T>
void AddChoiceFlag(CLI::App& app, const std::string& name, T* out,
                   absl::StatusOr<T> (*parse)(std::string_view), const std::string& choices,
                   const std::string& error, const std::string& help) {
  const CLI::Validator known(
      [parse, error](std::string& v) -> std::string { return parse(v).ok() ? "" : error; },
      choices);
  app.add_option_function<std::string>(
         name, [out, parse](const std::string& v) { *out = *parse(v); }, help)
      ->check(known);
}

}  // namespace

std::string DefaultModelPath() {
  if (const char* env = std::getenv("WINNOW_MODEL"); env != nullptr && *env != '\0') return env;
  return "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void AddCommonFlags(CLI::App& app, CommonFlags* flags) {
  base::ConfigureApp(app);
  app.add_option("--model", flags->model,
                 "a GGUF file or a Hugging Face directory ($WINNOW_MODEL, else the default)");
  app.add_option("--chat-template", flags->chat_template,
                 "a Jinja chat template file used instead of the model's own");
  app.add_option("--threads", flags->threads, "CPU threads; 0: one per hardware thread")
      ->check(base::AtLeast(0));
  AddChoiceFlag<model::CpuActivations>(
      app, "--cpu-activations", &flags->activations, model::ParseCpuActivations, "{f32,q8}",
      "must be f32 or q8",
      absl::StrCat("activations of the CPU matmuls: q8 (8-bit, integer dot products) or f32 (",
                   std::string(model::CpuActivationsName(model::kDefaultCpuActivations)), ")"));
  AddChoiceFlag<std::optional<kernels::GgmlType>>(
      app, "--cpu-weight-type", &flags->cpu_weight_type, model::ParseCpuWeightType,
      "{none,q8_0,q4_0,q4_1,q5_0,q5_1}",
      absl::StrCat("must be one of ", model::CpuWeightTypeNames()),
      "CPU forward: quantise the model's float weight matrices at load (a Hugging Face "
      "directory's; a GGUF's float tensors, its quantised ones stay) to this ggml type, or "
      "none: run them as stored (none). Ignored by generate --device cuda");
}

void AddKvCacheDtypeFlag(CLI::App& app, kernels::KvDtype* dtype) {
  *dtype = kernels::KvDtype::kF16;
  AddChoiceFlag<kernels::KvDtype>(app, "--kv-cache-dtype", dtype, kernels::ParseKvDtype,
                                  "{f32,f16,bf16,q8_0}", "must be one of f32, f16, bf16, q8_0",
                                  "how the KV cache stores K/V (f16)");
}

}  // namespace winnow::cli

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  // Library logs (the engine's start-up line, tokenizer warnings) go to stderr, warnings only:
  // stdout carries the commands' output. `serve` sets up its own logging.
  (void)winnow::server::ConfigureLogging("text", "warn");
  std::string_view command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return winnow::cli::RunGenerate(args);
  if (command == "tokenize") return winnow::cli::RunTokenize(args);
  if (command == "score") return winnow::cli::RunScore(args);
  if (command == "inspect") return winnow::cli::RunInspect(args);
  if (command == "serve") return winnow::cli::RunServe(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "winnow: unknown command '%s'\n\n%s", argv[1], kUsage);
  return 2;
}
