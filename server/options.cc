#include "server/options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/cli.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "model/weight_quantize.h"
#include "server/tracing/otlp_exporter.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace winnow::server {
namespace {

// Where a value came from, for error messages that tell the operator what to fix.
std::string Origin(const std::string& layer, const std::string& name) {
  if (layer == "flag") return absl::StrCat("--", name);
  if (layer == "env") {
    return absl::StrCat("WINNOW_", absl::AsciiStrToUpper(absl::StrReplaceAll(name, {{"-", "_"}})));
  }
  return absl::StrCat("config key '", name, "'");
}

absl::StatusOr<int64_t> ParseInt(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("must be an integer, got '", text, "'"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  return v;
}

// One setting, in every layer. Values arrive as text from all three (a flag, a variable, a YAML
// scalar) and go through the same `apply`, so they are checked alike and errors can name the
// layer they came from.
struct Setting {
  std::string name;
  std::string help;
  std::function<absl::Status(const std::string&, ServeOptions*)> apply;
  std::string type = "TEXT";  // for --help
};

template <typename T>
Setting IntSetting(std::string name, std::string help, T ServeOptions::*field, int64_t lo,
                   int64_t hi) {
  return Setting{std::move(name), std::move(help),
                 [field, lo, hi](const std::string& v, ServeOptions* o) -> absl::Status {
                   WINNOW_ASSIGN_OR_RETURN(int64_t n, ParseInt(v, lo, hi));
                   o->*field = static_cast<T>(n);
                   return absl::OkStatus();
                 },
                 "INT"};
}

Setting StringSetting(std::string name, std::string help, std::string ServeOptions::*field,
                      std::vector<std::string> allowed = {}) {
  std::string type = allowed.empty() ? "TEXT" : absl::StrCat("{", absl::StrJoin(allowed, ","), "}");
  return Setting{std::move(name), std::move(help),
                 [field, allowed](const std::string& v, ServeOptions* o) -> absl::Status {
                   if (!allowed.empty() &&
                       std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
                     return absl::InvalidArgumentError(absl::StrCat(
                         "must be one of ", absl::StrJoin(allowed, ", "), "; got '", v, "'"));
                   }
                   o->*field = v;
                   return absl::OkStatus();
                 },
                 std::move(type)};
}

// "name=value[,name=value...]": Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*, not "__..." and
// not model_name, which the daemon sets), values without commas.
Setting LabelsSetting(std::string name, std::string help,
                      std::map<std::string, std::string> ServeOptions::*field) {
  return Setting{std::move(name), std::move(help),
                 [field](const std::string& v, ServeOptions* o) -> absl::Status {
                   std::map<std::string, std::string> labels;
                   for (absl::string_view pair : absl::StrSplit(v, ',', absl::SkipEmpty())) {
                     const size_t eq = pair.find('=');
                     const std::string key(absl::StripAsciiWhitespace(pair.substr(0, eq)));
                     const bool valid_name =
                         !key.empty() && !absl::ascii_isdigit(key[0]) &&
                         std::all_of(key.begin(), key.end(), [](char c) {
                           return absl::ascii_isalnum(c) || c == '_';
                         }) &&
                         !absl::StartsWith(key, "__") && key != "model_name";
                     if (eq == absl::string_view::npos || !valid_name) {
                       return absl::InvalidArgumentError(absl::StrCat(
                           "expected name=value pairs with Prometheus label names (not "
                           "model_name or __*), got '", std::string(pair), "'"));
                     }
                     labels[key] = std::string(pair.substr(eq + 1));
                   }
                   o->*field = std::move(labels);
                   return absl::OkStatus();
                 },
                 "NAME=VALUE,..."};
}

// "name=value,name=value" -> HTTP headers (OTEL_EXPORTER_OTLP_HEADERS' form, without its
// percent-encoding): names are HTTP tokens, values run to the next comma.
absl::StatusOr<std::map<std::string, std::string>> ParseHeaderList(const std::string& v) {
  std::map<std::string, std::string> headers;
  for (absl::string_view pair : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    const size_t eq = pair.find('=');
    const std::string name(absl::StripAsciiWhitespace(pair.substr(0, eq)));
    const bool token = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return absl::ascii_isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(c) !=
                                           std::string_view::npos;
    });
    if (eq == absl::string_view::npos || !token) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected name=value pairs with HTTP header names, got '", std::string(pair), "'"));
    }
    headers[name] = std::string(absl::StripAsciiWhitespace(pair.substr(eq + 1)));
  }
  return headers;
}

// true/false (also 1/0, yes/no, on/off), so that a variable or YAML key can say either.
Setting BoolSetting(std::string name, std::string help, bool ServeOptions::*field) {
  return Setting{std::move(name), std::move(help),
                 [field](const std::string& v, ServeOptions* o) -> absl::Status {
                   const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(v));
                   if (t == "true" || t == "1" || t == "yes" || t == "on") {
                     o->*field = true;
                   } else if (t == "false" || t == "0" || t == "no" || t == "off") {
                     o->*field = false;
                   } else {
                     return absl::InvalidArgumentError(
                         absl::StrCat("must be true or false, got '", v, "'"));
                   }
                   return absl::OkStatus();
                 },
                 "BOOL"};
}

Setting DurationSetting(std::string name, std::string help, absl::Duration ServeOptions::*field) {
  return Setting{std::move(name), std::move(help),
                 [field](const std::string& v, ServeOptions* o) -> absl::Status {
                   WINNOW_ASSIGN_OR_RETURN(o->*field, ParseDurationFlag(v));
                   return absl::OkStatus();
                 },
                 "DURATION"};
}

const std::vector<Setting>& Settings() {
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  static const auto* settings = new std::vector<Setting>{
      StringSetting("model",
                    "a GGUF file or a Hugging Face model directory (default: "
                    "models/SmolLM2-135M-Instruct.Q4_1.gguf)",
                    &ServeOptions::model),
      StringSetting("chat-template",
                    "a Jinja chat template file used instead of the model's own (none)",
                    &ServeOptions::chat_template),
      StringSetting("host", "address to bind gRPC, HTTP and metrics to (default 0.0.0.0)",
                    &ServeOptions::host),
      IntSetting("port", "gRPC port; 0 picks a free one (default 50051)", &ServeOptions::port, 0,
                 65535),
      IntSetting("http-port",
                 "HTTP port: OpenAI API, /health, /metrics; 0 picks one, -1 disables (8000)",
                 &ServeOptions::http_port, -1, 65535),
      IntSetting("metrics-port",
                 "a separate Prometheus /metrics port; 0 picks one, -1: none (-1; /metrics is "
                 "on the HTTP port)",
                 &ServeOptions::metrics_port, -1, 65535),
      StringSetting("served-model-name",
                    "model name for the OpenAI API (default: the GGUF's general.name)",
                    &ServeOptions::served_model_name),
      LabelsSetting("metrics-labels",
                    "constant labels on every metric series, name=value[,name=value] (none)",
                    &ServeOptions::metrics_labels),
      IntSetting("max-batched-tokens", "tokens per engine iteration (2048)",
                 &ServeOptions::max_batched_tokens, 1, kI32),
      Setting{"max-seqs",
              "sequences holding KV at once, or auto: what the KV pool holds at one block per "
              "layer each, up to max-batched-tokens and 1024 (auto)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                if (v == "auto") {
                  o->max_seqs = 0;
                  return absl::OkStatus();
                }
                if (!ParseInt(v, 1, kI32).ok()) {
                  return absl::InvalidArgumentError(absl::StrCat(
                      "must be auto or an integer in [1, ", kI32, "], got '", v, "'"));
                }
                o->max_seqs = static_cast<int32_t>(*ParseInt(v, 1, kI32));
                return absl::OkStatus();
              },
              "INT|auto"},
      IntSetting("max-queue", "requests waiting before new ones get RESOURCE_EXHAUSTED (1024)",
                 &ServeOptions::max_queue, 0, kI32),
      Setting{"kv-cache-bytes", "KV pool size, e.g. 512MiB (default: engine's choice)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(o->kv_cache_bytes, ParseBytes(v));
                return absl::OkStatus();
              },
              "BYTES"},
      IntSetting("kv-blocks", "KV pool size in blocks; wins over --kv-cache-bytes",
                 &ServeOptions::kv_blocks, 0, kI32),
      Setting{"gpu-memory-utilization",
              "cuda: size the KV pool to use this fraction of the GPU's memory in all (0.9); "
              "--kv-cache-bytes or --kv-blocks win over it",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                double fraction = 0;
                if (!absl::SimpleAtod(v, &fraction) || !(fraction > 0.0 && fraction <= 1.0)) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("must be a number in (0, 1], got '", v, "'"));
                }
                o->gpu_memory_utilization = fraction;
                return absl::OkStatus();
              },
              "FLOAT"},
      BoolSetting("enable-prefix-caching",
                  "reuse the KV of equal prompt prefixes across requests (true)",
                  &ServeOptions::enable_prefix_caching),
      IntSetting("probe-segment-tokens",
                 "the repeat probe's segment length (compression.probe \"repeat\"): longer "
                 "scores a context better and holds more KV while it runs (2048)",
                 &ServeOptions::probe_segment_tokens, 64, kI32),
      BoolSetting("cuda-graphs",
                  "cuda: replay decode-only iterations from CUDA graphs (true)",
                  &ServeOptions::cuda_graphs),
      IntSetting("block-size", "token slots per KV block (16)", &ServeOptions::block_size, 1,
                 1024),
      Setting{"kv-cache-dtype",
              "how the KV cache stores K/V: f32, f16, bf16 or q8_0 (f16); f16/bf16 hold 2x "
              "and q8_0 ~3.8x the tokens of f32 in the same bytes",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                absl::StatusOr<kernels::KvDtype> dtype = kernels::ParseKvDtype(v);
                if (!dtype.ok()) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("must be one of f32, f16, bf16, q8_0; got '", v, "'"));
                }
                o->kv_cache_dtype = *dtype;
                return absl::OkStatus();
              },
              "{f32,f16,bf16,q8_0}"},
      Setting{"device",
              "where the forward runs: cpu, cuda or cuda:N (cuda:0 when a GPU is visible, else "
              "cpu)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(o->device, scheduler::ParseDevice(v));
                return absl::OkStatus();
              },
              "{cpu,cuda,cuda:N}"},
      IntSetting("threads", "CPU threads for the forward; 0: all cores", &ServeOptions::threads, 0,
                 4096),
      Setting{"cpu-activations",
              "activations of the CPU forward's matmuls: q8 (8 bits, integer dot products, "
              "about 2x the prefill rate) or f32 (exact products) (" +
                  std::string(model::CpuActivationsName(model::kDefaultCpuActivations)) + ")",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(o->cpu_activations, model::ParseCpuActivations(v));
                return absl::OkStatus();
              },
              "{f32,q8}"},
      Setting{"cpu-weight-type",
              "cpu: quantise the model's float weight matrices at load (a Hugging Face "
              "directory's; a GGUF's float tensors, its quantised ones stay) to q8_0, q4_0, "
              "q4_1, q5_0 or q5_1, or none: run them as stored (none); ignored on cuda",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(o->cpu_weight_type, model::ParseCpuWeightType(v));
                return absl::OkStatus();
              },
              "{none,q8_0,q4_0,q4_1,q5_0,q5_1}"},
      DurationSetting("drain-timeout",
                      "on SIGTERM, how long in-flight requests may finish, e.g. 30s (30s)",
                      &ServeOptions::drain_timeout),
      IntSetting("max-prompt-tokens", "longest accepted prompt; 0: the context length",
                 &ServeOptions::max_prompt_tokens, 0, kI32),
      IntSetting("max-tokens-limit", "largest accepted max_tokens (4096)",
                 &ServeOptions::max_tokens_limit, 1, kI32),
      IntSetting("inject-fatal-error-at",
                 "testing a supervisor's restart: the forward of this engine iteration reports "
                 "a lost device, and the daemon exits 3; 0: never (0)",
                 &ServeOptions::inject_fatal_error_at, 0, std::numeric_limits<int64_t>::max()),
      Setting{"max-message-bytes", "largest accepted gRPC request, e.g. 64MiB (64MiB)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(int64_t bytes, ParseBytes(v));
                if (bytes < 1024 || bytes > std::numeric_limits<int32_t>::max()) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("must be in [1KiB, 2GiB), got ", bytes));
                }
                o->max_message_bytes = bytes;
                return absl::OkStatus();
              },
              "BYTES"},
      IntSetting("max-concurrent-streams",
                 "gRPC calls one connection may have open at once; more wait (256)",
                 &ServeOptions::max_concurrent_streams, 1, kI32),
      DurationSetting("max-connection-age",
                      "close gRPC connections older than this (GOAWAY) so clients rebalance "
                      "across replicas, e.g. 30m; 0: never (0)",
                      &ServeOptions::max_connection_age),
      DurationSetting("max-connection-age-grace",
                      "how long calls on a connection past --max-connection-age may still run "
                      "(5m)",
                      &ServeOptions::max_connection_age_grace),
      StringSetting("tls-cert", "PEM certificate chain: serve TLS on the gRPC and HTTP ports",
                    &ServeOptions::tls_cert),
      StringSetting("tls-key", "PEM private key of --tls-cert", &ServeOptions::tls_key),
      StringSetting("tls-client-ca",
                    "PEM CA bundle: mutual TLS, requests need a client certificate it signed "
                    "(health and metrics stay open)",
                    &ServeOptions::tls_client_ca),
      StringSetting("api-key-file",
                    "file of API keys, one per line: requests need 'authorization: Bearer "
                    "<key>' (health and metrics stay open)",
                    &ServeOptions::api_key_file),
      Setting{"otlp-endpoint",
              "export request traces over OTLP/HTTP (JSON) to this collector URL, e.g. "
              "http://otel-collector:4318 (spans go to /v1/traces under it); empty: off",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                if (!v.empty()) WINNOW_RETURN_IF_ERROR(tracing::ParseOtlpEndpoint(v).status());
                o->otlp_endpoint = v;
                return absl::OkStatus();
              },
              "URL"},
      Setting{"otlp-headers",
              "headers sent with every trace export, name=value[,name=value] (none)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                WINNOW_ASSIGN_OR_RETURN(o->otlp_headers, ParseHeaderList(v));
                return absl::OkStatus();
              },
              "NAME=VALUE,..."},
      StringSetting("otlp-service-name", "service.name of the exported spans (winnow)",
                    &ServeOptions::otlp_service_name),
      Setting{"trace-sample-ratio",
              "share of requests without a traceparent that start a sampled trace; a "
              "traceparent's own sampled flag always decides (1)",
              [](const std::string& v, ServeOptions* o) -> absl::Status {
                double ratio = 0;
                if (!absl::SimpleAtod(v, &ratio) || !(ratio >= 0.0 && ratio <= 1.0)) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("must be a number in [0, 1], got '", v, "'"));
                }
                o->trace_sample_ratio = ratio;
                return absl::OkStatus();
              },
              "FLOAT"},
      StringSetting("log-format", "text or json (text)", &ServeOptions::log_format,
                    {"text", "json"}),
      StringSetting("log-level", "trace, debug, info, warn, error, critical or off (info)",
                    &ServeOptions::log_level,
                    {"trace", "debug", "info", "warn", "error", "critical", "off"}),
      StringSetting("config", "YAML file with any of these settings as keys",
                    &ServeOptions::config),
  };
  return *settings;
}

const Setting* FindSetting(const std::string& name) {
  for (const Setting& s : Settings()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string ReadFileFromDisk(const std::string& path, std::string* error) {
  std::optional<std::string> bytes = base::ReadWholeFile(path);
  if (!bytes) *error = "cannot be read";
  return bytes.value_or("");
}

// name -> value, in the order they were given.
using Layer = std::vector<std::pair<std::string, std::string>>;

// The flag layer's parser: one string option per setting, so that CLI11 does the command-line
// syntax (--name value, --name=value, missing values, unknown flags) and Setting::apply the
// values, as for the other layers. (CLI11's own environment and config-file support does not
// fit: in CLI11 2.1 a config file beats the environment, its validation errors name the flag
// even for a value from a variable, and it reads no YAML.)
void AddSettingFlags(CLI::App& app, std::vector<std::string>* values) {
  base::ConfigureApp(app);
  const std::vector<Setting>& settings = Settings();
  values->assign(settings.size(), "");
  for (size_t i = 0; i < settings.size(); ++i) {
    // No captured default: it would be "" (the value is text); each help line states it.
    app.add_option("--" + settings[i].name, (*values)[i], settings[i].help)
        ->type_name(settings[i].type);
  }
}

absl::StatusOr<Layer> ParseFlags(const std::vector<std::string>& args) {
  CLI::App app("", "winnow serve");
  app.set_help_flag();  // RunServe answers --help before parsing
  std::vector<std::string> values;
  AddSettingFlags(app, &values);
  const std::string error = base::ParseArgs(app, args);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  Layer layer;
  for (size_t i = 0; i < Settings().size(); ++i) {
    const std::string& name = Settings()[i].name;
    if (app.count("--" + name) > 0) layer.emplace_back(name, values[i]);
  }
  return layer;
}

// WINNOW_* variables that are not settings but are read on purpose elsewhere: by the test
// harnesses (WINNOW_BIN, WINNOW_TEST_MODEL, WINNOW_QUALITY_BENCH), the model fetch script
// (WINNOW_MODEL_DIR) and the Python client (WINNOW_TARGET, WINNOW_API_KEY, WINNOW_PROTO_ROOT,
// WINNOW_STUBS_DIR). They must not warn.
constexpr const char* kOtherVariables[] = {
    "WINNOW_BIN",    "WINNOW_TEST_MODEL", "WINNOW_QUALITY_BENCH", "WINNOW_MODEL_DIR",
    "WINNOW_TARGET", "WINNOW_API_KEY",    "WINNOW_PROTO_ROOT",    "WINNOW_STUBS_DIR",
};

Layer EnvLayer(const std::map<std::string, std::string>& env) {
  Layer layer;
  for (const Setting& s : Settings()) {
    auto it = env.find(Origin("env", s.name));
    if (it != env.end()) layer.emplace_back(s.name, it->second);
  }
  return layer;
}

absl::StatusOr<Layer> ConfigLayer(const std::string& path, const OptionSources& sources) {
  std::string error;
  std::string text = sources.read_file != nullptr ? sources.read_file(path, &error)
                                                  : ReadFileFromDisk(path, &error);
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("config file '", path, "' ", error));
  }
  Layer layer;
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return layer;  // an empty file is a valid, empty config
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path, "' must be a mapping of setting: value"));
    }
    for (const auto& kv : root) {
      // Accept both spellings: YAML users tend to write snake_case.
      std::string key = absl::StrReplaceAll(kv.first.as<std::string>(), {{"_", "-"}});
      if (FindSetting(key) == nullptr || key == "config") {
        return absl::InvalidArgumentError(
            absl::StrCat("config file '", path, "': unknown key '", kv.first.as<std::string>(),
                         "'"));
      }
      if (!kv.second.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config file '", path, "': key '", key, "' must be a scalar"));
      }
      layer.emplace_back(key, kv.second.Scalar());
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' is not valid YAML: ", e.what()));
  }
  return layer;
}

// The origin of `name`'s value in the highest layer that sets it ("" when none does).
std::string OriginOf(const std::string& name, const Layer& config, const Layer& env,
                     const Layer& flags) {
  std::string origin;
  for (const auto& [layer, label] : {std::pair<const Layer*, const char*>{&config, "config"},
                                     {&env, "env"},
                                     {&flags, "flag"}}) {
    for (const auto& entry : *layer) {
      if (entry.first == name) origin = Origin(label, name);
    }
  }
  return origin;
}

// The device when none was given, and the KV dtype that goes with it (KvDtypeFor).
absl::Status ResolveDevice(const Layer& config, const Layer& env, const Layer& flags,
                           ServeOptions* options) {
  const std::string device_origin = OriginOf("device", config, env, flags);
  if (device_origin.empty()) options->device = scheduler::DefaultDevice();
  if (absl::Status built = scheduler::CheckBuiltFor(options->device); !built.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(device_origin, " ", built.message()));
  }
  const std::string dtype_origin = OriginOf("kv-cache-dtype", config, env, flags);
  absl::StatusOr<kernels::KvDtype> dtype = scheduler::KvDtypeFor(
      options->device, dtype_origin.empty() ? std::nullopt
                                            : std::optional(options->kv_cache_dtype));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dtype_origin, " ", dtype.status().message()));
  }
  options->kv_cache_dtype = *dtype;
  return absl::OkStatus();
}

absl::Status ApplyLayer(const Layer& layer, const std::string& origin, ServeOptions* options) {
  for (const auto& [name, value] : layer) {
    absl::Status st = FindSetting(name)->apply(value, options);
    if (!st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Origin(origin, name), " ", st.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, std::string> WinnowEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    if (entry.rfind("WINNOW_", 0) != 0) continue;
    auto eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) ||
                               s[digits] == '.')) {
    ++digits;
  }
  double number;
  if (digits == 0 || !absl::SimpleAtod(s.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a byte count such as 1073741824, 512MiB or 2G; got '", text, "'"));
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(digits)));
  double scale;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("has unknown unit '", unit, "' (use B, KiB, MiB, GiB or TiB)"));
  }
  double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat("is too large: '", text, "'"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& text) {
  std::string s(absl::StripAsciiWhitespace(text));
  double seconds;
  absl::Duration d;
  if (absl::SimpleAtod(s, &seconds) && std::isfinite(seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(s, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a duration such as 30, 30s, 500ms or 2m; got '", text, "'"));
  }
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("must be finite and >= 0; got '", text, "'"));
  }
  return d;
}

absl::StatusOr<ServeOptions> ParseServeOptions(const OptionSources& sources) {
  WINNOW_ASSIGN_OR_RETURN(const Layer flags, ParseFlags(sources.args));
  const Layer env = EnvLayer(sources.env);

  // The config file's own path follows the same precedence (flag > env).
  std::string config_path;
  for (const Layer* layer : {&env, &flags}) {
    for (const auto& [name, value] : *layer) {
      if (name == "config") config_path = value;
    }
  }

  ServeOptions options;
  Layer config;
  if (!config_path.empty()) {
    WINNOW_ASSIGN_OR_RETURN(config, ConfigLayer(config_path, sources));
    WINNOW_RETURN_IF_ERROR(ApplyLayer(config, "config", &options));
  }
  WINNOW_RETURN_IF_ERROR(ApplyLayer(env, "env", &options));
  WINNOW_RETURN_IF_ERROR(ApplyLayer(flags, "flag", &options));
  WINNOW_RETURN_IF_ERROR(ResolveDevice(config, env, flags, &options));
  options.config = config_path;
  options.unknown_env = UnknownWinnowVariables(sources.env);
  if (options.model.empty()) options.model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (options.host.empty()) return absl::InvalidArgumentError("--host must not be empty");
  return options;
}

std::vector<UnknownVariable> UnknownWinnowVariables(
    const std::map<std::string, std::string>& env) {
  std::vector<std::string> known;  // WINNOW_<NAME>, parallel to Settings()
  for (const Setting& s : Settings()) known.push_back(Origin("env", s.name));
  std::vector<UnknownVariable> unknown;
  for (const auto& [name, value] : env) {
    if (name.rfind("WINNOW_", 0) != 0) continue;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (std::find(std::begin(kOtherVariables), std::end(kOtherVariables), name) !=
        std::end(kOtherVariables)) {
      continue;
    }
    const base::NameMatch closest = base::ClosestName(name, known);
    const size_t setting = std::find(known.begin(), known.end(), closest.name) - known.begin();
    unknown.push_back({name, closest.name, "--" + Settings()[setting].name});
  }
  return unknown;
}

std::string ServeUsage() {
  CLI::App app(
      "The gRPC inference daemon. Every flag is also an environment variable (--max-seqs ->\n"
      "WINNOW_MAX_SEQS) and a key of the --config YAML file (max-seqs: 64).\n"
      "Precedence: flag > environment > config > default.",
      "winnow serve");
  std::vector<std::string> values;
  AddSettingFlags(app, &values);
  return app.help();
}

std::string ServeOptions::DebugString() const {
  return absl::StrCat(
      "model=", model, " chat_template=", chat_template, " host=", host, " port=", port, " http_port=", http_port,
      " metrics_port=", metrics_port, " served_model_name=", served_model_name,
      " metrics_labels=", absl::StrJoin(metrics_labels, ",", absl::PairFormatter("=")),
      " max_batched_tokens=", max_batched_tokens,
      " max_seqs=", max_seqs > 0 ? absl::StrCat(max_seqs) : "auto",
      " max_queue=", max_queue, " kv_cache_bytes=", kv_cache_bytes, " kv_blocks=", kv_blocks,
      " gpu_memory_utilization=", gpu_memory_utilization,
      " block_size=", block_size, " enable_prefix_caching=", enable_prefix_caching,
      " probe_segment_tokens=", probe_segment_tokens,
      " cuda_graphs=", cuda_graphs,
      " kv_cache_dtype=", kernels::KvDtypeName(kv_cache_dtype), " device=", device.ToString(),
      " threads=", threads, " cpu_activations=", std::string(model::CpuActivationsName(cpu_activations)),
      " cpu_weight_type=", model::CpuWeightTypeName(cpu_weight_type),
      " drain_timeout=", absl::FormatDuration(drain_timeout),
      " max_prompt_tokens=", max_prompt_tokens, " max_tokens_limit=", max_tokens_limit,
      " inject_fatal_error_at=", inject_fatal_error_at,
      " max_message_bytes=", max_message_bytes,
      " max_concurrent_streams=", max_concurrent_streams,
      " max_connection_age=", absl::FormatDuration(max_connection_age),
      " max_connection_age_grace=", absl::FormatDuration(max_connection_age_grace),
      " tls_cert=", tls_cert, " tls_key=", tls_key, " tls_client_ca=", tls_client_ca,
      " api_key_file=", api_key_file, " otlp_endpoint=", otlp_endpoint,
      // Header values are often credentials: names only.
      " otlp_headers=",
      absl::StrJoin(otlp_headers, ",",
                    [](std::string* out, const auto& h) { absl::StrAppend(out, h.first); }),
      " otlp_service_name=", otlp_service_name, " trace_sample_ratio=", trace_sample_ratio,
      " log_format=", log_format,
      " log_level=", log_level, " config=", config);
}

}  // namespace winnow::server
