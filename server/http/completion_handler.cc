#include "server/http/completion_handler.h"

#include <ctime>
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

bool Succeeded(const scheduler::FinishEvent& finish) {
  return finish.reason == scheduler::FinishReason::kStop ||
         finish.reason == scheduler::FinishReason::kLength;
}

// One SSE response: httplib calls Pump until it returns false or the sink is done, on the
// connection's thread; Release runs when the response is destroyed, also when the client left.
class SseStream {
 public:
  SseStream(std::shared_ptr<GenerationSink> gen, scheduler::Engine* engine, uint64_t id,
            ResponseContext ctx, PeerWatch peer)
      : gen_(std::move(gen)), engine_(engine), id_(id), fmt_(std::move(ctx)), peer_(peer) {}

  bool Pump(httplib::DataSink& sink) {
    if (peer_.ClientGone()) return false;  // ends the response; Release cancels
    std::string out;
    if (!started_) {
      started_ = true;
      out = fmt_.Start();
    }
    GenerationBatch batch = gen_->Take(kKeepAliveInterval);
    out += fmt_.Delta(batch.text, batch.logprobs);
    if (batch.finish.has_value()) {
      finished_ = true;
      if (Succeeded(*batch.finish)) {
        out += fmt_.Finish(batch.finish->reason, batch.finish->usage);
      } else {
        const absl::Status failure = FailureOf(*batch.finish);
        out += fmt_.Error(ClassifyStatus(failure).status, std::string(failure.message()));
      }
    }
    if (out.empty()) out = kSseKeepAlive;
    // A write to a closed connection fails: returning false ends the response, then Release.
    if (!sink.write(out.data(), out.size())) return false;
    if (finished_) sink.done();
    return true;
  }

  void Release() {
    if (!finished_) engine_->Cancel(id_);  // a no-op when the engine finished it meanwhile
  }

 private:
  std::shared_ptr<GenerationSink> gen_;
  scheduler::Engine* engine_;
  uint64_t id_;
  StreamFormatter fmt_;
  PeerWatch peer_;
  bool started_ = false;
  bool finished_ = false;
};

void RespondWhole(GenerationSink& gen, scheduler::Engine* engine, uint64_t id,
                  const PeerWatch& peer, const ResponseContext& ctx, httplib::Response& res) {
  std::string text;
  std::vector<scheduler::TokenLogprob> logprobs;
  bool cancelled = false;
  for (;;) {
    // The client is checked between batches (every token while decoding, at least every
    // 200 ms otherwise): one that hung up gets its request cancelled and its blocks freed.
    if (!cancelled && peer.ClientGone()) {
      engine->Cancel(id);
      cancelled = true;
    }
    GenerationBatch batch = gen.Take(absl::Milliseconds(200));
    text += batch.text;
    logprobs.insert(logprobs.end(), batch.logprobs.begin(), batch.logprobs.end());
    if (!batch.finish.has_value()) continue;
    if (Succeeded(*batch.finish)) {
      res.status = 200;
      res.set_content(CompletionBody(ctx, text, logprobs, batch.finish->reason,
                                     batch.finish->usage),
                      "application/json");
    } else {
      const absl::Status failure = FailureOf(*batch.finish);
      SendError(res, ClassifyStatus(failure), std::string(failure.message()), "");
    }
    return;
  }
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
  absl::StatusOr<scheduler::GenerationRequest> built =
      BuildGenerationRequest(parsed->generate, model, state->limits);
  if (!built.ok()) {
    std::string param;
    std::string message = OpenAiFieldMessage(*parsed, std::string(built.status().message()),
                                             &param);
    return Reject(state, res, built.status(), message, param);
  }
  // The id: the body's request_id, else the client's X-Request-Id header (a gateway's trace
  // id), else a new one; echoed in the X-Request-Id response header and the logs.
  if (built->request_id.empty()) built->request_id = ClientRequestId(req);
  const std::string request_id = built->request_id.empty() ? NewRequestId() : built->request_id;
  built->request_id = request_id;

  auto gen = std::make_shared<GenerationSink>();
  scheduler::Engine* engine = state->engine.load();
  absl::StatusOr<uint64_t> id = engine->Submit(std::move(*built), gen);
  if (!id.ok()) return Reject(state, res, id.status(), std::string(id.status().message()), "");

  ResponseContext ctx;
  ctx.endpoint = endpoint;
  ctx.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", request_id);
  ctx.created = static_cast<int64_t>(std::time(nullptr));
  ctx.model = model_name;
  ctx.logprobs = parsed->logprobs;
  ctx.tools = parsed->tools;
  ctx.include_usage = parsed->stream && parsed->include_usage;
  ctx.tokenizer = &model.tokenizer();
  res.set_header("X-Request-Id", request_id);
  PeerWatch peer(req.remote_addr, req.remote_port);
  if (!parsed->stream) return RespondWhole(*gen, engine, *id, peer, ctx, res);

  auto stream = std::make_shared<SseStream>(gen, engine, *id, std::move(ctx), peer);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream](size_t /*offset*/, httplib::DataSink& sink) { return stream->Pump(sink); },
      [stream](bool /*success*/) { stream->Release(); });
}

}  // namespace winnow::server::http
