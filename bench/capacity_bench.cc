// Capacity of the engine with and without KV compression, in process, on synthetic weights of a
// real shape (bench/synthetic_gguf.h), so that it runs from a bare checkout on any GPU machine
// (docs/benchmarks.md, "GPU: capacity"):
//
//   capacity_bench [--shape=llama3-8b|smollm2-135m] [--gguf=PATH] [--device=cuda|cpu]
//                  [--prompt_tokens=4096] [--output_tokens=128] [--requests=32] [--fit=4]
//                  [--gpu-memory-utilization=F] [--budget=0.1]
//                  [--policies=none,snapkv,winnowkv,winnowkv_docs+lookahead=16]
//
// One engine whose KV pool holds exactly --fit requests uncompressed (prompt + output, every
// layer), or, with --gpu-memory-utilization, what the engine sizes from the GPU's memory as the
// daemon does (a realistic pool; --requests 0 then submits three times what it holds
// uncompressed). For each policy in turn the same burst of --requests requests (distinct random
// prompts, greedy, --output_tokens with ignore_eos) is submitted at once, and the engine is
// polled every millisecond: the most requests running at once (admitted, holding KV), the
// time-weighted mean while any was in flight, the engine thread's seconds in forwards and in
// the compression hooks, output tokens per second over the burst's wall time, the time to each
// request's first token from the burst's start (p50, p99), blocks freed by compression,
// preemptions; first (unless --no-ceiling) the zero-overhead ceiling (Ceiling below) and each
// policy's throughput as a fraction of it. Prefix caching is off so that no run reuses
// another's prompts. The synthetic weights make the tokens meaningless, which capacity does not
// care about: every request runs the same number of steps. Prints a table; never asserts on
// time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/cli.h"
#include "bench/bench_util.h"
#include "bench/synthetic_gguf.h"
#include "model/model.h"
#include "scheduler/device.h"
#include "scheduler/engine.h"
#include "scheduler/engine_observer.h"

namespace winnow {
namespace {

struct Options {
  std::string shape = "llama3-8b";
  std::string gguf;
  std::string device = "cuda";
  int32_t prompt_tokens = 4096;
  int32_t output_tokens = 128;
  int32_t requests = 32;
  int32_t fit = 4;
  std::vector<std::string> policies = {"none", "snapkv", "winnowkv"};
  double budget = 0.1;
  int32_t max_batched_tokens = 8192;
  int32_t max_seqs = 128;
  double gpu_memory_utilization = 0;  // > 0: the pool from the GPU's memory, not --fit
  bool ceiling = true;
};

void Check(const absl::Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "capacity_bench: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// Where the engine thread's time goes: the forwards (GPU work and its waits) and the compression
// hooks after them (scoring, the policies' decisions, compaction). Runs on the engine thread.
class TimeObserver : public scheduler::EngineObserver {
 public:
  void OnIteration(const scheduler::IterationStats& stats) override {
    forward_ns += absl::ToInt64Nanoseconds(stats.forward_time);
    compression_ns += absl::ToInt64Nanoseconds(stats.compression_time);
    scoring_ns += absl::ToInt64Nanoseconds(stats.compression_phases.scoring);
    planning_ns += absl::ToInt64Nanoseconds(stats.compression_phases.planning);
    compaction_ns += absl::ToInt64Nanoseconds(stats.compression_phases.compaction);
  }
  std::atomic<int64_t> forward_ns{0};
  std::atomic<int64_t> compression_ns{0};
  std::atomic<int64_t> scoring_ns{0};
  std::atomic<int64_t> planning_ns{0};
  std::atomic<int64_t> compaction_ns{0};
};

// Counts what one burst's requests return and when the first token came; runs on the engine
// thread.
class BurstSink : public scheduler::RequestSink {
 public:
  explicit BurstSink(std::atomic<int>* finished) : finished_(finished) {}
  void OnTokens(const scheduler::TokenEvent& event) override {
    if (tokens == 0 && !event.token_ids.empty()) first_token_at = bench::Now(false);
    tokens += static_cast<int64_t>(event.token_ids.size());
  }
  void OnFinish(const scheduler::FinishEvent& event) override {
    usage = event.usage;
    status = event.status;
    finished_->fetch_add(1);
  }

  int64_t tokens = 0;
  double first_token_at = 0;  // bench::Now(false), when tokens > 0
  scheduler::Usage usage;
  absl::Status status;

 private:
  std::atomic<int>* finished_;
};

struct BurstResult {
  int32_t peak_running = 0;
  double mean_running = 0;
  double seconds = 0;
  double forward_seconds = 0;
  double compression_seconds = 0;
  double scoring_seconds = 0;     // the compression seconds' split (cache/compression_times.h)
  double planning_seconds = 0;
  double compaction_seconds = 0;
  int64_t output_tokens = 0;
  int64_t blocks_freed = 0;
  int64_t preemptions = 0;
  int32_t failed = 0;
  double ttft_p50 = 0;  // seconds from the burst's start to a request's first token
  double ttft_p99 = 0;
};

// The nearest-rank percentile q (0-1] of `values` (sorted here); 0 when empty.
double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

BurstResult RunBurst(scheduler::Engine& engine, TimeObserver& times,
                     const std::vector<std::vector<int32_t>>& prompts, const Options& opt,
                     const std::string& policy) {
  std::atomic<int> finished{0};
  const int64_t forward_before = times.forward_ns, compression_before = times.compression_ns;
  const int64_t scoring_before = times.scoring_ns, planning_before = times.planning_ns,
                compaction_before = times.compaction_ns;
  std::vector<std::shared_ptr<BurstSink>> sinks;
  const int64_t preemptions_before = engine.Snapshot().preemptions_total;
  const double t0 = bench::Now(false);
  for (const std::vector<int32_t>& prompt : prompts) {
    scheduler::GenerationRequest r;
    r.prompt_tokens = prompt;
    r.max_tokens = opt.output_tokens;
    r.ignore_eos = true;
    if (policy != "none") {
      const absl::StatusOr<bench::PolicyEntry> entry = bench::ParsePolicyEntry(policy);
      Check(entry.status(), "--policies");
      r.compression.policy = entry->name;
      r.compression.budget = opt.budget;
      r.compression.params = entry->params;
    }
    sinks.push_back(std::make_shared<BurstSink>(&finished));
    Check(engine.Submit(std::move(r), sinks.back()).status(), "Submit");
  }
  BurstResult result;
  double running_time = 0, last = t0;
  int32_t running = 0;
  while (finished.load() < static_cast<int>(prompts.size())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double now = bench::Now(false);
    running_time += running * (now - last);
    last = now;
    running = engine.Snapshot().running;
    result.peak_running = std::max(result.peak_running, running);
  }
  result.seconds = bench::Now(false) - t0;
  result.mean_running = running_time / result.seconds;
  result.preemptions = engine.Snapshot().preemptions_total - preemptions_before;
  result.forward_seconds = 1e-9 * static_cast<double>(times.forward_ns - forward_before);
  result.compression_seconds =
      1e-9 * static_cast<double>(times.compression_ns - compression_before);
  result.scoring_seconds = 1e-9 * static_cast<double>(times.scoring_ns - scoring_before);
  result.planning_seconds = 1e-9 * static_cast<double>(times.planning_ns - planning_before);
  result.compaction_seconds =
      1e-9 * static_cast<double>(times.compaction_ns - compaction_before);
  std::vector<double> ttft;
  for (const std::shared_ptr<BurstSink>& s : sinks) {
    if (s->tokens > 0) ttft.push_back(s->first_token_at - t0);
    result.output_tokens += s->tokens;
    result.blocks_freed += s->usage.kv_blocks_freed_by_compression;
    if (!s->status.ok()) {
      if (result.failed++ == 0) {
        std::fprintf(stderr, "  %s failed: %s\n", policy.c_str(), s->status.ToString().c_str());
      }
    }
  }
  result.ttft_p50 = Percentile(ttft, 0.5);
  result.ttft_p99 = Percentile(ttft, 0.99);
  return result;
}

// What a compressing burst would take with compression free and everything that fits at once
// running at once: the burst's prefill alone, plus the decode of the same number of requests
// whose prompts are already the compressed length. Each term is engine forward seconds from a
// probe burst without compression:
//   prefill = F(prompts, 1 output token)
//   decode  = F(prompts cut to round(budget x prompt_tokens), output_tokens)
//             - F(the same cut prompts, 1 output token)
// (docs/benchmarks.md, "The ceiling").
struct Ceiling {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double seconds() const { return prefill_seconds + decode_seconds; }
};

Ceiling MeasureCeiling(scheduler::Engine& engine, TimeObserver& times,
                       const std::vector<std::vector<int32_t>>& prompts, const Options& opt) {
  Options first_token = opt;
  first_token.output_tokens = 1;
  const int32_t kept = std::max<int32_t>(
      1, static_cast<int32_t>(std::lround(opt.budget * opt.prompt_tokens)));
  std::vector<std::vector<int32_t>> cut;
  for (const std::vector<int32_t>& p : prompts) cut.emplace_back(p.begin(), p.begin() + kept);
  Ceiling c;
  c.prefill_seconds = RunBurst(engine, times, prompts, first_token, "none").forward_seconds;
  const double cut_prefill = RunBurst(engine, times, cut, first_token, "none").forward_seconds;
  c.decode_seconds =
      std::max(0.0, RunBurst(engine, times, cut, opt, "none").forward_seconds - cut_prefill);
  return c;
}

// One row of the table: the burst's numbers, its rate against none's and the ceiling's (0: not
// measured).
void PrintRow(const std::string& policy, const BurstResult& r, double none_rate,
              double ceiling_rate) {
  const double rate = r.output_tokens / r.seconds;
  char ratio[16] = "-", of_ceiling[16] = "-";
  if (none_rate > 0) std::snprintf(ratio, sizeof(ratio), "%.2fx", rate / none_rate);
  if (ceiling_rate > 0) std::snprintf(of_ceiling, sizeof(of_ceiling), "%.2f", rate / ceiling_rate);
  std::printf("| %s | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %s | %s | "
              "%.2f | %.2f | %lld | %lld | %d |\n",
              policy.c_str(), r.peak_running, r.mean_running, r.seconds, r.forward_seconds,
              r.compression_seconds, r.scoring_seconds, r.planning_seconds, r.compaction_seconds,
              rate, ratio, of_ceiling, r.ttft_p50, r.ttft_p99,
              static_cast<long long>(r.blocks_freed), static_cast<long long>(r.preemptions),
              r.failed);
  std::fflush(stdout);
}

int Run(Options opt) {
  bench::SyntheticShape shape;
  Check(bench::ShapeByName(opt.shape, &shape), "--shape");
  absl::StatusOr<scheduler::Device> device = scheduler::ParseDevice(opt.device);
  Check(device.status(), "--device");
  absl::StatusOr<std::string> path = bench::EnsureSyntheticGguf(shape, opt.gguf);
  Check(path.status(), "writing the synthetic GGUF");
  auto model = model::Model::Load(*path);
  Check(model.status(), "Model::Load");

  scheduler::EngineOptions eo;
  eo.device = *device;
  absl::StatusOr<kernels::KvDtype> dtype = scheduler::KvDtypeFor(*device, std::nullopt);
  Check(dtype.status(), "KV dtype");
  eo.kv_cache_dtype = *dtype;
  eo.max_batched_tokens = opt.max_batched_tokens;
  eo.max_seqs = opt.max_seqs;
  eo.enable_prefix_caching = false;
  const int32_t per_layer = (opt.prompt_tokens + opt.output_tokens + eo.block_size - 1) /
                            eo.block_size;
  if (opt.gpu_memory_utilization > 0) {
    eo.gpu_memory_utilization = opt.gpu_memory_utilization;
  } else {
    eo.kv_blocks = opt.fit * per_layer * shape.layers;
  }
  // The queue must take a whole burst; with a sized pool the burst is known only after.
  eo.max_queue = opt.requests > 0 ? opt.requests : std::numeric_limits<int32_t>::max() / 2;
  TimeObserver times;
  auto engine = scheduler::Engine::Create(model->get(), eo, &times);
  Check(engine.status(), "Engine::Create");
  if (opt.gpu_memory_utilization > 0) {
    opt.fit = (*engine)->limits().kv_blocks_total / (per_layer * shape.layers);
    if (opt.requests == 0) opt.requests = std::max(1, 3 * opt.fit);
  }
  if (opt.requests == 0) {
    Check(absl::InvalidArgumentError("0 needs --gpu-memory-utilization"), "--requests");
  }

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, shape.vocab - 1);
  std::vector<std::vector<int32_t>> prompts(opt.requests);
  for (std::vector<int32_t>& p : prompts) {
    p.resize(opt.prompt_tokens);
    for (int32_t& t : p) t = token(rng);
  }
  const scheduler::EngineLimits& limits = (*engine)->limits();
  // kv_bytes_per_token covers every layer; a block holds one layer's block_size tokens.
  const double pool_gib = static_cast<double>(limits.kv_bytes_per_token) *
                          limits.kv_blocks_total * eo.block_size / shape.layers / (1 << 30);
  std::printf("%s, shape %s; KV pool %d blocks (%.2f GiB, %d requests of %d + %d tokens "
              "uncompressed); %d requests per burst, budget %.2f\n",
              limits.device.c_str(), opt.shape.c_str(), limits.kv_blocks_total, pool_gib,
              opt.fit, opt.prompt_tokens, opt.output_tokens, opt.requests, opt.budget);
  double ceiling_rate = 0;
  if (opt.ceiling) {
    const Ceiling c = MeasureCeiling(**engine, times, prompts, opt);
    ceiling_rate = static_cast<double>(opt.requests) * opt.output_tokens / c.seconds();
    std::printf("ceiling at budget %.2f: prefill %.2f s + decode %.2f s = %.2f s, %.0f output "
                "tok/s\n",
                opt.budget, c.prefill_seconds, c.decode_seconds, c.seconds(), ceiling_rate);
  }
  std::printf("| policy | peak running | mean running | wall s | forward s | compression s | "
              "scoring s | planning s | compaction s | output tok/s | vs none | of ceiling | "
              "TTFT p50 s | TTFT p99 s | blocks freed | preemptions | failed |\n| --- | --- | "
              "--- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
              "| --- |\n");
  double none_rate = 0;
  for (const std::string& policy : opt.policies) {
    const BurstResult r = RunBurst(**engine, times, prompts, opt, policy);
    if (policy == "none") none_rate = r.output_tokens / r.seconds;
    PrintRow(policy, r, none_rate, ceiling_rate);
  }
  return 0;
}

std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("Engine capacity with and without KV compression on synthetic weights: requests "
               "running at once and output tokens/s in a pool that fits --fit uncompressed.",
               "capacity_bench");
  base::ConfigureApp(app);
  app.add_option("--shape", opt->shape, "llama3-8b or smollm2-135m");
  app.add_option("--gguf", opt->gguf,
                 "synthetic GGUF path, written first if missing (default: "
                 "/tmp/winnow-synthetic-<shape>.gguf)");
  app.add_option("--device", opt->device, "cuda, cuda:N or cpu");
  app.add_option("--prompt_tokens", opt->prompt_tokens, "tokens per prompt")
      ->check(base::AtLeast(1));
  app.add_option("--output_tokens", opt->output_tokens, "tokens generated per request")
      ->check(base::AtLeast(1));
  app.add_option("--requests", opt->requests,
                 "requests per burst; 0 (with --gpu-memory-utilization): three times what the "
                 "pool holds uncompressed")
      ->check(base::AtLeast(0));
  app.add_option("--fit", opt->fit, "requests the KV pool holds uncompressed")
      ->check(base::AtLeast(1));
  app.add_option("--policies", opt->policies,
                 "comma-separated; none = no compression; name+k=v adds params "
                 "(winnowkv_docs+lookahead=16)")
      ->delimiter(',');
  app.add_option("--budget", opt->budget, "compression budget of every policy");
  app.add_option("--max_batched_tokens", opt->max_batched_tokens, "tokens per forward")
      ->check(base::AtLeast(1));
  app.add_option("--max_seqs", opt->max_seqs, "sequences holding KV at once")
      ->check(base::AtLeast(1));
  app.add_option("--gpu-memory-utilization", opt->gpu_memory_utilization,
                 "cuda: size the pool from this fraction of the GPU's memory, as the daemon "
                 "does, instead of --fit")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--ceiling,!--no-ceiling", opt->ceiling,
               "measure the zero-overhead ceiling first (three probe bursts without compression)");
  return base::ParseCommandLine(app, argc, argv);
}

}  // namespace
}  // namespace winnow

int main(int argc, char** argv) {
  winnow::Options opt;
  if (std::optional<int> exit = winnow::ParseOptions(argc, argv, &opt)) return *exit;
  return winnow::Run(opt);
}
