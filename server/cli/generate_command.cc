// `winnow generate`: streams a completion of a prompt to stdout. It runs the daemon's engine
// (scheduler::Engine) on a pool sized for this one request, and builds the request as the daemon
// does (server::BuildGenerationRequest from a winnow.v1.GenerateRequest), so there is one
// generation loop and one place that validates requests.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "model/model.h"
#include "model/sampler.h"
#include "nlohmann/json.hpp"
#include "scheduler/engine.h"
#include "server/cli/commands.h"
#include "server/request_builder.h"
#include "winnow/v1/inference.pb.h"

namespace winnow::cli {
namespace {

using Clock = std::chrono::steady_clock;

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
  kernels::KvDtype kv_cache_dtype = kernels::KvDtype::kF16;
  std::string device;  // empty: scheduler::DefaultDevice()
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
  AddKvCacheDtypeFlag(app, &f->kv_cache_dtype);
  app.add_option("--device", f->device,
                 "cpu, cuda or cuda:N (default: cuda:0 when a GPU is visible, else cpu)");
  app.add_flag("--json", f->json,
               "print {prompt_token_ids, token_ids, text} at the end instead of streaming");
  app.add_flag("--quiet", f->quiet, "no statistics line on stderr");
}

// The request the daemon would get for these flags. max_tokens is left unset and passed as the
// builder's default instead, which it caps by the context left after the prompt: --max-tokens
// means "at most", as it always has, rather than an error for a long prompt.
v1::GenerateRequest ToProto(const GenerateFlags& f) {
  v1::GenerateRequest request;
  if (f.chat) {
    v1::ChatMessages* chat = request.mutable_chat();
    if (!f.system.empty()) {
      v1::ChatMessage* system = chat->add_messages();
      system->set_role("system");
      system->set_content(f.system);
    }
    v1::ChatMessage* user = chat->add_messages();
    user->set_role("user");
    user->set_content(f.prompt);
  } else {
    request.set_prompt(f.prompt);
  }
  const model::SamplingParams& s = f.sampling;
  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_temperature(s.temperature);
  sampling->set_top_k(s.top_k);
  sampling->set_top_p(s.top_p);
  sampling->set_min_p(s.min_p);
  sampling->set_repetition_penalty(s.repetition_penalty);
  sampling->set_frequency_penalty(s.frequency_penalty);
  sampling->set_presence_penalty(s.presence_penalty);
  sampling->set_seed(s.seed);
  request.mutable_stopping()->set_ignore_eos(f.ignore_eos);
  return request;
}

// A pool for exactly this request (prompt + max_tokens slots in every layer), and one prefill
// chunk of --chunk-size tokens per iteration.
scheduler::EngineOptions EngineOptionsFor(const model::Model& model,
                                          const scheduler::GenerationRequest& request,
                                          const GenerateFlags& f,
                                          const scheduler::Device& device) {
  scheduler::EngineOptions options;
  options.worker = f.common.Worker();
  const int32_t chunk_size = f.chunk_size;
  const kernels::KvDtype kv_cache_dtype = f.kv_cache_dtype;
  options.kv_cache_dtype = kv_cache_dtype;
  options.device = device;
  options.max_batched_tokens = chunk_size;
  options.max_seqs = 1;
  options.max_queue = 1;
  const int64_t tokens = static_cast<int64_t>(request.prompt_tokens.size()) + request.max_tokens;
  const int64_t blocks_per_layer = (tokens + options.block_size - 1) / options.block_size;
  options.kv_blocks = static_cast<int32_t>(model.config().num_layers * blocks_per_layer);
  return options;
}

// The request's stream, from the engine thread to the main thread. The callbacks only append
// under the lock and return: writing to stdout (maybe a slow pipe) is the main thread's job.
class StreamSink : public scheduler::RequestSink {
 public:
  struct Batch {
    std::vector<int32_t> token_ids;
    std::string text;
    std::optional<scheduler::FinishEvent> finish;  // set once, with the last batch
  };

  void OnTokens(const scheduler::TokenEvent& event) override {
    base::MutexLock lock(&mu_);
    if (!first_token_) first_token_ = Clock::now();
    pending_.token_ids.insert(pending_.token_ids.end(), event.token_ids.begin(),
                              event.token_ids.end());
    pending_.text += event.text;
  }
  void OnFinish(const scheduler::FinishEvent& event) override {
    base::MutexLock lock(&mu_);
    finished_at_ = Clock::now();
    pending_.finish = event;
  }

  // Blocks until something arrived; takes it.
  Batch Next() {
    base::MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return HasPending(); });
    return std::exchange(pending_, Batch{});
  }
  // When the first token and the finish arrived (valid after the finish was taken).
  std::optional<Clock::time_point> first_token() {
    base::MutexLock lock(&mu_);
    return first_token_;
  }
  Clock::time_point finished_at() {
    base::MutexLock lock(&mu_);
    return finished_at_;
  }

 private:
  bool HasPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.token_ids.empty() || !pending_.text.empty() || pending_.finish.has_value();
  }

  base::Mutex mu_;
  Batch pending_ ABSL_GUARDED_BY(mu_);
  std::optional<Clock::time_point> first_token_ ABSL_GUARDED_BY(mu_);
  Clock::time_point finished_at_ ABSL_GUARDED_BY(mu_);
};

struct Output {
  std::vector<int32_t> token_ids;  // without a final end-of-generation token
  std::string text;
  int32_t steps = 0;               // tokens sampled, the end-of-generation one included
};

// Streams text to stdout (or collects it for --json) until the request finishes.
absl::StatusOr<Output> Drain(StreamSink& sink, const model::Tokenizer& tokenizer,
                             const GenerateFlags& f) {
  Output out;
  for (;;) {
    StreamSink::Batch batch = sink.Next();
    for (int32_t id : batch.token_ids) {
      ++out.steps;
      // The engine reports the end-of-generation token that stopped it; the CLI never printed
      // it (it renders no text either).
      if (!f.ignore_eos && tokenizer.IsEndOfGeneration(id)) continue;
      out.token_ids.push_back(id);
    }
    if (f.json) {
      out.text += batch.text;
    } else if (!batch.text.empty()) {
      std::fwrite(batch.text.data(), 1, batch.text.size(), stdout);
      std::fflush(stdout);
    }
    if (batch.finish) {
      if (!batch.finish->status.ok()) return batch.finish->status;
      return out;
    }
  }
}

void PrintStats(StreamSink& sink, Clock::time_point submitted, size_t prompt_tokens,
                const Output& out) {
  const Clock::time_point first = sink.first_token().value_or(sink.finished_at());
  const double prefill_s = std::chrono::duration<double>(first - submitted).count();
  const double decode_s = std::chrono::duration<double>(sink.finished_at() - first).count();
  // Every step after the first token is one decode forward.
  const double decode_rate = decode_s > 0 ? (out.steps - 1) / decode_s : 0.0;
  std::fprintf(stderr, "[prompt %zu tokens, %.1f tok/s; generated %zu tokens, %.1f tok/s]\n",
               prompt_tokens, prompt_tokens / prefill_s, out.token_ids.size(), decode_rate);
}

// --device (or the default) and the KV dtype that goes with it; errors name the flag.
absl::Status ResolveDevice(bool kv_cache_dtype_given, GenerateFlags* f,
                           scheduler::Device* device) {
  if (f->device.empty()) {
    *device = scheduler::DefaultDevice();
  } else {
    absl::StatusOr<scheduler::Device> parsed = scheduler::ParseDevice(f->device);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--device ", parsed.status().message()));
    }
    *device = *parsed;
    if (absl::Status built = scheduler::CheckBuiltFor(*device); !built.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--device ", built.message()));
    }
  }
  absl::StatusOr<kernels::KvDtype> dtype = scheduler::KvDtypeFor(
      *device, kv_cache_dtype_given ? std::optional(f->kv_cache_dtype) : std::nullopt);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype ", dtype.status().message()));
  }
  f->kv_cache_dtype = *dtype;
  return absl::OkStatus();
}

absl::Status Generate(const GenerateFlags& f, const scheduler::Device& device) {
  // The CUDA forward uploads the weights to bf16 as stored: --cpu-weight-type is the CPU's.
  WINNOW_ASSIGN_OR_RETURN(
      std::unique_ptr<model::Model> model,
      model::Model::Load(f.common.model, f.common.chat_template,
                         device.is_cuda() ? model::CpuWeightOptions{} : f.common.CpuWeights()));
  server::RequestLimits limits;
  limits.context_length = model->config().context_length;
  limits.default_max_tokens = f.max_tokens;
  WINNOW_ASSIGN_OR_RETURN(scheduler::GenerationRequest request,
                          server::BuildGenerationRequest(ToProto(f), *model, limits));
  const std::vector<int32_t> prompt = request.prompt_tokens;
  WINNOW_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Engine> engine,
      scheduler::Engine::Create(
          model.get(),
          EngineOptionsFor(*model, request, f, device)));

  auto sink = std::make_shared<StreamSink>();
  const Clock::time_point submitted = Clock::now();
  WINNOW_RETURN_IF_ERROR(engine->Submit(std::move(request), sink).status());
  WINNOW_ASSIGN_OR_RETURN(Output out, Drain(*sink, model->tokenizer(), f));
  engine->Shutdown();

  // --json prints one object at the end instead of streaming (for scripts and tests).
  if (f.json) {
    nlohmann::json json;
    json["prompt_token_ids"] = prompt;
    json["token_ids"] = out.token_ids;
    json["text"] = out.text;
    std::fputs(json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(),
               stdout);
  }
  std::fputc('\n', stdout);
  if (!f.quiet) PrintStats(*sink, submitted, prompt.size(), out);
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  CLI::App app("Streams a completion of a prompt to stdout.", "winnow generate");
  GenerateFlags f;
  AddGenerateFlags(app, &f);
  if (std::optional<int> exit = base::ParseCommandLine(app, args)) return *exit;
  scheduler::Device device;
  if (absl::Status s = ResolveDevice(app.count("--kv-cache-dtype") > 0, &f, &device); !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = Generate(f, device); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace winnow::cli
