// The winnow.v1.Inference gRPC service (callback API). Generate streams engine events back to
// the client; a client that goes away or whose deadline passes has its request cancelled in the
// engine, which frees its KV blocks within one iteration.
#pragma once

#include <atomic>
#include <cstdint>

#include "model/model.h"
#include "scheduler/engine.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/request_builder.h"
#include "server/security.h"
#include "server/tracing/propagation.h"
#include "winnow/v1/inference.grpc.pb.h"

namespace winnow::server {

enum class Phase : int { kLoading, kServing, kDraining };

// What the service reads from the daemon. The daemon publishes the model and engine once they
// are loaded and keeps them alive until the gRPC server has shut down.
struct ServingState {
  ServeOptions options;
  Metrics* metrics = nullptr;
  std::atomic<Phase> phase{Phase::kLoading};
  std::atomic<const model::Model*> model{nullptr};
  std::atomic<scheduler::Engine*> engine{nullptr};
  RequestLimits limits;  // written before `engine` is published
  Authenticator authenticator;  // set before the servers start, read-only after
  // Each request's trace context from its traceparent; set before the servers start.
  tracing::TraceSampler trace_sampler{/*exporting=*/false, /*ratio=*/1.0};
};

// UNAVAILABLE (retry elsewhere) while the daemon is not taking requests, OK otherwise; for
// gRPC and HTTP alike. While draining, introspection (generate = false) stays available so
// in-flight streams can finish.
absl::Status CheckServing(const ServingState& state, bool generate);

// UNAUTHENTICATED unless a gRPC call proves what --tls-client-ca and --api-key-file ask for
// (its "authorization" metadata, the client certificate its connection's TLS verified).
absl::Status Authenticate(const ServingState& state, const grpc::ServerContextBase& context);

class InferenceService final : public v1::Inference::CallbackService {
 public:
  explicit InferenceService(ServingState* state) : state_(state) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerStatus(grpc::CallbackServerContext* context,
                                            const v1::GetServerStatusRequest* request,
                                            v1::ServerStatus* response) override;

 private:
  // Done with `status`, counted as a rejection.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context,
                                   const absl::Status& status);

  ServingState* state_;
};

// absl -> gRPC status; the canonical codes share their numbers.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace winnow::server
