#include "server/http/http_server.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <ctime>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "server/http/completion_handler.h"
#include "server/http/connection_pool.h"
#include "server/http/http_errors.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/request_builder.h"

namespace winnow::server::http {
namespace {

using Json = nlohmann::json;

void SendJson(httplib::Response& res, const Json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void SendStatus(httplib::Response& res, const absl::Status& st) {
  const std::string message(st.message());
  SendError(res, ClassifyStatus(st), message, FieldOf(message));
}

Json ParseObject(const std::string& body, absl::Status* error) {
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    *error = absl::InvalidArgumentError("body: must be a JSON object");
  }
  return json;
}

// vLLM's POST /tokenize: {"prompt": text} or {"messages": [...]} (chat template applied), with
// add_special_tokens (default true) and add_generation_prompt (default true).
absl::StatusOr<Json> Tokenize(const model::Model& model, const std::string& body) {
  absl::Status error;
  Json json = ParseObject(body, &error);
  if (!error.ok()) return error;
  const bool chat = json.contains("messages");
  // The completion/chat parser checks the shape of prompt or messages, with the same errors.
  WINNOW_ASSIGN_OR_RETURN(
      const OpenAiRequest parsed,
      ParseOpenAiRequest(chat ? Endpoint::kChat : Endpoint::kCompletions, body));
  bool add_special = true;
  if (auto it = json.find("add_special_tokens"); it != json.end() && it->is_boolean()) {
    add_special = it->get<bool>();
  }
  std::vector<int32_t> ids;
  const v1::GenerateRequest& g = parsed.generate;
  if (chat) {
    v1::ChatMessages messages = g.chat();
    if (auto it = json.find("add_generation_prompt"); it != json.end() && it->is_boolean()) {
      messages.set_add_generation_prompt(it->get<bool>());
    }
    absl::StatusOr<std::vector<int32_t>> r = TokenizeChat(messages, model, add_special, "chat");
    if (!r.ok()) {
      std::string param;
      const std::string message =
          OpenAiFieldMessage(parsed, std::string(r.status().message()), &param);
      return absl::Status(r.status().code(), message);
    }
    ids = std::move(*r);
  } else if (g.input_case() == v1::GenerateRequest::kPrompt) {
    ids = model.tokenizer().Encode(g.prompt(), add_special, /*parse_special=*/true);
  } else {
    return absl::InvalidArgumentError("prompt: must be a string");
  }
  return Json{{"count", ids.size()},
              {"max_model_len", model.config().context_length},
              {"tokens", ids}};
}

// vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text}.
absl::StatusOr<Json> Detokenize(const model::Model& model, const std::string& body) {
  absl::Status error;
  Json json = ParseObject(body, &error);
  if (!error.ok()) return error;
  auto it = json.find("tokens");
  if (it == json.end() || !it->is_array()) {
    return absl::InvalidArgumentError("tokens: must be a list of token ids");
  }
  const int32_t vocab = model.config().vocab_size;
  model::StreamingDetokenizer detok(model.tokenizer());
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& id = (*it)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokens[%d]: must be a token id in the vocabulary [0, %d)", i, vocab));
    }
    text += detok.Append(static_cast<int32_t>(id.get<int64_t>()));
  }
  text += detok.Flush();
  return Json{{"prompt", text}};
}

// OpenSSL set up here rather than by cpp-httplib's file constructor, which with a client CA
// makes a client certificate mandatory for the whole port and so shuts probes out of /health:
// here one is requested, verified when sent (a bad one fails the handshake), and each route
// checks for it (ClientCertificateVerified).
bool SetUpTls(const TlsConfig& tls, SSL_CTX& ctx) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_use_certificate_chain_file(&ctx, tls.cert_path.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(&ctx, tls.key_path.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(&ctx) != 1) {
    return false;
  }
  if (tls.verifies_clients()) {
    if (SSL_CTX_load_verify_locations(&ctx, tls.client_ca_path.c_str(), nullptr) != 1) {
      return false;
    }
    SSL_CTX_set_client_CA_list(&ctx, SSL_load_client_CA_file(tls.client_ca_path.c_str()));
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
  }
  return true;
}

bool ClientCertificateVerified(const httplib::Request& req) {
  if (req.ssl == nullptr) return false;
  X509* cert = SSL_get_peer_certificate(req.ssl);
  if (cert == nullptr) return false;
  X509_free(cert);
  return SSL_get_verify_result(req.ssl) == X509_V_OK;
}

// Open to everyone: probes and scrapers carry no secret.
bool IsOpenRoute(const httplib::Request& req) {
  return req.method == "GET" && (req.path == "/health" || req.path == "/metrics");
}

}  // namespace

HttpServer::HttpServer(ServingState* state, HttpOptions options)
    : state_(state), options_(std::move(options)) {}

bool HttpServer::Refuse(const httplib::Request& req, httplib::Response& res) {
  if (IsOpenRoute(req) || !state_->authenticator.enabled()) return false;
  absl::Status st = state_->authenticator.Check(req.get_header_value("Authorization"),
                                                ClientCertificateVerified(req));
  if (st.ok()) return false;
  if (state_->metrics != nullptr) {
    state_->metrics->OnRejected(absl::StatusCodeToString(st.code()));
  }
  res.set_header("WWW-Authenticate", "Bearer");
  // Refused before its body is read (cpp-httplib's pre-routing stage): the connection cannot
  // carry another request after it.
  res.set_header("Connection", "close");
  SendError(res, ClassifyStatus(st), std::string(st.message()), "authorization");
  return true;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::SetModelName(const std::string& name) {
  base::MutexLock lock(&mu_);
  model_name_ = name;
}

std::string HttpServer::ModelName() {
  base::MutexLock lock(&mu_);
  return model_name_;
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    // 200 only while serving: load balancers and readiness probes take the pod out while it
    // loads or drains. Answered without touching the engine, so it stays fast on a busy pod.
    if (state_->phase.load() == Phase::kServing) {
      res.status = 200;
      return;
    }
    SendStatus(res, CheckServing(*state_, /*generate=*/true));
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(state_->metrics->Exposition(), kExpositionContentType);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    if (absl::Status st = CheckServing(*state_, false); !st.ok()) return SendStatus(res, st);
    const std::string name = ModelName();
    Json model = {{"id", name},
                  {"object", "model"},
                  {"created", static_cast<int64_t>(std::time(nullptr))},
                  {"owned_by", "winnow"},
                  {"root", name},
                  {"max_model_len", state_->model.load()->config().context_length}};
    SendJson(res, {{"object", "list"}, {"data", Json::array({model})}});
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::Status st = CheckServing(*state_, false); !st.ok()) return SendStatus(res, st);
    absl::StatusOr<Json> out = Tokenize(*state_->model.load(), req.body);
    return out.ok() ? SendJson(res, *out) : SendStatus(res, out.status());
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::Status st = CheckServing(*state_, false); !st.ok()) return SendStatus(res, st);
    absl::StatusOr<Json> out = Detokenize(*state_->model.load(), req.body);
    return out.ok() ? SendJson(res, *out) : SendStatus(res, out.status());
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kCompletions, ModelName(), state_, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kChat, ModelName(), state_, req, res);
  });
  // httplib's own errors (unknown path 404, body over the limit 413, bad request 400) get the
  // OpenAI error body too; handlers that wrote a body keep it.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = absl::StrCat("HTTP ", res.status);
    if (res.status == 404) {
      message = absl::StrCat("no route for ", req.method, " ", req.path);
    } else if (res.status == 413 && absl::StrContains(req.get_header_value("Content-Type"),
                                                      "x-www-form-urlencoded")) {
      // cpp-httplib caps form bodies at 8 KiB; curl -d sends that content type by default.
      message = "body: a form-encoded body is limited to 8 KiB; send the JSON with "
                "Content-Type: application/json";
    } else if (res.status == 413) {
      message = "body: larger than the server accepts (--max-message-bytes)";
    }
    res.set_content(ErrorBody(message, res.status >= 500 ? "server_error" : "invalid_request_error",
                              "", ""),
                    "application/json");
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                             std::exception_ptr) {
    SendError(res, {500, "server_error", ""}, "internal error", "");
  });
}

absl::Status HttpServer::Start() {
  if (options_.tls.enabled()) {
    const TlsConfig tls = options_.tls;
    server_ = std::make_unique<httplib::SSLServer>(
        [tls](SSL_CTX& ctx) { return SetUpTls(tls, ctx); });
    if (!server_->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HTTPS cannot use --tls-cert '", tls.cert_path, "' / --tls-key '", tls.key_path, "'",
          tls.verifies_clients() ? absl::StrCat(" / --tls-client-ca '", tls.client_ca_path, "'")
                                 : ""));
    }
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return Refuse(req, res) ? httplib::Server::HandlerResponse::Handled
                            : httplib::Server::HandlerResponse::Unhandled;
  });
  const size_t max_connections = options_.max_connections;
  server_->new_task_queue = [max_connections] { return new ConnectionPool(max_connections); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_tcp_nodelay(true);  // SSE events are small; do not wait to coalesce them
  Route();
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else if (server_->bind_to_port(options_.host, options_.port)) {
    port_ = options_.port;
  }
  if (port_ <= 0) {
    port_ = -1;
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options_.host, ":", options_.port));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (server_ == nullptr || !thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace winnow::server::http
