// `winnow generate`: streams a completion of a prompt to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/cli.h"
#include "model/model.h"
#include "model/sampler.h"
#include "nlohmann/json.hpp"
#include "server/cli/commands.h"
#include "server/cli/local_session.h"

namespace winnow::cli {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "winnow generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

struct GenerateFlags {
  CommonFlags common;
  std::string prompt;
  std::string system;
  bool chat = false;
  int32_t max_tokens = 128;
  int32_t chunk_size = 512;
  model::SamplingParams sampling;
  bool ignore_eos = false;
  bool quiet = false;
  bool json = false;
};

void AddGenerateFlags(CLI::App& app, GenerateFlags* f) {
  AddCommonFlags(app, &f->common);
  app.add_option("--prompt", f->prompt, "the prompt (raw text, or the user message with --chat)")
      ->required();
  app.add_flag("--chat", f->chat, "render the prompt with the model's chat template");
  app.add_option("--system", f->system, "--chat: a system message before the prompt");
  app.add_option("--max-tokens", f->max_tokens, "tokens to generate at most")
      ->check(base::AtLeast(1));
  model::SamplingParams& s = f->sampling;
  app.add_option("--temperature", s.temperature, "0: greedy")->check(base::AtLeast(0));
  app.add_option("--top-k", s.top_k, "0: off")->check(base::AtLeast(0));
  app.add_option("--top-p", s.top_p, "nucleus sampling; 1: off")->check(base::AboveAtMost(0, 1));
  app.add_option("--min-p", s.min_p, "0: off")->check(base::InRange(0, 1));
  app.add_option("--repetition-penalty", s.repetition_penalty, "1: off")->check(base::Above(0));
  app.add_option("--frequency-penalty", s.frequency_penalty, "")->check(base::InRange(-2, 2));
  app.add_option("--presence-penalty", s.presence_penalty, "")->check(base::InRange(-2, 2));
  app.add_option("--seed", s.seed, "sampling seed");
  app.add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-generation tokens");
  app.add_option("--chunk-size", f->chunk_size, "prefill chunk in tokens")
      ->check(base::AtLeast(1));
  app.add_flag("--json", f->json,
               "print {prompt_token_ids, token_ids, text} at the end instead of streaming");
  app.add_flag("--quiet", f->quiet, "no statistics line on stderr");
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  CLI::App app("Streams a completion of a prompt to stdout.", "winnow generate");
  GenerateFlags f;
  AddGenerateFlags(app, &f);
  if (std::optional<int> exit = base::ParseCommandLine(app, args)) return *exit;
  model::SamplingParams sampling = f.sampling;
  if (absl::Status s = sampling.Validate(); !s.ok()) return Fail(s);
  const int64_t max_tokens = f.max_tokens;
  const int64_t chunk_size = f.chunk_size;

  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Load(f.common.model, {.num_threads = f.common.threads});
  if (!model.ok()) return Fail(model.status());
  const model::Tokenizer& tokenizer = (*model)->tokenizer();

  std::string text = f.prompt;
  if (f.chat) {
    if (!(*model)->chat_template().ok()) return Fail((*model)->chat_template().status());
    std::vector<model::ChatMessage> messages;
    if (!f.system.empty()) messages.push_back({"system", f.system});
    messages.push_back({"user", text});
    absl::StatusOr<std::string> rendered = (*model)->chat_template()->Apply(messages, true);
    if (!rendered.ok()) return Fail(rendered.status());
    text = *rendered;
  }
  const std::vector<int32_t> prompt =
      f.chat ? model::EncodeRenderedChat(tokenizer, text, /*add_special=*/true)
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
  const bool json = f.json;
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
    if (!f.ignore_eos && tokenizer.IsEndOfGeneration(token.id)) break;
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
  if (!f.quiet) {
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "[prompt %zu tokens, %.1f tok/s; generated %lld tokens, %.1f tok/s]\n",
                 prompt.size(), prompt.size() / prefill_s, static_cast<long long>(generated),
                 generated / decode_s);
  }
  return 0;
}

}  // namespace winnow::cli
