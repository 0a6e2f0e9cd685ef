// `winnow generate`: streams a completion of a prompt to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "model/model.h"
#include "nlohmann/json.hpp"
#include "model/sampler.h"
#include "server/cli/args.h"
#include "server/cli/commands.h"
#include "server/cli/local_session.h"

namespace winnow::cli {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "winnow generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(
      argv,
      {"model", "prompt", "system", "max-tokens", "temperature", "top-k", "top-p", "min-p",
       "repetition-penalty", "frequency-penalty", "presence-penalty", "seed", "threads",
       "chunk-size"},
      {"chat", "ignore-eos", "quiet", "json"});
  if (!args.ok()) return Fail(args.status());
  if (!args->Has("prompt")) return Fail(absl::InvalidArgumentError("--prompt is required"));

  model::SamplingParams sampling;
  int64_t max_tokens = 0, threads = 0, chunk_size = 0, top_k = 0, seed = 0;
  double temperature = 0, top_p = 0, min_p = 0, repetition = 0, frequency = 0, presence = 0;
#define WINNOW_FLAG(var, getter)              \
  {                                           \
    auto _v = (getter);                       \
    if (!_v.ok()) return Fail(_v.status());   \
    var = *_v;                                \
  }
  WINNOW_FLAG(max_tokens, args->GetInt("max-tokens", 128));
  WINNOW_FLAG(threads, args->GetInt("threads", 0));
  WINNOW_FLAG(chunk_size, args->GetInt("chunk-size", 512));
  WINNOW_FLAG(top_k, args->GetInt("top-k", 0));
  WINNOW_FLAG(seed, args->GetInt("seed", 0));
  WINNOW_FLAG(temperature, args->GetDouble("temperature", 0.0));
  WINNOW_FLAG(top_p, args->GetDouble("top-p", 1.0));
  WINNOW_FLAG(min_p, args->GetDouble("min-p", 0.0));
  WINNOW_FLAG(repetition, args->GetDouble("repetition-penalty", 1.0));
  WINNOW_FLAG(frequency, args->GetDouble("frequency-penalty", 0.0));
  WINNOW_FLAG(presence, args->GetDouble("presence-penalty", 0.0));
#undef WINNOW_FLAG
  if (max_tokens <= 0) return Fail(absl::InvalidArgumentError("--max-tokens must be > 0"));
  if (chunk_size <= 0) return Fail(absl::InvalidArgumentError("--chunk-size must be > 0"));
  sampling.temperature = static_cast<float>(temperature);
  sampling.top_k = static_cast<int32_t>(top_k);
  sampling.top_p = static_cast<float>(top_p);
  sampling.min_p = static_cast<float>(min_p);
  sampling.repetition_penalty = static_cast<float>(repetition);
  sampling.frequency_penalty = static_cast<float>(frequency);
  sampling.presence_penalty = static_cast<float>(presence);
  sampling.seed = static_cast<uint64_t>(seed);
  if (absl::Status s = sampling.Validate(); !s.ok()) return Fail(s);

  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Load(
      args->GetString("model", DefaultModelPath()), {.num_threads = static_cast<int32_t>(threads)});
  if (!model.ok()) return Fail(model.status());
  const model::Tokenizer& tokenizer = (*model)->tokenizer();

  std::string text = args->GetString("prompt");
  if (args->Has("chat")) {
    if (!(*model)->chat_template().ok()) return Fail((*model)->chat_template().status());
    std::vector<model::ChatMessage> messages;
    if (args->Has("system")) messages.push_back({"system", args->GetString("system")});
    messages.push_back({"user", text});
    absl::StatusOr<std::string> rendered = (*model)->chat_template()->Apply(messages, true);
    if (!rendered.ok()) return Fail(rendered.status());
    text = *rendered;
  }
  const std::vector<int32_t> prompt =
      args->Has("chat") ? model::EncodeRenderedChat(tokenizer, text, /*add_special=*/true)
                        : tokenizer.Encode(text, /*add_special=*/true, /*parse_special=*/true);
  if (prompt.empty()) return Fail(absl::InvalidArgumentError("the prompt has no tokens"));
  const int32_t context = (*model)->config().context_length;
  const int64_t budget = std::min<int64_t>(context, static_cast<int64_t>(prompt.size()) + max_tokens);
  if (static_cast<int64_t>(prompt.size()) >= context) {
    return Fail(absl::InvalidArgumentError("the prompt fills the whole context"));
  }

  absl::StatusOr<std::unique_ptr<LocalSession>> session =
      LocalSession::Create(**model, static_cast<int32_t>(budget));
  if (!session.ok()) return Fail(session.status());
  model::Sampler sampler(sampling);
  sampler.AddPromptTokens(prompt);
  model::StreamingDetokenizer detokenizer(tokenizer);

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<float>> logits =
      (*session)->Feed(prompt, static_cast<int32_t>(chunk_size), model::LogitsMode::kLast);
  if (!logits.ok()) return Fail(logits.status());
  const auto t1 = std::chrono::steady_clock::now();
  // --json prints one object at the end instead of streaming (for scripts and tests).
  const bool json = args->Has("json");
  std::vector<int32_t> generated_ids;
  std::string generated_text;
  auto emit = [&](const std::string& delta) {
    if (json) {
      generated_text += delta;
    } else {
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
  };
  int64_t generated = 0;
  while (generated < max_tokens && (*session)->position() < budget) {
    const model::SampledToken token = sampler.Sample(*logits);
    if (!args->Has("ignore-eos") && tokenizer.IsEndOfGeneration(token.id)) break;
    ++generated;
    generated_ids.push_back(token.id);
    emit(detokenizer.Append(token.id));
    if (generated == max_tokens || (*session)->position() >= budget) break;
    const int32_t id = token.id;
    logits = (*session)->Feed({&id, 1}, 1, model::LogitsMode::kLast);
    if (!logits.ok()) return Fail(logits.status());
  }
  emit(detokenizer.Flush());
  if (json) {
    nlohmann::json out;
    out["prompt_token_ids"] = prompt;
    out["token_ids"] = generated_ids;
    out["text"] = generated_text;
    std::fputs(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(), stdout);
  }
  std::fputc('\n', stdout);
  const auto t2 = std::chrono::steady_clock::now();
  if (!args->Has("quiet")) {
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "[prompt %zu tokens, %.1f tok/s; generated %lld tokens, %.1f tok/s]\n",
                 prompt.size(), prompt.size() / prefill_s, static_cast<long long>(generated),
                 generated / decode_s);
  }
  return 0;
}

}  // namespace winnow::cli
