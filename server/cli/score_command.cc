// `winnow score`: runs a token sequence through the model and prints, as one JSON object, the
// argmax at every position, the log-probability of each next token, and the last logits.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/cli.h"
#include "base/file.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"
#include "server/cli/local_session.h"

namespace winnow::cli {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "winnow score: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<std::vector<int32_t>> ReadTokens(const std::string& path) {
  std::optional<std::string> text = base::ReadWholeFile(path);
  if (!text) return absl::NotFoundError("cannot open --tokens-file " + path);
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_array()) {
    return absl::InvalidArgumentError("--tokens-file must hold a JSON array of token ids");
  }
  std::vector<int32_t> tokens;
  for (const auto& item : json) {
    if (!item.is_number_integer()) {
      return absl::InvalidArgumentError("--tokens-file must hold only integer token ids");
    }
    tokens.push_back(item.get<int32_t>());
  }
  return tokens;
}

}  // namespace

int RunScore(const std::vector<std::string>& args) {
  CLI::App app("Runs token ids through the model; prints the argmax at every position, the "
               "log-probability of each next token and the last logits (JSON).",
               "winnow score");
  CommonFlags common;
  AddCommonFlags(app, &common);
  std::string tokens_file;
  int32_t chunk_size = 0;
  app.add_option("--tokens-file", tokens_file, "JSON array of token ids")->required();
  app.add_option("--chunk-size", chunk_size, "prefill chunk in tokens (default: all at once)")
      ->check(base::AtLeast(1));
  kernels::KvDtype kv_cache_dtype;
  AddKvCacheDtypeFlag(app, &kv_cache_dtype);
  if (std::optional<int> exit = base::ParseCommandLine(app, args)) return *exit;

  absl::StatusOr<std::vector<int32_t>> tokens = ReadTokens(tokens_file);
  if (!tokens.ok()) return Fail(tokens.status());
  if (tokens->empty()) return Fail(absl::InvalidArgumentError("--tokens-file holds no tokens"));
  if (chunk_size == 0) chunk_size = static_cast<int32_t>(tokens->size());

  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Load(common.model, common.chat_template, common.CpuWeights());
  if (!model.ok()) return Fail(model.status());
  const int32_t vocab = (*model)->config().vocab_size;
  for (int32_t id : *tokens) {
    if (id < 0 || id >= vocab) {
      return Fail(absl::InvalidArgumentError("token id " + std::to_string(id) +
                                             " is outside the vocabulary"));
    }
  }
  if (static_cast<int64_t>(tokens->size()) > (*model)->config().context_length) {
    return Fail(absl::InvalidArgumentError("more tokens than the context length"));
  }
  absl::StatusOr<std::unique_ptr<LocalSession>> session =
      LocalSession::Create(**model, common.Worker(), static_cast<int32_t>(tokens->size()),
                           kv_cache_dtype);
  if (!session.ok()) return Fail(session.status());
  absl::StatusOr<std::vector<float>> logits =
      (*session)->Feed(*tokens, chunk_size);
  if (!logits.ok()) return Fail(logits.status());

  const size_t n = tokens->size();
  std::vector<int32_t> argmax(n);
  std::vector<double> logprob_next;
  for (size_t i = 0; i < n; ++i) {
    const float* row = logits->data() + i * vocab;
    int32_t best = 0;
    double max_v = row[0];
    for (int32_t j = 1; j < vocab; ++j) {
      if (row[j] > max_v) {
        max_v = row[j];
        best = j;
      }
    }
    argmax[i] = best;
    if (i + 1 < n) {
      double sum = 0.0;
      for (int32_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - max_v);
      logprob_next.push_back(row[(*tokens)[i + 1]] - max_v - std::log(sum));
    }
  }
  const float* last = logits->data() + (n - 1) * vocab;
  nlohmann::json out;
  out["argmax"] = argmax;
  out["logprob_next"] = logprob_next;
  out["last_logits"] = std::vector<float>(last, last + vocab);
  std::string dumped = out.dump();
  std::fwrite(dumped.data(), 1, dumped.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace winnow::cli
