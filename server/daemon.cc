#include "server/daemon.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "model/gguf.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "server/http/http_server.h"
#include "server/inference_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/security.h"
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
// the file name.
std::string ServedModelName(const ServeOptions& options) {
  if (!options.served_model_name.empty()) return options.served_model_name;
  if (auto file = model::GgufFile::Open(options.model); file.ok()) {
    absl::StatusOr<std::string> name = (*file)->GetString("general.name");
    if (name.ok() && !name->empty()) return *name;
  }
  return std::filesystem::path(options.model).stem().string();
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

}  // namespace

int RunDaemon(const ServeOptions& options) {
  if (absl::Status st = ConfigureLogging(options.log_format, options.log_level); !st.ok()) {
    std::fprintf(stderr, "winnow serve: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);  // a scraper hanging up must not kill the daemon
  SignalWatcher signals;
  LogEvent(spdlog::level::info, "starting", {{"options", options.DebugString()}});
  for (const UnknownVariable& v : options.unknown_env) {
    LogEvent(spdlog::level::warn, "ignoring unknown environment variable",
             {{"variable", v.name}, {"closest_variable", v.closest}, {"closest_flag", v.flag}});
  }

  // Certificates and keys are read before anything listens: a bad file stops the start.
  absl::StatusOr<TlsConfig> tls = LoadTlsConfig(options);
  absl::StatusOr<ApiKeys> api_keys =
      options.api_key_file.empty() ? ApiKeys() : ApiKeys::Load(options.api_key_file);
  for (const absl::Status& st : {tls.status(), api_keys.status()}) {
    if (!st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return 2;
    }
  }

  ServingState state;
  state.options = options;
  LogEvent(spdlog::level::info, "security",
           {{"tls", tls->enabled() ? "on" : "off"},
            {"client_certificates", tls->verifies_clients() ? "required" : "off"},
            {"api_keys", absl::StrCat(api_keys->size())}});
  state.authenticator = Authenticator(std::move(*api_keys), tls->verifies_clients());

  // Metrics first: a probe or scrape during a slow model load should already see the daemon.
  const std::string model_name = ServedModelName(options);
  auto metrics = std::make_unique<Metrics>(/*max_request_tokens=*/32768, model_name);
  metrics->SetServing(false);
  if (options.metrics_port >= 0) {
    if (absl::Status st = metrics->StartExposer(options.host, options.metrics_port); !st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return 1;
    }
  }
  state.metrics = metrics.get();

  // The HTTP port (OpenAI API, /health, /metrics) answers 503 until the model is loaded.
  std::unique_ptr<http::HttpServer> http_server;
  if (options.http_port >= 0) {
    http::HttpOptions http_options;
    http_options.host = options.host;
    http_options.port = options.http_port;
    http_options.max_body_bytes = static_cast<size_t>(options.max_message_bytes);
    http_options.tls = *tls;
    // Every request the engine can hold (running or queued) gets a connection thread, plus
    // room for probes, scrapes and tokenizer calls.
    http_options.max_connections =
        static_cast<size_t>(options.max_seqs) + static_cast<size_t>(options.max_queue) + 64;
    http_server = std::make_unique<http::HttpServer>(&state, http_options);
    http_server->SetModelName(model_name);
    if (absl::Status st = http_server->Start(); !st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return 1;
    }
  }

  InferenceService service(&state);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(HostPort(options.host, options.port), GrpcServerCredentials(*tls),
                           &grpc_port);
  builder.RegisterService(&service);
  SetConnectionLimits(options, &builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    spdlog::error("cannot listen for gRPC on {}", HostPort(options.host, options.port));
    return 1;
  }
  SetHealth(server.get(), false);
  LogEvent(spdlog::level::info, "listening",
           {{"grpc", HostPort(options.host, grpc_port)},
            {"http", http_server != nullptr ? HostPort(options.host, http_server->port()) : "off"},
            {"metrics", options.metrics_port >= 0 ? HostPort(options.host, metrics->port())
                                                  : "off"}});

  // Load the model and start the engine; requests meanwhile get UNAVAILABLE.
  absl::Time load_start = absl::Now();
  model::ModelOptions model_options;
  model_options.num_threads = options.threads;
  model_options.activations = options.cpu_activations;
  auto loaded = model::Model::Load(options.model, model_options);
  if (!loaded.ok()) {
    spdlog::error("cannot load model '{}': {}", options.model,
                  std::string(loaded.status().message()));
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    return 1;
  }
  std::unique_ptr<model::Model> model = std::move(*loaded);

  scheduler::EngineOptions engine_options;
  engine_options.max_batched_tokens = options.max_batched_tokens;
  engine_options.max_seqs = options.max_seqs;
  engine_options.max_queue = options.max_queue;
  engine_options.block_size = options.block_size;
  engine_options.enable_prefix_caching = options.enable_prefix_caching;
  engine_options.cuda_graphs = options.cuda_graphs;
  engine_options.kv_cache_dtype = options.kv_cache_dtype;
  engine_options.device = options.device;
  if (options.kv_cache_bytes > 0) engine_options.kv_cache_bytes = options.kv_cache_bytes;
  engine_options.kv_blocks = options.kv_blocks;
  if (options.device.is_cuda() && options.kv_cache_bytes == 0 && options.kv_blocks == 0) {
    engine_options.gpu_memory_utilization = options.gpu_memory_utilization;
  }
  engine_options.max_prompt_tokens = options.max_prompt_tokens;
  engine_options.max_tokens_limit = options.max_tokens_limit;
  RequestLogger request_logger;
  FanoutObserver observer({metrics.get(), &request_logger});
  auto created = scheduler::Engine::Create(model.get(), engine_options, &observer);
  if (!created.ok()) {
    spdlog::error("cannot start the engine: {}", std::string(created.status().message()));
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    return 1;
  }
  std::unique_ptr<scheduler::Engine> engine = std::move(*created);
  const scheduler::EngineLimits& limits = engine->limits();
  state.limits = LimitsFor(limits);
  metrics->SetCacheConfig(limits.block_size, limits.kv_blocks_total, model->config().num_layers);
  state.model.store(model.get());
  state.engine.store(engine.get());
  state.phase.store(Phase::kServing);
  SetHealth(server.get(), true);
  metrics->SetServing(true);
  LogEvent(spdlog::level::info, "serving",
           {{"model", model->config().name},
            {"served_model_name", model_name},
            {"architecture", model->config().architecture},
            {"load_ms", absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - load_start))},
            {"kv_blocks", absl::StrCat(limits.kv_blocks_total)},
            {"block_size", absl::StrCat(limits.block_size)},
            {"kv_cache_dtype", kernels::KvDtypeName(limits.kv_cache_dtype)},
            {"device", limits.device},
            {"max_tokens_in_pool", absl::StrCat(limits.max_tokens_in_pool)}});

  signals.WaitFor(1, absl::InfiniteDuration());

  // Drain. Health goes first so that load balancers stop routing before requests are refused.
  state.phase.store(Phase::kDraining);
  SetHealth(server.get(), false);
  metrics->SetServing(false);
  engine->BeginDrain();
  scheduler::EngineSnapshot snap = engine->Snapshot();
  LogEvent(spdlog::level::info, "draining",
           {{"running", absl::StrCat(snap.running)},
            {"waiting", absl::StrCat(snap.waiting)},
            {"timeout", absl::FormatDuration(options.drain_timeout)}});
  const absl::Time drain_deadline = absl::Now() + options.drain_timeout;
  bool idle = false;
  while (!(idle = engine->WaitForIdle(absl::Milliseconds(100)))) {
    if (absl::Now() >= drain_deadline || signals.count() >= 2) break;
  }
  if (!idle) {
    snap = engine->Snapshot();
    LogEvent(spdlog::level::warn, "drain incomplete; cancelling",
             {{"running", absl::StrCat(snap.running)}, {"waiting", absl::StrCat(snap.waiting)}});
  }
  // Cancels whatever is left (their streams end with CANCELLED + UNAVAILABLE) and joins the
  // engine thread.
  engine->Shutdown();
  // Let the final messages flush, then stop; anything still open after that is cut.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  if (http_server != nullptr) http_server->Stop();  // streams have their last events by now
  state.engine.store(nullptr);
  state.model.store(nullptr);
  engine.reset();
  model.reset();
  LogEvent(spdlog::level::info, "stopped", {{"drained", idle ? "true" : "false"}});
  spdlog::default_logger()->flush();
  return 0;
}

}  // namespace winnow::server
