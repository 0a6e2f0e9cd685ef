#include "server/http/completion_handler.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <vector>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/http/generation_sink.h"
#include "server/http/http_errors.h"
#include "server/http/openai_response.h"
#include "server/http/peer_watch.h"
#include "server/request_builder.h"
#include "server/tracing/propagation.h"

namespace winnow::server::http {
namespace {

// Silence longer than this (queueing, a long prefill) gets a keep-alive comment, which is how a
// stream finds out that its client has gone.
constexpr absl::Duration kKeepAliveInterval = absl::Seconds(1);

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("req-%016x", rng());
}

// The client's X-Request-Id header when it is a usable id: at most kMaxRequestIdBytes of
// printable ASCII (it is echoed in a header and written to logs); else empty.
std::string ClientRequestId(const httplib::Request& req) {
  std::string id = req.get_header_value("X-Request-Id");
  if (id.size() > kMaxRequestIdBytes) return "";
  for (const char c : id) {
    if (c < 0x21 || c > 0x7E) return "";
  }
  return id;
}

void Reject(ServingState* state, httplib::Response& res, const absl::Status& status,
            const std::string& message, const std::string& param) {
  if (state->metrics != nullptr) {
    state->metrics->OnRejected(absl::StatusCodeToString(status.code()));
  }
  SendError(res, ClassifyStatus(status), message, param);
}

// The HTTP status of a request that ended other than by stop or length.
absl::Status FailureOf(const scheduler::FinishEvent& finish) {
  if (!finish.status.ok()) return finish.status;
  switch (finish.reason) {
    case scheduler::FinishReason::kCancelled: return absl::CancelledError("request cancelled");
    case scheduler::FinishReason::kDeadline: return absl::DeadlineExceededError("deadline");
    default: return absl::InternalError("engine error");
  }
}

// The engine requests of one HTTP request: one per choice (n of them per prompt), whose sinks
// share one Wakeup so that a handler can wait for any of them.
class Choices {
 public:
  Choices(scheduler::Engine* engine, int count, int n)
      : engine_(engine), wakeup_(std::make_shared<Wakeup>()), n_(n) {
    for (int i = 0; i < count; ++i) sinks_.push_back(std::make_shared<GenerationSink>(wakeup_));
    ids_.resize(count);
    finished_.resize(count, false);
    usage_.resize(count);
    echo_.resize(count);
    first_token_.resize(count, -1);
  }

  // Submits every choice. With prefix caching, a prompt's other n - 1 choices wait until its
  // first one has prefilled: they then attach its KV blocks instead of computing them again.
  // On a refusal the choices already submitted are cancelled.
  absl::Status Submit(std::vector<scheduler::GenerationRequest> requests) {
    const bool share = n_ > 1 && engine_->limits().prefix_caching;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (share && i % n_ == 1) sinks_[i - 1]->WaitStarted(kShareWait);
      absl::StatusOr<uint64_t> id = engine_->Submit(std::move(requests[i]), sinks_[i]);
      if (!id.ok()) {
        for (size_t j = 0; j < i; ++j) engine_->Cancel(ids_[j]);
        return id.status();
      }
      ids_[i] = *id;
    }
    return absl::OkStatus();
  }

  // Echo: choice i's prompt text and first token (the rest of its tokens come scored with the
  // first batch when logprobs were asked).
  void SetEcho(int i, std::string text, int32_t first_token) {
    echo_[i].text = std::move(text);
    first_token_[i] = first_token;
  }
  const EchoedPrompt& echo(int i) const { return echo_[i]; }

  int size() const { return static_cast<int>(sinks_.size()); }
  uint64_t seen() { return wakeup_->count(); }
  void Wait(uint64_t seen, absl::Duration timeout) { wakeup_->Wait(seen, timeout); }
  // What choice `i` produced since the last call (nothing once it finished).
  GenerationBatch Take(int i) {
    if (finished_[i]) return {};
    GenerationBatch batch = sinks_[i]->Take(absl::ZeroDuration());
    if (!batch.prompt_logprobs.empty()) {
      // The first prompt token has no context: NaN, written as null.
      echo_[i].logprobs.push_back({first_token_[i], std::nanf(""), {}});
      echo_[i].logprobs.insert(echo_[i].logprobs.end(), batch.prompt_logprobs.begin(),
                               batch.prompt_logprobs.end());
    }
    if (batch.finish.has_value()) {
      finished_[i] = true;
      usage_[i] = batch.finish->usage;
    }
    return batch;
  }
  bool all_finished() const {
    return std::all_of(finished_.begin(), finished_.end(), [](bool f) { return f; });
  }
  void CancelAll() {
    for (int i = 0; i < size(); ++i) {
      if (!finished_[i]) engine_->Cancel(ids_[i]);  // a no-op for one that finished meanwhile
    }
  }
  // OpenAI's usage: each prompt counted once (its first choice), completions summed (none for
  // an echo of the prompt alone).
  scheduler::Usage TotalUsage(bool echo_only) const {
    scheduler::Usage total;
    for (int i = 0; i < size(); ++i) {
      if (i % n_ == 0) {
        total.prompt_tokens += usage_[i].prompt_tokens;
        total.cached_prompt_tokens += usage_[i].cached_prompt_tokens;
      }
      if (!echo_only) total.completion_tokens += usage_[i].completion_tokens;
    }
    return total;
  }

 private:
  // How long a prompt's other choices wait for its prefill before going ahead without sharing.
  static constexpr absl::Duration kShareWait = absl::Seconds(30);
  scheduler::Engine* engine_;
  std::shared_ptr<Wakeup> wakeup_;
  int n_;
  std::vector<std::shared_ptr<GenerationSink>> sinks_;
  std::vector<uint64_t> ids_;
  std::vector<bool> finished_;
  std::vector<scheduler::Usage> usage_;
  std::vector<EchoedPrompt> echo_;
  std::vector<int32_t> first_token_;
};

// One SSE response: httplib calls Pump until it returns false or the choices are done, on the
// connection's thread; Release runs when the response is destroyed, also when the client left.
class SseStream {
 public:
  SseStream(std::shared_ptr<Choices> choices, ResponseContext ctx, PeerWatch peer)
      : echo_(ctx.echo), echo_only_(ctx.echo_only), choices_(std::move(choices)),
        fmt_(std::move(ctx), choices_->size()), peer_(peer), echoed_(choices_->size(), false) {}

  bool Pump(httplib::DataSink& sink) {
    if (peer_.ClientGone()) return false;  // ends the response; Release cancels
    std::string out;
    if (!started_) {
      started_ = true;
      for (int i = 0; i < choices_->size(); ++i) out += fmt_.Start(i);
    }
    const uint64_t seen = choices_->seen();
    out += Collect();
    if (out.empty() && !finished_) {
      choices_->Wait(seen, kKeepAliveInterval);
      out += Collect();
    }
    if (out.empty()) out = kSseKeepAlive;
    // A write to a closed connection fails: returning false ends the response, then Release.
    if (!sink.write(out.data(), out.size())) return false;
    if (finished_) sink.done();
    return true;
  }

  void Release() {
    if (!finished_) choices_->CancelAll();
  }

 private:
  // Every choice's news as chunks; after the last finish, the usage and [DONE]. A failed choice
  // ends the whole stream with an error event (the others are cancelled).
  std::string Collect() {
    std::string out;
    for (int i = 0; i < choices_->size() && !finished_; ++i) {
      GenerationBatch batch = choices_->Take(i);
      if (echo_ && !echoed_[i] && !batch.empty()) {
        echoed_[i] = true;
        out += fmt_.Echo(i, choices_->echo(i));
      }
      out += fmt_.Delta(i, batch.text, batch.logprobs);
      if (!batch.finish.has_value()) continue;
      if (!batch.finish->succeeded()) {
        const absl::Status failure = FailureOf(*batch.finish);
        choices_->CancelAll();
        finished_ = true;
        return out + fmt_.Error(ClassifyStatus(failure).status, std::string(failure.message()));
      }
      out += fmt_.Finish(i, batch.finish->reason);
    }
    if (!finished_ && choices_->all_finished()) {
      finished_ = true;
      out += fmt_.Done(choices_->TotalUsage(echo_only_));
    }
    return out;
  }

  const bool echo_;
  const bool echo_only_;
  std::shared_ptr<Choices> choices_;
  StreamFormatter fmt_;
  PeerWatch peer_;
  std::vector<bool> echoed_;  // per choice: its prompt went out
  bool started_ = false;
  bool finished_ = false;
};

void RespondWhole(Choices& choices, const PeerWatch& peer, const ResponseContext& ctx,
                  httplib::Response& res) {
  std::vector<ChoiceOutput> outputs(choices.size());
  std::optional<absl::Status> failure;
  bool cancelled = false;
  while (!choices.all_finished()) {
    // The client is checked between batches (every token while decoding, at least every
    // 200 ms otherwise): one that hung up gets its requests cancelled and their blocks freed.
    if (!cancelled && peer.ClientGone()) {
      choices.CancelAll();
      cancelled = true;
    }
    const uint64_t seen = choices.seen();
    bool news = false;
    for (int i = 0; i < choices.size(); ++i) {
      GenerationBatch batch = choices.Take(i);
      news = news || !batch.empty();
      outputs[i].text += batch.text;
      outputs[i].logprobs.insert(outputs[i].logprobs.end(), batch.logprobs.begin(),
                                 batch.logprobs.end());
      if (!batch.finish.has_value()) continue;
      if (ctx.echo) outputs[i].prompt = choices.echo(i);
      outputs[i].reason = batch.finish->reason;
      if (!batch.finish->succeeded() && !failure.has_value()) {
        failure = FailureOf(*batch.finish);
        choices.CancelAll();  // one failed choice fails the request
      }
    }
    if (!news) choices.Wait(seen, absl::Milliseconds(200));
  }
  if (failure.has_value()) {
    SendError(res, ClassifyStatus(*failure), std::string(failure->message()), "");
    return;
  }
  res.status = 200;
  res.set_content(CompletionBody(ctx, outputs, choices.TotalUsage(ctx.echo_only)),
                  "application/json");
}

// The engine requests of every choice, validated and named: the body's request_id, else the
// client's X-Request-Id header (a gateway's trace id), else a new one, which the response
// echoes in X-Request-Id and the logs show; choices after the first log as <id>-<index>. Each
// continues the traceparent header's trace, if any.
// An error is the builder's (what ClassifyStatus reads), with its message renamed to the
// OpenAI fields in `message` and the field in `param`.
absl::StatusOr<std::vector<scheduler::GenerationRequest>> BuildChoices(
    const OpenAiRequest& parsed, const model::Model& model, const RequestLimits& limits,
    const tracing::TraceSampler& trace_sampler, const httplib::Request& req,
    std::string* message, std::string* param) {
  std::vector<scheduler::GenerationRequest> requests;
  for (v1::GenerateRequest choice : parsed.choices) {
    // An unset temperature is the model's default, else OpenAI's 1 (gRPC's would be greedy).
    if (!choice.sampling().has_temperature()) {
      choice.mutable_sampling()->set_temperature(
          model.generation_defaults().temperature.value_or(1.0f));
    }
    absl::StatusOr<scheduler::GenerationRequest> built =
        BuildGenerationRequest(choice, model, limits);
    if (!built.ok()) {
      *message = OpenAiFieldMessage(parsed, std::string(built.status().message()), param);
      return built.status();
    }
    requests.push_back(*std::move(built));
  }
  std::string request_id = requests[0].request_id;
  if (request_id.empty()) request_id = ClientRequestId(req);
  if (request_id.empty()) request_id = NewRequestId();
  // One trace context per choice: each is an engine request with a span of its own.
  const base::TraceContext trace = trace_sampler.Start(
      req.get_header_value("traceparent"), req.get_header_value("tracestate"),
      absl::StrCat(req.method, " ", req.path));
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].request_id = i == 0 ? request_id : absl::StrCat(request_id, "-", i);
    requests[i].trace = i == 0 ? trace : tracing::SiblingSpan(trace);
  }
  return requests;
}

ResponseContext MakeContext(const OpenAiRequest& parsed, const std::string& model_name,
                            const std::string& request_id, const model::Model& model) {
  ResponseContext ctx;
  ctx.endpoint = parsed.endpoint;
  ctx.id = absl::StrCat(parsed.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", request_id);
  ctx.created = static_cast<int64_t>(std::time(nullptr));
  ctx.model = model_name;
  ctx.logprobs = parsed.logprobs;
  ctx.tools = parsed.tools;
  ctx.tool_syntax = model.tool_call_syntax();
  ctx.echo = parsed.echo;
  ctx.echo_only = parsed.echo_only;
  ctx.include_usage = parsed.stream && parsed.include_usage;
  ctx.tokenizer = &model.tokenizer();
  return ctx;
}

}  // namespace

void HandleGeneration(Endpoint endpoint, const std::string& model_name, ServingState* state,
                      const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, req.body);
  if (!parsed.ok()) {
    const std::string message(parsed.status().message());
    return Reject(state, res, parsed.status(), message, FieldOf(message));
  }
  if (!parsed->model.empty() && parsed->model != model_name) {
    return Reject(state, res, absl::NotFoundError(""),
                  absl::StrCat("model: '", parsed->model, "' is not served here (this server "
                               "serves '", model_name, "'; GET /v1/models lists it)"),
                  "model");
  }
  if (absl::Status st = CheckServing(*state, /*generate=*/true); !st.ok()) {
    return Reject(state, res, st, std::string(st.message()), "");
  }
  const model::Model& model = *state->model.load();
  std::string message, param;
  absl::StatusOr<std::vector<scheduler::GenerationRequest>> requests =
      BuildChoices(*parsed, model, state->limits, state->trace_sampler, req, &message, &param);
  if (!requests.ok()) return Reject(state, res, requests.status(), message, param);
  const std::string request_id = (*requests)[0].request_id;
  auto choices = std::make_shared<Choices>(state->engine.load(),
                                           static_cast<int>(requests->size()), parsed->n);
  if (parsed->echo) {
    for (size_t i = 0; i < requests->size(); ++i) {
      const v1::GenerateRequest& choice = parsed->choices[i];
      const std::vector<int32_t>& prompt = (*requests)[i].prompt_tokens;
      choices->SetEcho(static_cast<int>(i),
                       choice.has_token_ids() ? model.tokenizer().Decode(prompt, false)
                                              : choice.prompt(),
                       prompt[0]);
    }
  }
  if (absl::Status st = choices->Submit(*std::move(requests)); !st.ok()) {
    return Reject(state, res, st, std::string(st.message()), "");
  }

  ResponseContext ctx = MakeContext(*parsed, model_name, request_id, model);
  res.set_header("X-Request-Id", request_id);
  PeerWatch peer(req.remote_addr, req.remote_port);
  if (!parsed->stream) return RespondWhole(*choices, peer, ctx, res);

  auto stream = std::make_shared<SseStream>(choices, std::move(ctx), peer);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream](size_t /*offset*/, httplib::DataSink& sink) { return stream->Pump(sink); },
      [stream](bool /*success*/) { stream->Release(); });
}

}  // namespace winnow::server::http
