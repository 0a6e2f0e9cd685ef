// gRPC request bytes -> v1::GenerateRequest::ParseFromString -> BuildGenerationRequest
// (server/request_builder.cc: every validation, prompt tokenization, chat rendering, segment
// flattening, compression-policy construction), as the daemon does before the engine sees a
// request; no engine runs. Needs the default model (WINNOW_FUZZ_MODEL or WINNOW_TEST_MODEL) for
// its tokenizer, template and dimensions; without it every input is skipped.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "model/model.h"
#include "server/request_builder.h"
#include "winnow/v1/inference.pb.h"

namespace {
winnow::model::Model* model = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field with invalid UTF-8 it refuses; on fuzzed bytes that is
  // most inputs (the refusal itself is what the daemon sees: a parse failure).
  google::protobuf::SetLogHandler(nullptr);
  const std::string path = winnow::fuzz::ModelPath();
  if (path.empty()) {
    std::fprintf(stderr, "request_fuzz: no WINNOW_FUZZ_MODEL; every input is skipped\n");
    return 0;
  }
  auto loaded = winnow::model::Model::Load(path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "request_fuzz: %s\n", loaded.status().ToString().c_str());
    return 0;
  }
  model = loaded->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  winnow::v1::GenerateRequest request;
  if (model == nullptr || !request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // The daemon's limits for the default flags (--max-tokens-limit 4096, prompts up to the
  // context), and a tight set, so that both sides of each limit are reachable.
  winnow::server::RequestLimits limits;
  limits.context_length = model->config().context_length;
  limits.max_tokens_limit = 4096;
  (void)winnow::server::BuildGenerationRequest(request, *model, limits);
  limits.max_prompt_tokens = 16;
  limits.max_tokens_limit = 8;
  limits.default_max_tokens = 8;
  (void)winnow::server::BuildGenerationRequest(request, *model, limits);
  return 0;
}
