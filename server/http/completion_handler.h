// POST /v1/completions and /v1/chat/completions: parse the OpenAI body into a
// v1::GenerateRequest, validate and build it with server/request_builder (the gRPC path's
// checks, errors renamed to the OpenAI fields), submit it to the engine, then answer with one
// JSON body or a server-sent-event stream.
//
// A streaming client that goes away is noticed at the next write (a token, or a keep-alive
// comment after a second of silence) and its request is cancelled in the engine, which frees
// its KV blocks within one iteration.
#pragma once

#include <string>

#include "httplib.h"
#include "server/http/openai_request.h"
#include "server/inference_service.h"

namespace winnow::server::http {

void HandleGeneration(Endpoint endpoint, const std::string& model_name, ServingState* state,
                      const httplib::Request& req, httplib::Response& res);

}  // namespace winnow::server::http
