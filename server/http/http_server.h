// The daemon's HTTP port: the OpenAI-compatible API (POST /v1/completions,
// POST /v1/chat/completions, GET /v1/models), vLLM's POST /tokenize and /detokenize,
// GET /health and GET /metrics. It shares the engine with the gRPC service through
// ServingState; requests are validated by the same server/request_builder.
//
// Built on cpp-httplib (Debian's libcpp-httplib-dev); docs/api.md says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/security.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace winnow::server::http {

struct HttpOptions {
  std::string host = "0.0.0.0";
  int32_t port = 8000;  // 0: pick a free port
  // Largest accepted request body; larger ones get 413.
  size_t max_body_bytes = 64 << 20;
  // Connections served at once (each holds a thread); more wait for one to end.
  size_t max_connections = 1024;
  // HTTPS when enabled, with the same certificate (and client CA) as the gRPC port.
  TlsConfig tls;
};

class HttpServer {
 public:
  HttpServer(ServingState* state, HttpOptions options);
  ~HttpServer();  // Stop()

  // Binds and starts serving on a thread of its own. Requests before the model is published
  // get 503, like gRPC's UNAVAILABLE. Every route but /health and /metrics answers 401 to a
  // request that ServingState::authenticator refuses.
  absl::Status Start();
  int32_t port() const { return port_; }

  // The name clients must send as `model` (--served-model-name, else the GGUF's general.name).
  void SetModelName(const std::string& name);

  // Stops accepting, ends open streams and joins every thread. Idempotent.
  void Stop();

 private:
  void Route();
  // The pre-routing check: true (handled, 401 written) when `req` is refused.
  bool Refuse(const httplib::Request& req, httplib::Response& res);
  std::string ModelName();

  ServingState* state_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int32_t port_ = -1;
  base::Mutex mu_;
  std::string model_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace winnow::server::http
