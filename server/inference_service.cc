#include "server/inference_service.h"

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "base/tsan.h"

namespace winnow::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status CheckServing(const ServingState& state, bool generate) {
  switch (state.phase.load()) {
    case Phase::kLoading:
      return absl::UnavailableError("the model is still loading; retry shortly");
    case Phase::kDraining:
      // Introspection stays available while in-flight streams finish.
      if (generate) return absl::UnavailableError("server is draining; not accepting requests");
      break;
    case Phase::kServing:
      break;
  }
  if (state.model.load() == nullptr || state.engine.load() == nullptr) {
    return absl::UnavailableError("the model is not loaded");
  }
  return absl::OkStatus();
}

absl::Status Authenticate(const ServingState& state, const grpc::ServerContextBase& context) {
  if (!state.authenticator.enabled()) return absl::OkStatus();
  std::string authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization.assign(it->second.data(), it->second.size());
  }
  // With a client CA the handshake verifies any certificate that is sent (REQUEST_AND_VERIFY),
  // so one that is present here was verified.
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const bool client_cert = auth != nullptr && (auth->IsPeerAuthenticated() ||
                                               !auth->FindPropertyValues("x509_pem_cert").empty());
  return state.authenticator.Check(authorization, client_cert);
}

namespace {

void CopyLogprob(const scheduler::TokenLogprob& lp, v1::TokenLogprobs* out) {
  out->set_token_id(lp.id);
  out->set_logprob(lp.logprob);
  for (const auto& [tid, tlp] : lp.top) {
    v1::TopLogprob* top = out->add_top();
    top->set_token_id(tid);
    top->set_logprob(tlp);
  }
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("req-%016x", rng());
}

v1::FinishReason ToProto(scheduler::FinishReason reason) {
  switch (reason) {
    case scheduler::FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case scheduler::FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case scheduler::FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case scheduler::FinishReason::kDeadline: return v1::FINISH_REASON_DEADLINE;
    case scheduler::FinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

grpc::Status FinalStatus(const scheduler::FinishEvent& event) {
  switch (event.reason) {
    case scheduler::FinishReason::kStop:
    case scheduler::FinishReason::kLength:
      return grpc::Status::OK;
    case scheduler::FinishReason::kCancelled:
      return event.status.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled")
                               : ToGrpcStatus(event.status);
    case scheduler::FinishReason::kDeadline:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          event.status.ok() ? "deadline exceeded"
                                            : std::string(event.status.message()));
    case scheduler::FinishReason::kError:
      return event.status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "engine error")
                               : ToGrpcStatus(event.status);
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "unknown finish reason");
}

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// One Generate call: the gRPC reactor and the engine's sink in one object, so that the engine's
// shared_ptr keeps it alive after gRPC is done with it (late events are dropped).
// gRPC runs each reaction after the call that led to it (returning the reactor, StartWrite,
// Finish), often on another thread, ordered inside gRPC where TSan cannot see it; the
// HappensBefore / HappensAfter pairs below state that order (base/tsan.h).
class GenerateStream final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                             public scheduler::RequestSink {
 public:
  explicit GenerateStream(ServingState* state) : state_(state) {}

  void Start(std::shared_ptr<GenerateStream> self, grpc::CallbackServerContext* context,
             const v1::GenerateRequest& request) {
    self_ = std::move(self);
    absl::Status st = Authenticate(*state_, *context);
    if (st.ok()) st = CheckServing(*state_, /*generate=*/true);
    absl::StatusOr<scheduler::GenerationRequest> req;
    if (st.ok()) {
      req = BuildGenerationRequest(request, *state_->model.load(), state_->limits);
      st = req.status();
    }
    if (!st.ok()) return Reject(st);
    request_id_ = req->request_id.empty() ? NewRequestId() : req->request_id;
    req->request_id = request_id_;
    req->deadline = ToAbslDeadline(context->deadline());
    scheduler::Engine* engine = state_->engine.load();
    // Submit without holding mu_: the engine thread may already call back into this sink.
    absl::StatusOr<uint64_t> id = engine->Submit(std::move(*req), self_);
    if (!id.ok()) return Reject(id.status());
    bool cancel_now;
    {
      base::MutexLock lock(&mu_);
      engine_ = engine;
      engine_id_ = *id;
      submitted_ = true;
      cancel_now = client_gone_ && !engine_finished_;
    }
    if (cancel_now) engine->Cancel(*id);
  }

  // RequestSink: engine thread.
  void OnTokens(const scheduler::TokenEvent& event) override {
    base::MutexLock lock(&mu_);
    if (finish_called_) return;
    for (int32_t id : event.token_ids) pending_.add_token_ids(id);
    pending_.mutable_text()->append(event.text);
    for (const scheduler::TokenLogprob& lp : event.logprobs) {
      CopyLogprob(lp, pending_.add_logprobs());
    }
    for (const scheduler::TokenLogprob& lp : event.prompt_logprobs) {
      CopyLogprob(lp, pending_.add_prompt_logprobs());
    }
    has_pending_ = true;
    PumpLocked();
  }

  void OnFinish(const scheduler::FinishEvent& event) override {
    base::MutexLock lock(&mu_);
    engine_finished_ = true;
    if (finish_called_) return;
    pending_.set_finish_reason(ToProto(event.reason));
    v1::Usage* usage = pending_.mutable_usage();
    usage->set_prompt_tokens(event.usage.prompt_tokens);
    usage->set_cached_prompt_tokens(event.usage.cached_prompt_tokens);
    usage->set_completion_tokens(event.usage.completion_tokens);
    usage->set_kv_blocks_peak(event.usage.kv_blocks_peak);
    usage->set_kv_blocks_final(event.usage.kv_blocks_at_finish);
    for (int32_t n : event.usage.kv_tokens_per_layer) usage->add_kv_tokens_per_layer(n);
    usage->set_preemptions(event.usage.preemptions);
    usage->set_kv_blocks_freed_by_compression(event.usage.kv_blocks_freed_by_compression);
    usage->set_kv_tokens_evicted(event.usage.kv_tokens_evicted);
    for (int32_t n : event.usage.kv_tokens_kept_per_layer) usage->add_kv_tokens_kept_per_layer(n);
    has_pending_ = true;
    final_status_ = FinalStatus(event);
    PumpLocked();
  }

  // gRPC reactions.
  void OnWriteDone(bool ok) override {
    base::HappensAfter(this);
    uint64_t cancel_id = 0;
    bool cancel = false;
    {
      base::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        PumpLocked();
        return;
      }
      // The stream broke: the client is gone. Stop generating for nobody.
      cancel = ClientGoneLocked(&cancel_id);
    }
    if (cancel) engine_->Cancel(cancel_id);
  }

  void OnCancel() override {
    base::HappensAfter(this);
    uint64_t cancel_id = 0;
    bool cancel;
    {
      base::MutexLock lock(&mu_);
      cancel = ClientGoneLocked(&cancel_id);
    }
    // Outside mu_: Cancel takes the engine's lock, under which the engine may call our sink.
    if (cancel) engine_->Cancel(cancel_id);
  }

  void OnDone() override {
    base::HappensAfter(this);
    std::shared_ptr<GenerateStream> self;
    {
      base::MutexLock lock(&mu_);
      self = std::move(self_);
    }
    // `self` may be the last reference; this object dies at the end of this scope.
  }

 private:
  void Reject(const absl::Status& status) {
    // Labelled with the gRPC code name (absl's spelling is gRPC's: "INVALID_ARGUMENT").
    if (state_->metrics != nullptr) {
      state_->metrics->OnRejected(absl::StatusCodeToString(status.code()));
    }
    base::MutexLock lock(&mu_);
    FinishLocked(ToGrpcStatus(status));
  }

  // Returns true when the engine request should be cancelled (by the caller, outside mu_).
  bool ClientGoneLocked(uint64_t* id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    client_gone_ = true;
    if (!finish_called_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
    }
    if (!submitted_ || engine_finished_ || cancel_sent_) return false;
    cancel_sent_ = true;
    *id = engine_id_;
    return true;
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finish_called_) return;
    if (has_pending_) {
      in_flight_ = std::move(pending_);
      pending_.Clear();
      has_pending_ = false;
      in_flight_.set_request_id(request_id_);
      writing_ = true;
      base::HappensBefore(this);
      StartWrite(&in_flight_);
    } else if (final_status_.has_value()) {
      FinishLocked(*final_status_);
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finish_called_ = true;
    base::HappensBefore(this);
    Finish(status);
  }

  ServingState* state_;
  std::string request_id_;
  base::Mutex mu_;
  std::shared_ptr<GenerateStream> self_ ABSL_GUARDED_BY(mu_);
  scheduler::Engine* engine_ = nullptr;  // set with submitted_
  uint64_t engine_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Tokens that arrive while a write is in flight coalesce here into one message.
  v1::GenerateResponse pending_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse in_flight_;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& st) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::Refuse(grpc::CallbackServerContext* context,
                                                   const absl::Status& status) {
  if (state_->metrics != nullptr) {
    state_->metrics->OnRejected(absl::StatusCodeToString(status.code()));
  }
  return Done(context, status);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto stream = std::make_shared<GenerateStream>(state_);
  GenerateStream* raw = stream.get();
  raw->Start(std::move(stream), context, *request);
  base::HappensBefore(raw);
  return raw;
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  if (absl::Status st = Authenticate(*state_, *context); !st.ok()) return Refuse(context, st);
  if (absl::Status st = CheckServing(*state_, false); !st.ok()) return Done(context, st);
  const model::Model& model = *state_->model.load();
  const bool add_special =
      request->has_add_special_tokens() ? request->add_special_tokens() : true;
  std::vector<int32_t> ids;
  switch (request->input_case()) {
    case v1::TokenizeRequest::kText:
      ids = model.tokenizer().Encode(request->text(), add_special, /*parse_special=*/true);
      break;
    case v1::TokenizeRequest::kChat: {
      auto chat = TokenizeChat(request->chat(), model, add_special, "chat");
      if (!chat.ok()) return Done(context, chat.status());
      ids = std::move(*chat);
      break;
    }
    case v1::TokenizeRequest::INPUT_NOT_SET:
      return Done(context, absl::InvalidArgumentError("input: one of text or chat is required"));
  }
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* context,
                                                       const v1::DetokenizeRequest* request,
                                                       v1::DetokenizeResponse* response) {
  if (absl::Status st = Authenticate(*state_, *context); !st.ok()) return Refuse(context, st);
  if (absl::Status st = CheckServing(*state_, false); !st.ok()) return Done(context, st);
  const model::Model& model = *state_->model.load();
  const int32_t vocab = model.config().vocab_size;
  for (int i = 0; i < request->token_ids_size(); ++i) {
    const int32_t id = request->token_ids(i);
    if (id < 0 || id >= vocab) {
      return Done(context, absl::InvalidArgumentError(absl::StrFormat(
                               "token_ids[%d]: token id %d is outside the vocabulary [0, %d)", i,
                               id, vocab)));
    }
  }
  // The streaming detokenizer guarantees valid UTF-8, which proto3 strings require.
  model::StreamingDetokenizer detok(model.tokenizer(), request->render_special());
  std::string text;
  for (int32_t id : request->token_ids()) text += detok.Append(id);
  text += detok.Flush();
  response->set_text(std::move(text));
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetModelInfoRequest* request,
                                                         v1::ModelInfo* response) {
  if (absl::Status st = Authenticate(*state_, *context); !st.ok()) return Refuse(context, st);
  if (absl::Status st = CheckServing(*state_, false); !st.ok()) return Done(context, st);
  const model::Model& model = *state_->model.load();
  const model::ModelConfig& c = model.config();
  const scheduler::EngineLimits& limits = state_->engine.load()->limits();
  response->set_name(c.name);
  response->set_architecture(c.architecture);
  response->set_num_layers(c.num_layers);
  response->set_hidden_size(c.hidden_size);
  response->set_num_heads(c.num_heads);
  response->set_num_kv_heads(c.num_kv_heads);
  response->set_head_dim(c.head_dim);
  response->set_context_length(c.context_length);
  response->set_vocab_size(c.vocab_size);
  response->set_block_size(limits.block_size);
  response->set_kv_bytes_per_token(limits.kv_bytes_per_token);
  response->set_kv_cache_dtype(kernels::KvDtypeName(limits.kv_cache_dtype));
  response->set_device(limits.device);
  response->set_bos_token_id(model.tokenizer().bos_id());
  response->set_eos_token_id(model.tokenizer().eos_id());
  for (int32_t id : model.tokenizer().end_of_generation_ids()) {
    response->add_end_of_generation_token_ids(id);
  }
  response->set_has_chat_template(model.chat_template().ok());
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::GetServerStatus(
    grpc::CallbackServerContext* context, const v1::GetServerStatusRequest* request,
    v1::ServerStatus* response) {
  if (absl::Status st = Authenticate(*state_, *context); !st.ok()) return Refuse(context, st);
  const Phase phase = state_->phase.load();
  response->set_serving(phase == Phase::kServing);
  response->set_draining(phase == Phase::kDraining);
  const ServeOptions& o = state_->options;
  v1::ServerLimits* limits = response->mutable_limits();
  limits->set_max_message_bytes(o.max_message_bytes);
  scheduler::Engine* engine = state_->engine.load();
  if (engine == nullptr) {
    // Loading: report the configured limits; the pool does not exist yet.
    limits->set_max_batched_tokens(o.max_batched_tokens);
    limits->set_max_seqs(o.max_seqs);
    limits->set_max_queue(o.max_queue);
    limits->set_max_prompt_tokens(o.max_prompt_tokens);
    limits->set_max_tokens_limit(o.max_tokens_limit);
    response->set_block_size(o.block_size);
    response->set_kv_cache_dtype(kernels::KvDtypeName(o.kv_cache_dtype));
    response->set_device(o.device.ToString());
    return Done(context, absl::OkStatus());
  }
  scheduler::EngineSnapshot snap = engine->Snapshot();
  response->set_running(snap.running);
  response->set_waiting(snap.waiting);
  response->set_kv_blocks_total(snap.kv_blocks_total);
  response->set_kv_blocks_free(snap.kv_blocks_free);
  response->set_block_size(snap.limits.block_size);
  response->set_preemptions_total(snap.preemptions_total);
  response->set_kv_cache_dtype(kernels::KvDtypeName(snap.limits.kv_cache_dtype));
  response->set_device(snap.limits.device);
  limits->set_max_batched_tokens(snap.limits.max_batched_tokens);
  limits->set_max_seqs(snap.limits.max_seqs);
  limits->set_max_queue(snap.limits.max_queue);
  limits->set_max_prompt_tokens(snap.limits.max_prompt_tokens);
  limits->set_max_tokens_limit(snap.limits.max_tokens_limit);
  limits->set_context_length(snap.limits.context_length);
  return Done(context, absl::OkStatus());
}

}  // namespace winnow::server
