#include "server/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/template/jinja.h"
#include "model/weight_quantize.h"
#include "nlohmann/json.hpp"
#include "scheduler/engine.h"
#include "server/http/http_server.h"
#include "server/inference_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/security.h"
#include "server/tracing/otlp_exporter.h"
#include "server/tracing/request_tracer.h"
#include "spdlog/spdlog.h"

namespace winnow::server {
namespace {

constexpr char kServiceName[] = "winnow.v1.Inference";

// Waits for SIGTERM/SIGINT on its own thread (the signals are blocked everywhere else), so the
// reaction is ordinary code rather than an async-signal-safe handler.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    // Must happen before any other thread starts, so that every thread inherits the mask.
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { Run(); });
  }
  ~SignalWatcher() {
    stop_ = true;
    thread_.join();
  }

  // Blocks until at least `n` signals have arrived or `timeout` passes.
  bool WaitFor(int n, absl::Duration timeout) {
    base::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return count_ >= n; };
    return mu_.AwaitWithTimeout(reached, timeout);
  }
  int count() {
    base::MutexLock lock(&mu_);
    return count_;
  }

 private:
  void Run() {
    while (!stop_) {
      timespec ts{0, 200 * 1000 * 1000};
      int sig = sigtimedwait(&set_, nullptr, &ts);
      if (sig < 0) continue;  // EAGAIN (timeout) or EINTR
      int n;
      {
        base::MutexLock lock(&mu_);
        n = ++count_;
      }
      LogEvent(spdlog::level::warn, "signal received",
               {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"},
                {"action", n == 1 ? "drain" : "cancel in-flight requests now"}});
    }
  }

  sigset_t set_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  base::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

void SetHealth(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);  // "" (the whole server)
  health->SetServingStatus(kServiceName, serving);
}

// What clients send as `model` and what labels the metrics: --served-model-name, else the GGUF's
// general.name (read from the header alone, so the metrics have it before the slow load), else
// the file's stem or the Hugging Face directory's name.
std::string ServedModelName(const ServeOptions& options) {
  if (!options.served_model_name.empty()) return options.served_model_name;
  if (auto file = model::GgufFile::Open(options.model); file.ok()) {
    absl::StatusOr<std::string> name = (*file)->GetString("general.name");
    if (name.ok() && !name->empty()) return *name;
  }
  std::filesystem::path path(options.model);
  if (!path.has_filename()) path = path.parent_path();  // "models/Qwen3-8B/"
  return std::filesystem::is_directory(path) ? path.filename().string() : path.stem().string();
}

int ClampedMillis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

// Per-connection limits of the gRPC port: message size, concurrent streams, connection age.
void SetConnectionLimits(const ServeOptions& options, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                                ClampedMillis(options.max_connection_age));
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                ClampedMillis(options.max_connection_age_grace));
  }
}

// Everything the daemon starts and owns, in start order: the members are destroyed in reverse,
// so the engine goes before the model it runs and the servers before the state they read.
// Hears the engine stop after a lost device (EngineObserver::OnFatalError) for the main
// thread, which then exits so that the supervisor restarts the process.
class DeviceFailureWatcher : public scheduler::EngineObserver {
 public:
  void OnFatalError(const absl::Status& status) override {
    base::MutexLock lock(&mu_);
    failure_ = status;
  }
  absl::Status failure() {
    base::MutexLock lock(&mu_);
    return failure_;
  }

 private:
  base::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

struct Daemon {
  explicit Daemon(const ServeOptions& options) : options(options) {}

  const ServeOptions& options;
  TlsConfig tls;
  ServingState state;
  std::string model_name;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<http::HttpServer> http_server;
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<grpc::Server> server;
  absl::Time load_start;
  std::unique_ptr<model::Model> model;
  RequestLogger request_logger;
  DeviceFailureWatcher device_failure;
  // With --otlp-endpoint: the sampled requests' spans and where they go. After `metrics`,
  // whose counters the exporter's thread increments until it stops.
  std::unique_ptr<tracing::OtlpExporter> trace_exporter;
  std::unique_ptr<tracing::RequestTracer> request_tracer;
  std::unique_ptr<FanoutObserver> observer;
  std::unique_ptr<scheduler::Engine> engine;
};

void LogStarting(const ServeOptions& options) {
  LogEvent(spdlog::level::info, "starting", {{"options", options.DebugString()}});
  for (const UnknownVariable& v : options.unknown_env) {
    LogEvent(spdlog::level::warn, "ignoring unknown environment variable",
             {{"variable", v.name}, {"closest_variable", v.closest}, {"closest_flag", v.flag}});
  }
}

// Certificates and keys are read before anything listens: a bad file stops the start.
bool LoadSecurity(Daemon* d) {
  const ServeOptions& options = d->options;
  absl::StatusOr<TlsConfig> tls = LoadTlsConfig(options);
  absl::StatusOr<ApiKeys> api_keys =
      options.api_key_file.empty() ? ApiKeys() : ApiKeys::Load(options.api_key_file);
  for (const absl::Status& st : {tls.status(), api_keys.status()}) {
    if (!st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return false;
    }
  }

  d->tls = *std::move(tls);
  d->state.options = options;
  LogEvent(spdlog::level::info, "security",
           {{"tls", d->tls.enabled() ? "on" : "off"},
            {"client_certificates", d->tls.verifies_clients() ? "required" : "off"},
            {"api_keys", absl::StrCat(api_keys->size())}});
  d->state.authenticator = Authenticator(std::move(*api_keys), d->tls.verifies_clients());
  return true;
}

// Metrics first: a probe or scrape during a slow model load should already see the daemon.
bool StartMetrics(Daemon* d) {
  const ServeOptions& options = d->options;
  d->model_name = ServedModelName(options);
  d->metrics = std::make_unique<Metrics>(/*max_request_tokens=*/32768, d->model_name,
                                         options.metrics_labels);
  d->metrics->SetServing(false);
  if (options.metrics_port >= 0) {
    if (absl::Status st = d->metrics->StartExposer(options.host, options.metrics_port); !st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return false;
    }
  }
  d->state.metrics = d->metrics.get();
  return true;
}

// service.instance.id: the host name, which in Kubernetes is the pod's name.
std::string HostName() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : "unknown";
}

// The edges read traceparent whether or not spans are exported (the request log names the
// trace); with --otlp-endpoint the sampled requests' spans go to the collector.
bool StartTracing(Daemon* d) {
  const ServeOptions& options = d->options;
  const bool exporting = !options.otlp_endpoint.empty();
  d->state.trace_sampler = tracing::TraceSampler(exporting, options.trace_sample_ratio);
  if (!exporting) return true;
  tracing::OtlpOptions otlp;
  otlp.endpoint = options.otlp_endpoint;
  otlp.headers = options.otlp_headers;
  otlp.resource = {{"service.name", options.otlp_service_name},
                   {"service.version", std::string(WINNOW_VERSION)},
                   {"service.instance.id", HostName()}};
  Metrics* metrics = d->metrics.get();
  absl::StatusOr<std::unique_ptr<tracing::OtlpExporter>> exporter = tracing::OtlpExporter::Create(
      std::move(otlp),
      {[metrics](int64_t spans) { metrics->OnSpansExported(spans); },
       [metrics](std::string_view reason, int64_t spans) {
         metrics->OnSpansDropped(reason, spans);
       }});
  if (!exporter.ok()) {
    spdlog::error("--otlp-endpoint {}", std::string(exporter.status().message()));
    return false;
  }
  d->trace_exporter = *std::move(exporter);
  d->request_tracer =
      std::make_unique<tracing::RequestTracer>(d->trace_exporter.get(), d->model_name);
  LogEvent(spdlog::level::info, "tracing",
           {{"otlp_traces_url", d->trace_exporter->url().origin + d->trace_exporter->url().path},
            {"sample_ratio", absl::StrCat(options.trace_sample_ratio)}});
  return true;
}

// The HTTP port (OpenAI API, /health, /metrics) answers 503 until the model is loaded.
scheduler::EngineOptions EngineOptionsFor(const ServeOptions& options) {
  scheduler::EngineOptions engine_options;
  engine_options.max_batched_tokens = options.max_batched_tokens;
  engine_options.max_seqs = options.max_seqs;
  engine_options.max_queue = options.max_queue;
  engine_options.block_size = options.block_size;
  engine_options.enable_prefix_caching = options.enable_prefix_caching;
  engine_options.probe_segment_tokens = options.probe_segment_tokens;
  engine_options.cuda_graphs = options.cuda_graphs;
  engine_options.kv_cache_dtype = options.kv_cache_dtype;
  engine_options.device = options.device;
  engine_options.worker.num_threads = options.threads;
  engine_options.worker.cpu_activations = options.cpu_activations;
  if (options.kv_cache_bytes > 0) engine_options.kv_cache_bytes = options.kv_cache_bytes;
  engine_options.kv_blocks = options.kv_blocks;
  // An explicit cache size (bytes or blocks) wins over sizing the cache from free GPU memory.
  if (options.device.is_cuda() && options.kv_cache_bytes == 0 && options.kv_blocks == 0) {
    engine_options.gpu_memory_utilization = options.gpu_memory_utilization;
  }
  engine_options.max_prompt_tokens = options.max_prompt_tokens;
  engine_options.max_tokens_limit = options.max_tokens_limit;
  engine_options.inject_fatal_error_at = options.inject_fatal_error_at;
  return engine_options;
}

bool StartHttp(Daemon* d) {
  const ServeOptions& options = d->options;
  if (options.http_port < 0) return true;
  http::HttpOptions http_options;
  http_options.host = options.host;
  http_options.port = options.http_port;
  http_options.max_body_bytes = static_cast<size_t>(options.max_message_bytes);
  http_options.tls = d->tls;
  // Every request the engine can hold (running or queued) gets a connection thread, plus
  // room for probes, scrapes and tokenizer calls.
  http_options.max_connections =
      static_cast<size_t>(scheduler::MaxSeqsBound(EngineOptionsFor(options))) +
      static_cast<size_t>(options.max_queue) + 64;
  d->http_server = std::make_unique<http::HttpServer>(&d->state, http_options);
  d->http_server->SetModelName(d->model_name);
  if (absl::Status st = d->http_server->Start(); !st.ok()) {
    spdlog::error("{}", std::string(st.message()));
    return false;
  }
  return true;
}

// The gRPC port reports NOT_SERVING (and requests get UNAVAILABLE) until the engine runs.
bool StartGrpc(Daemon* d) {
  const ServeOptions& options = d->options;
  d->service = std::make_unique<InferenceService>(&d->state);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(HostPort(options.host, options.port), GrpcServerCredentials(d->tls),
                           &grpc_port);
  builder.RegisterService(d->service.get());
  SetConnectionLimits(options, &builder);
  d->server = builder.BuildAndStart();
  if (d->server == nullptr || grpc_port == 0) {
    spdlog::error("cannot listen for gRPC on {}", HostPort(options.host, options.port));
    return false;
  }
  SetHealth(d->server.get(), false);
  const std::string http_address =
      d->http_server != nullptr ? HostPort(options.host, d->http_server->port()) : "off";
  const std::string metrics_address =
      options.metrics_port >= 0 ? HostPort(options.host, d->metrics->port()) : "off";
  LogEvent(spdlog::level::info, "listening",
           {{"grpc", HostPort(options.host, grpc_port)},
            {"http", http_address},
            {"metrics", metrics_address}});
  return true;
}

bool StartListeners(Daemon* d) {
  return StartMetrics(d) && StartTracing(d) && StartHttp(d) && StartGrpc(d);
}

// --cpu-weight-type is the CPU forward's: the CUDA one uploads the weights to bf16 as stored.
model::CpuWeightOptions CpuWeightsFor(const ServeOptions& options) {
  if (!options.device.is_cuda()) return {options.cpu_weight_type, options.threads};
  if (options.cpu_weight_type.has_value()) {
    spdlog::warn("--cpu-weight-type {} is ignored on {}: the GPU runs the weights as stored",
                 model::CpuWeightTypeName(options.cpu_weight_type), options.device.ToString());
  }
  return {};
}

bool LoadModel(Daemon* d) {
  const ServeOptions& options = d->options;
  d->load_start = absl::Now();
  auto loaded =
      model::Model::Load(options.model, options.chat_template, CpuWeightsFor(options));
  if (!loaded.ok()) {
    spdlog::error("cannot load model '{}': {}", options.model,
                  std::string(loaded.status().message()));
    return false;
  }
  d->model = *std::move(loaded);
  return true;
}

bool StartEngine(Daemon* d) {
  std::vector<scheduler::EngineObserver*> observers = {d->metrics.get(), &d->request_logger,
                                                       &d->device_failure};
  if (d->request_tracer != nullptr) observers.push_back(d->request_tracer.get());
  d->observer = std::make_unique<FanoutObserver>(std::move(observers));
  auto created =
      scheduler::Engine::Create(d->model.get(), EngineOptionsFor(d->options), d->observer.get());
  if (!created.ok()) {
    spdlog::error("cannot start the engine: {}", std::string(created.status().message()));
    return false;
  }
  d->engine = *std::move(created);
  return true;
}

// What renders the model's chat template ("jinja2 3.1.2 on CPython 3.11.2 at /usr"), for the
// serving log line: an operator sees which jinja2 a template's behaviour comes from.
std::string ChatTemplateRenderer(const model::Model& model) {
  if (!model.chat_template().ok()) return "none (the model has no chat template)";
  absl::StatusOr<nlohmann::json> info = model::jinja::Interpreter();
  if (!info.ok()) return std::string(info.status().message());
  return absl::StrCat("jinja2 ", (*info)["jinja2"].get<std::string>(), " on CPython ",
                      (*info)["python"].get<std::string>(), " at ",
                      (*info)["prefix"].get<std::string>());
}

// Publishes the model and engine to the request handlers, then turns health on.
void Serve(Daemon* d) {
  const scheduler::EngineLimits& limits = d->engine->limits();
  d->state.limits = LimitsFor(limits);
  d->metrics->SetCacheConfig(limits.block_size, limits.kv_blocks_total,
                             d->model->config().num_layers);
  d->state.model.store(d->model.get());
  d->state.engine.store(d->engine.get());
  d->state.phase.store(Phase::kServing);
  SetHealth(d->server.get(), true);
  d->metrics->SetServing(true);
  LogEvent(spdlog::level::info, "serving",
           {{"model", d->model->config().name},
            {"served_model_name", d->model_name},
            {"architecture", d->model->config().architecture},
            {"chat_template", ChatTemplateRenderer(*d->model)},
            {"load_ms", absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - d->load_start))},
            {"kv_blocks", absl::StrCat(limits.kv_blocks_total)},
            {"block_size", absl::StrCat(limits.block_size)},
            {"kv_cache_dtype", kernels::KvDtypeName(limits.kv_cache_dtype)},
            {"device", limits.device},
            {"max_tokens_in_pool", absl::StrCat(limits.max_tokens_in_pool)}});
}

// Returns whether the engine went idle before --drain-timeout or a second signal. Health goes
// first so that load balancers stop routing before requests are refused.
bool Drain(Daemon* d, SignalWatcher* signals) {
  d->state.phase.store(Phase::kDraining);
  SetHealth(d->server.get(), false);
  d->metrics->SetServing(false);
  d->engine->BeginDrain();
  scheduler::EngineSnapshot snap = d->engine->Snapshot();
  LogEvent(spdlog::level::info, "draining",
           {{"running", absl::StrCat(snap.running)},
            {"waiting", absl::StrCat(snap.waiting)},
            {"timeout", absl::FormatDuration(d->options.drain_timeout)}});
  const absl::Time drain_deadline = absl::Now() + d->options.drain_timeout;
  bool idle = false;
  while (!(idle = d->engine->WaitForIdle(absl::Milliseconds(100)))) {
    if (absl::Now() >= drain_deadline || signals->count() >= 2) break;
  }
  if (!idle) {
    snap = d->engine->Snapshot();
    LogEvent(spdlog::level::warn, "drain incomplete; cancelling",
             {{"running", absl::StrCat(snap.running)}, {"waiting", absl::StrCat(snap.waiting)}});
  }
  return idle;
}

void Stop(Daemon* d, bool drained) {
  // Cancels whatever is left (their streams end with CANCELLED + UNAVAILABLE) and joins the
  // engine thread.
  d->engine->Shutdown();
  // Let the final messages flush, then stop; anything still open after that is cut.
  d->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  d->server->Wait();
  if (d->http_server != nullptr) d->http_server->Stop();  // streams have their last events by now
  d->state.engine.store(nullptr);
  d->state.model.store(nullptr);
  d->engine.reset();
  d->model.reset();
  // The last requests' spans go out while the collector answers within a few seconds.
  if (d->trace_exporter != nullptr) d->trace_exporter->Shutdown(absl::Seconds(5));
  LogEvent(spdlog::level::info, "stopped", {{"drained", drained ? "true" : "false"}});
  spdlog::default_logger()->flush();
}

// The engine stopped after a lost device and every request has ended: health goes off, the
// servers stop, and the exit code tells the supervisor (Kubernetes) to restart the process.
int StopAfterDeviceFailure(Daemon* d, const absl::Status& failure) {
  d->state.phase.store(Phase::kDraining);
  SetHealth(d->server.get(), false);
  d->metrics->SetServing(false);
  LogEvent(spdlog::level::critical, "device lost; exiting for a restart",
           {{"error", std::string(failure.message())},
            {"exit_code", absl::StrCat(kExitDeviceLost)}});
  Stop(d, /*drained=*/false);
  return kExitDeviceLost;
}

// A failed start after gRPC listens: close the port at once, nothing is in flight yet.
void AbortGrpc(grpc::Server* server) {
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
}

}  // namespace

int RunDaemon(const ServeOptions& options) {
  if (absl::Status st = ConfigureLogging(options.log_format, options.log_level); !st.ok()) {
    std::fprintf(stderr, "winnow serve: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);  // a scraper hanging up must not kill the daemon
  SignalWatcher signals;
  LogStarting(options);

  Daemon daemon(options);
  if (!LoadSecurity(&daemon)) return 2;
  if (!StartListeners(&daemon)) return 1;
  // Load the model and start the engine; requests meanwhile get UNAVAILABLE.
  if (!LoadModel(&daemon) || !StartEngine(&daemon)) {
    AbortGrpc(daemon.server.get());
    return 1;
  }
  Serve(&daemon);

  // Until a signal, or until the device is lost (then nothing can run: no drain).
  while (!signals.WaitFor(1, absl::Milliseconds(200))) {
    if (absl::Status lost = daemon.device_failure.failure(); !lost.ok()) {
      return StopAfterDeviceFailure(&daemon, lost);
    }
  }
  const bool drained = Drain(&daemon, &signals);
  Stop(&daemon, drained);
  return 0;
}

}  // namespace winnow::server
