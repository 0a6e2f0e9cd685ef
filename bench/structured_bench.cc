// What structured output costs: compiling a schema, and the token masks per decode step.
//
//   structured_bench --model=PATH [--device=cpu|cuda] [--batches=1,32] [--max_tokens=96]
//                    [--threads=N]
//
// Part 1: compile time of a typical tool schema (a function's parameters: nested object, enum,
// bounded numbers, an array), the fastest of --reps compiles.
// Part 2: the engine decodes --batches requests at once (a chat prompt asking for the tool's
// arguments, temperature 1, one seed each), first without a grammar (ignore_eos, --max_tokens
// steps: the unconstrained decode step, forward + sampling), then with the schema. The
// constrained outputs are then replayed step by step to time what the grammar adds per step at
// that batch: the masks, the masked choice over the plain one, taking each token; once with
// cold masks (a schema never seen) and once warm (the same schema again). Prints tables;
// never asserts on time.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/cli.h"
#include "bench/bench_util.h"
#include "model/model.h"
#include "scheduler/device.h"
#include "scheduler/engine.h"
#include "structured/grammar.h"
#include "structured/grammar_cache.h"

namespace winnow {
namespace {

struct Options {
  std::string model;
  std::string device = "cpu";
  std::vector<int> batches = {1, 32};
  int max_tokens = 96;
  int threads = 0;
  int reps = 50;
};

// A tool's parameters as agents declare them (OpenAI's function-calling shape).
constexpr char kToolSchema[] = R"({
  "type": "object",
  "properties": {
    "location": {"type": "string", "maxLength": 40, "description": "City and country"},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "include": {"type": "array", "maxItems": 4,
                "items": {"enum": ["wind", "humidity", "uv", "pressure"]}},
    "when": {"type": "object", "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "local": {"type": "boolean"}}, "required": ["hour"]}
  },
  "required": ["location", "unit", "days"],
  "additionalProperties": false
})";

void CompileTime(int reps) {
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    const double t0 = bench::Now(false);
    auto grammar = structured::Grammar::FromJsonSchema(kToolSchema);
    const double t1 = bench::Now(false);
    if (!grammar.ok()) {
      std::fprintf(stderr, "compile: %s\n", std::string(grammar.status().message()).c_str());
      return;
    }
    best = std::min(best, t1 - t0);
  }
  std::printf("compile (tool schema, %zu bytes): %.1f us (fastest of %d)\n\n",
              sizeof(kToolSchema) - 1, best * 1e6, reps);
}

class StepTimes : public scheduler::EngineObserver {
 public:
  void OnIteration(const scheduler::IterationStats& stats) override {
    if (stats.prefill_tokens > 0 || stats.decode_tokens == 0) return;
    ++steps;
    step += absl::ToDoubleSeconds(stats.forward_time + stats.sampling_time);
  }
  int steps = 0;
  double step = 0;  // forward + sampling, summed over decode-only iterations
};

class Collect : public scheduler::RequestSink {
 public:
  void OnTokens(const scheduler::TokenEvent& e) override {
    tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
  }
  void OnFinish(const scheduler::FinishEvent&) override { done = true; }
  std::vector<int32_t> tokens;
  std::atomic<bool> done{false};
};

std::vector<int32_t> ChatPrompt(const model::Model& m, const std::string& user) {
  const auto rendered = m.chat_template()->Apply({{"user", user}}, true);
  return model::EncodeRenderedChat(m.tokenizer(), *rendered, true);
}

// Decodes `batch` requests at once (temperature 1, a seed each); returns each one's tokens and
// the engine's decode-step times.
std::vector<std::vector<int32_t>> RunBatch(model::Model* m, const Options& opt, int batch,
                                           std::shared_ptr<const structured::CompiledGrammar> g,
                                           StepTimes* times) {
  scheduler::EngineOptions options;
  options.kv_cache_bytes = int64_t{256} << 20;
  if (opt.threads > 0) options.worker.num_threads = opt.threads;
  absl::StatusOr<scheduler::Device> device = scheduler::ParseDevice(opt.device);
  if (!device.ok()) {
    std::fprintf(stderr, "--device: %s\n", std::string(device.status().message()).c_str());
    return {};
  }
  options.device = *device;
  absl::StatusOr<kernels::KvDtype> dtype = scheduler::KvDtypeFor(*device, std::nullopt);
  if (dtype.ok()) options.kv_cache_dtype = *dtype;
  auto engine = scheduler::Engine::Create(m, options, times);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return {};
  }
  const std::vector<int32_t> prompt = ChatPrompt(
      *m, "Call the weather tool for a city: give its arguments as JSON.");
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < batch; ++i) {
    scheduler::GenerationRequest r;
    r.prompt_tokens = prompt;
    r.max_tokens = opt.max_tokens;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1000 + i;
    r.grammar = g;
    r.ignore_eos = g == nullptr;  // a fixed step count without a grammar to end the output
    sinks.push_back(std::make_shared<Collect>());
    if (!(*engine)->Submit(std::move(r), sinks.back()).ok()) return {};
  }
  std::vector<std::vector<int32_t>> outputs;
  for (auto& s : sinks) {
    while (!s->done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    outputs.push_back(s->tokens);
  }
  (*engine)->Shutdown();
  return outputs;
}

// What a grammar adds to a decode step of the batch: replays the outputs step by step, all
// sequences of a step in turn (one thread; the engine spreads them over its threads), timing
// the mask (cache lookup, or the trie walk on a miss), the masked greedy choice minus the plain
// one, and taking the token. Returns ms per step, averaged over steps.
double ReplayMasks(const std::vector<std::vector<int32_t>>& outputs,
                   std::shared_ptr<const structured::CompiledGrammar> grammar,
                   std::shared_ptr<const structured::TokenVocabulary> vocab,
                   const std::vector<float>& logits) {
  std::vector<structured::Constraint> constraints;
  for (size_t i = 0; i < outputs.size(); ++i) constraints.emplace_back(grammar, vocab);
  model::Sampler sampler{model::SamplingParams{}};
  double total = 0;
  size_t steps = 0;
  for (size_t step = 0;; ++step) {
    bool any = false;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (step >= outputs[i].size()) continue;
      any = true;
      const double t0 = bench::Now(false);
      const structured::TokenMask& mask = constraints[i].Allowed();
      (void)sampler.Sample(logits, 0.0f, mask);
      const double t1 = bench::Now(false);
      (void)sampler.Sample(logits, 0.0f);
      const double t2 = bench::Now(false);
      if (!constraints[i].Accept(outputs[i][step]).ok()) return -1;
      total += (t1 - t0) - (t2 - t1) + (bench::Now(false) - t2);
    }
    if (!any) break;
    ++steps;
  }
  return steps > 0 ? total / steps * 1e3 : 0;
}

int Run(const Options& opt) {
  auto loaded = model::Model::Load(opt.model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  model::Model* m = loaded->get();
  CompileTime(opt.reps);
  const model::Tokenizer& tok = m->tokenizer();
  const auto vocab = std::make_shared<const structured::TokenVocabulary>(
      tok.Pieces(/*render_special=*/false), tok.end_of_generation_ids());
  std::vector<float> logits(tok.vocab_size());
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 1000);

  std::printf("%6s %14s %14s %14s %12s %12s\n", "batch", "step ms (free)", "mask ms cold",
              "mask ms warm", "cold / step", "warm / step");
  for (const int batch : opt.batches) {
    StepTimes free;
    RunBatch(m, opt, batch, nullptr, &free);
    if (free.steps == 0) {
      std::fprintf(stderr, "structured_bench: no decode step ran at batch %d\n", batch);
      return 1;
    }
    StepTimes constrained;
    const auto outputs = RunBatch(m, opt, batch, *structured::CompileJsonSchema(kToolSchema),
                                  &constrained);
    // A schema text of its own: cold masks, as for a schema never seen before.
    const auto fresh = *structured::CompileJsonSchema(
        absl::StrCat(kToolSchema, std::string(batch, ' ')));
    const double cold = ReplayMasks(outputs, fresh, vocab, logits);
    const double warm = ReplayMasks(outputs, fresh, vocab, logits);
    const double step = free.steps > 0 ? free.step / free.steps * 1e3 : 0;
    std::printf("%6d %14.2f %14.3f %14.3f %11.1f%% %11.1f%%\n", batch, step, cold, warm,
                100 * cold / step, 100 * warm / step);
  }
  return 0;
}

std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("Structured output's cost: schema compile time and token masks per decode step.",
               "structured_bench");
  base::ConfigureApp(app);
  app.add_option("--model", opt->model, "GGUF model")->required();
  app.add_option("--device", opt->device, "cpu, cuda or cuda:N (masks are on the host either way)");
  app.add_option("--batches", opt->batches, "requests decoded at once, comma-separated")
      ->delimiter(',');
  app.add_option("--max_tokens", opt->max_tokens, "tokens per request")->check(base::AtLeast(1));
  app.add_option("--threads", opt->threads, "worker threads (0: one per hardware thread)");
  app.add_option("--reps", opt->reps, "compiles timed")->check(base::AtLeast(1));
  return base::ParseCommandLine(app, argc, argv);
}

}  // namespace
}  // namespace winnow

int main(int argc, char** argv) {
  winnow::Options opt;
  if (std::optional<int> exit = winnow::ParseOptions(argc, argv, &opt)) return *exit;
  return winnow::Run(opt);
}
