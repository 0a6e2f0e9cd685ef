// Configuration of `winnow serve`: every setting is a flag (--max-seqs), an environment
// variable (WINNOW_MAX_SEQS) and a key of the optional YAML file (max-seqs or max_seqs).
// Precedence: flag > environment > config file > default, so that a Kubernetes manifest can set
// a base in a ConfigMap and override single values per pod.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/cpu_activations.h"
#include "scheduler/device.h"

namespace winnow::server {

// A WINNOW_* environment variable that names no setting, and the setting nearest to it by
// edit distance (WINNOW_MAX_SEQ -> WINNOW_MAX_SEQS, --max-seqs).
struct UnknownVariable {
  std::string name;
  std::string closest;  // the nearest setting's variable
  std::string flag;     // and its flag
};

struct ServeOptions {
  std::string model;  // GGUF path
  std::string chat_template;  // a Jinja file replacing the model's chat template; empty: none
  std::string host = "0.0.0.0";
  int32_t port = 50051;          // 0: pick a free port (logged)
  int32_t http_port = 8000;      // OpenAI API, /health, /metrics; 0: pick one; -1: off
  // A separate Prometheus port besides the HTTP port's /metrics. 0: pick a free port (logged).
  int32_t metrics_port = -1;      // -1: none
  std::string served_model_name;  // the `model` clients send; empty: the GGUF's general.name
  // Constant labels added to every metric series (--metrics-labels "name=value,..."): what
  // identifies this deployment whatever the scraper adds (the chart: winnow_release).
  std::map<std::string, std::string> metrics_labels;
  int32_t max_batched_tokens = 2048;
  int32_t max_seqs = 0;  // 0: auto (scheduler::EngineOptions::max_seqs)
  int32_t max_queue = 1024;
  int64_t kv_cache_bytes = 0;  // 0: --kv-blocks, or the engine's default
  int32_t kv_blocks = 0;       // wins over kv_cache_bytes when both are set
  // cuda, when neither kv_cache_bytes nor kv_blocks is set: the KV pool takes what this
  // fraction of the GPU's memory leaves after the weights and activations (vLLM's default).
  double gpu_memory_utilization = 0.9;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
  int32_t probe_segment_tokens = 2048;  // scheduler::kDefaultProbeSegment
  bool cuda_graphs = true;
  // f16 on cpu; on cuda the only choice, and the default, is bf16 (the GPU's activation type).
  kernels::KvDtype kv_cache_dtype = kernels::KvDtype::kF16;
  // Where the forward runs; unset: cuda:0 when a GPU is visible, else cpu (DefaultDevice).
  scheduler::Device device;
  int32_t threads = 0;  // 0: one per hardware thread
  model::CpuActivations cpu_activations = model::kDefaultCpuActivations;
  // cpu: the model's float weight matrices quantised at load to this type; unset: as stored.
  // Ignored on cuda, which uploads the weights to bf16 as stored.
  std::optional<kernels::GgmlType> cpu_weight_type;
  absl::Duration drain_timeout = absl::Seconds(30);
  int32_t max_prompt_tokens = 0;  // 0: the model's context length
  int32_t max_tokens_limit = 4096;
  int64_t inject_fatal_error_at = 0;  // testing: EngineOptions::inject_fatal_error_at
  int64_t max_message_bytes = 64 << 20;  // gRPC receive limit (embeddings make requests big)
  // HTTP/2 streams one gRPC connection may have open at once; more wait for one to end.
  int32_t max_concurrent_streams = 256;
  // A gRPC connection older than this is asked to go away (GOAWAY; in-flight calls may run
  // on for max_connection_age_grace), so that long-lived clients spread over new replicas.
  // Zero: no limit.
  absl::Duration max_connection_age = absl::ZeroDuration();
  absl::Duration max_connection_age_grace = absl::Minutes(5);
  // TLS and client authentication (server/security.h): PEM paths and the API key file.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string api_key_file;
  // Tracing (docs/tracing.md): the OTLP/HTTP collector URL (empty: no export), headers sent
  // with each export, the spans' service.name, and the share of requests without a
  // traceparent that start a sampled trace.
  std::string otlp_endpoint;
  std::map<std::string, std::string> otlp_headers;
  std::string otlp_service_name = "winnow";
  double trace_sample_ratio = 1.0;
  std::string log_format = "text";  // text | json
  std::string log_level = "info";   // trace | debug | info | warn | error | critical | off
  std::string config;               // YAML file the values above may come from

  // WINNOW_* variables that are no setting (typos, Kubernetes service links): ignored, and
  // logged as warnings once logging is configured.
  std::vector<UnknownVariable> unknown_env;

  // One "name=value" line per setting, for the startup log.
  std::string DebugString() const;
};

// Where each setting's value may come from; separated from the process so tests can inject.
struct OptionSources {
  std::vector<std::string> args;             // after "serve"
  std::map<std::string, std::string> env;    // WINNOW_* variables
  // Reads the --config file; absent: read from disk.
  std::string (*read_file)(const std::string& path, std::string* error) = nullptr;
};

// Collects the WINNOW_* variables of this process.
std::map<std::string, std::string> WinnowEnvironment();

// The WINNOW_* variables of `env` that are neither a setting nor one of the variables other
// tools read on purpose (WINNOW_BIN, WINNOW_TEST_MODEL, ...). A warning, not an error: a
// Kubernetes Service named winnow* injects WINNOW_<SERVICE>_PORT-style variables into pods.
std::vector<UnknownVariable> UnknownWinnowVariables(
    const std::map<std::string, std::string>& env);

// Parses and validates. Errors name the flag, variable or key and the value at fault.
absl::StatusOr<ServeOptions> ParseServeOptions(const OptionSources& sources);

// Usage text for `winnow serve --help`.
std::string ServeUsage();

// "512MiB", "2G", "1048576" -> bytes (binary units for both "G" and "GiB").
absl::StatusOr<int64_t> ParseBytes(const std::string& text);
// "30" (seconds), "30s", "500ms", "2m" -> duration.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& text);

}  // namespace winnow::server
