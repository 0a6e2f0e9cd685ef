#include "server/inference_service.h"

#include <chrono>
#include <deque>
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
#include "grpcpp/alarm.h"

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

// The request span's name: the gRPC method's full name, as OpenTelemetry names RPC spans.
constexpr char kGenerateSpanName[] = "winnow.v1.Inference/Generate";

// The first value of a metadata key, or empty.
std::string Metadata(const grpc::ServerContextBase& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
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

void CopyUsage(const scheduler::Usage& from, v1::Usage* usage) {
  usage->set_prompt_tokens(from.prompt_tokens);
  usage->set_cached_prompt_tokens(from.cached_prompt_tokens);
  usage->set_completion_tokens(from.completion_tokens);
  usage->set_kv_blocks_peak(from.kv_blocks_peak);
  usage->set_kv_blocks_final(from.kv_blocks_at_finish);
  for (int32_t n : from.kv_tokens_per_layer) usage->add_kv_tokens_per_layer(n);
  usage->set_preemptions(from.preemptions);
  usage->set_kv_blocks_freed_by_compression(from.kv_blocks_freed_by_compression);
  usage->set_kv_tokens_evicted(from.kv_tokens_evicted);
  for (int32_t n : from.kv_tokens_kept_per_layer) usage->add_kv_tokens_kept_per_layer(n);
}

// One Generate call: the gRPC reactor for the engine requests of its samples (one unless
// GenerateRequest.n says more). Each sample's engine sink (SampleSink) holds a shared_ptr to this
// object, so it outlives gRPC's use of it while the engine still calls back (late events are
// dropped).
// gRPC runs each reaction after the call that led to it (returning the reactor, StartWrite,
// Finish), often on another thread, ordered inside gRPC where TSan cannot see it; the
// HappensBefore / HappensAfter pairs below state that order (base/tsan.h).
class GenerateStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateStream(ServingState* state) : state_(state) {}

  void Start(std::shared_ptr<GenerateStream> self, grpc::CallbackServerContext* context,
             const v1::GenerateRequest& request);

  // The engine thread, for sample `index`.
  void OnSampleTokens(int index, const scheduler::TokenEvent& event);
  void OnSampleFinish(int index, const scheduler::FinishEvent& event);

  // gRPC reactions.
  void OnWriteDone(bool ok) override {
    base::HappensAfter(this);
    std::vector<uint64_t> cancel;
    {
      base::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        PumpLocked();
        return;
      }
      // The stream broke: the client is gone. Stop generating for nobody.
      cancel = ClientGoneLocked();
    }
    CancelAll(cancel);
  }

  void OnCancel() override {
    base::HappensAfter(this);
    std::vector<uint64_t> cancel;
    {
      base::MutexLock lock(&mu_);
      cancel = ClientGoneLocked();
    }
    // Outside mu_: Cancel takes the engine's lock, under which the engine may call our sinks.
    CancelAll(cancel);
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
    std::vector<uint64_t> cancel;
    {
      base::MutexLock lock(&mu_);
      if (!finish_called_) FinishLocked(ToGrpcStatus(status));
      cancel = UnfinishedLocked();
    }
    CancelAll(cancel);
  }

  // Submits samples [begin, end) of requests_; on a refusal the call fails. Once the call has
  // stopped, the rest are never submitted.
  void Submit(const std::shared_ptr<GenerateStream>& self, size_t begin, size_t end);
  // The client is gone, the call finished, or a sample failed.
  bool StoppedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return client_gone_ || finish_called_ || failure_.has_value();
  }
  // With prefix caching, samples 1.. start once sample 0 has prefilled (its first event): they
  // then attach its prompt's blocks. They are submitted from gRPC's executor (an alarm due at
  // once), never from the engine thread that reports the event.
  void ReleaseLaterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The engine ids of samples submitted and not finished, to cancel outside mu_.
  std::vector<uint64_t> UnfinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < engine_ids_.size(); ++i) {
      if (engine_ids_[i].has_value() && !finished_[i]) ids.push_back(*engine_ids_[i]);
    }
    return ids;
  }
  void CancelAll(const std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) engine_->Cancel(id);  // a no-op for one that finished meanwhile
  }

  // Marks the client gone and returns what to cancel (by the caller, outside mu_).
  std::vector<uint64_t> ClientGoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    client_gone_ = true;
    if (!finish_called_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
    }
    if (cancel_sent_) return {};
    cancel_sent_ = true;
    return UnfinishedLocked();
  }

  // The message that sample `index`'s next event goes into: the last queued one when it is the
  // same sample's and not final (events that arrive while a write is in flight coalesce).
  v1::GenerateResponse* MessageFor(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty() || queue_.back().index() != index ||
        queue_.back().finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      queue_.emplace_back().set_index(index);
    }
    return &queue_.back();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
      in_flight_.set_request_id(request_id_);
      writing_ = true;
      base::HappensBefore(this);
      StartWrite(&in_flight_);
    } else if (unfinished_ == 0) {
      FinishLocked(failure_.value_or(grpc::Status::OK));
    }
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finish_called_ = true;
    base::HappensBefore(this);
    Finish(status);
  }

  ServingState* state_;
  std::string request_id_;
  scheduler::Engine* engine_ = nullptr;  // set before the first Submit
  std::vector<scheduler::GenerationRequest> requests_;  // moved out as they are submitted
  grpc::Alarm release_;  // submits the later samples (ReleaseLaterLocked)
  base::Mutex mu_;
  std::shared_ptr<GenerateStream> self_ ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<uint64_t>> engine_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> finished_ ABSL_GUARDED_BY(mu_);
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;  // samples not finished (submitted or not)
  bool later_ ABSL_GUARDED_BY(mu_) = false;  // samples 1.. wait for sample 0's prefill
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse in_flight_;
  std::optional<grpc::Status> failure_ ABSL_GUARDED_BY(mu_);  // the first sample that failed
};

// Sample `index`'s engine sink: forwards to the call's stream.
class SampleSink final : public scheduler::RequestSink {
 public:
  SampleSink(std::shared_ptr<GenerateStream> stream, int index)
      : stream_(std::move(stream)), index_(index) {}
  void OnTokens(const scheduler::TokenEvent& event) override {
    stream_->OnSampleTokens(index_, event);
  }
  void OnFinish(const scheduler::FinishEvent& event) override {
    stream_->OnSampleFinish(index_, event);
  }

 private:
  std::shared_ptr<GenerateStream> stream_;
  int index_;
};

void GenerateStream::Start(std::shared_ptr<GenerateStream> self,
                           grpc::CallbackServerContext* context,
                           const v1::GenerateRequest& request) {
  {
    base::MutexLock lock(&mu_);
    self_ = self;
  }
  absl::Status st = Authenticate(*state_, *context);
  if (st.ok()) st = CheckServing(*state_, /*generate=*/true);
  if (st.ok()) {
    absl::StatusOr<std::vector<scheduler::GenerationRequest>> built =
        BuildSamples(request, *state_->model.load(), state_->limits);
    st = built.status();
    if (built.ok()) requests_ = *std::move(built);
  }
  if (!st.ok()) return Reject(st);
  request_id_ = requests_[0].request_id.empty() ? NewRequestId() : requests_[0].request_id;
  const base::TraceContext trace =
      state_->trace_sampler.Start(Metadata(*context, "traceparent"),
                                  Metadata(*context, "tracestate"), kGenerateSpanName);
  for (size_t i = 0; i < requests_.size(); ++i) {
    requests_[i].request_id = i == 0 ? request_id_ : absl::StrCat(request_id_, "-", i);
    requests_[i].deadline = ToAbslDeadline(context->deadline());
    requests_[i].trace = i == 0 ? trace : tracing::SiblingSpan(trace);
  }
  engine_ = state_->engine.load();
  const bool share = requests_.size() > 1 && engine_->limits().prefix_caching;
  {
    base::MutexLock lock(&mu_);
    engine_ids_.resize(requests_.size());
    finished_.resize(requests_.size(), false);
    unfinished_ = static_cast<int>(requests_.size());
    later_ = share;
  }
  Submit(self, 0, share ? 1 : requests_.size());
}

void GenerateStream::Submit(const std::shared_ptr<GenerateStream>& self, size_t begin,
                            size_t end) {
  for (size_t i = begin; i < end; ++i) {
    {
      base::MutexLock lock(&mu_);
      if (StoppedLocked()) {
        unfinished_ -= static_cast<int>(end - i);  // they will never run
        PumpLocked();
        return;
      }
    }
    // Without holding mu_: the engine thread may already call back into the sink.
    absl::StatusOr<uint64_t> id = engine_->Submit(
        std::move(requests_[i]), std::make_shared<SampleSink>(self, static_cast<int>(i)));
    if (!id.ok()) return Reject(id.status());
    bool cancel_now;
    {
      base::MutexLock lock(&mu_);
      engine_ids_[i] = *id;
      cancel_now = StoppedLocked() && !finished_[i];
    }
    if (cancel_now) engine_->Cancel(*id);
  }
}

void GenerateStream::ReleaseLaterLocked() {
  if (!later_) return;
  later_ = false;
  if (StoppedLocked()) {
    unfinished_ -= static_cast<int>(requests_.size()) - 1;  // they will never run
    return;
  }
  base::HappensBefore(&release_);
  release_.Set(gpr_now(GPR_CLOCK_MONOTONIC), [self = self_](bool) mutable {
    base::HappensAfter(&self->release_);
    self->Submit(self, 1, self->requests_.size());
    self.reset();  // the alarm keeps its callback, and with it this, until it is destroyed
  });
}

void GenerateStream::OnSampleTokens(int index, const scheduler::TokenEvent& event) {
  base::MutexLock lock(&mu_);
  if (index == 0) ReleaseLaterLocked();
  if (finish_called_) return;
  v1::GenerateResponse* m = MessageFor(index);
  for (int32_t id : event.token_ids) m->add_token_ids(id);
  m->mutable_text()->append(event.text);
  for (const scheduler::TokenLogprob& lp : event.logprobs) CopyLogprob(lp, m->add_logprobs());
  for (const scheduler::TokenLogprob& lp : event.prompt_logprobs) {
    CopyLogprob(lp, m->add_prompt_logprobs());
  }
  PumpLocked();
}

void GenerateStream::OnSampleFinish(int index, const scheduler::FinishEvent& event) {
  std::vector<uint64_t> cancel;
  {
    base::MutexLock lock(&mu_);
    finished_[index] = true;
    --unfinished_;
    if (!event.succeeded() && !failure_.has_value()) {
      failure_ = FinalStatus(event);
      cancel = UnfinishedLocked();  // one sample failing fails the call
    }
    if (index == 0) ReleaseLaterLocked();
    if (!finish_called_) {
      v1::GenerateResponse* m = MessageFor(index);
      m->set_finish_reason(ToProto(event.reason));
      CopyUsage(event.usage, m->mutable_usage());
      PumpLocked();
    }
  }
  CancelAll(cancel);
}

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
