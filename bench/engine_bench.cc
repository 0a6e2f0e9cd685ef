// End-to-end engine throughput of Model::Forward: prefill tok/s of one long prompt and decode
// tok/s at several batch sizes, on the CPU kernels. bench/engine_bench.py runs this next to
// llama.cpp on the same GGUF and thread count and records both (docs/benchmarks.md).
//
//   engine_bench --model=PATH [--threads=N] [--prompt-tokens=512] [--prefill-chunk=512]
//                [--decode-tokens=64] [--decode-context=64] [--batches=1,8,32] [--reps=2]
//                [--json]
//
// Prefill: one sequence, --prompt-tokens tokens as a single forward ("prefill"), and again fed in
// --prefill-chunk chunks the way the scheduler feeds long prompts ("prefill_chunked").
// Decode at batch B: B sequences, each prefilled with --decode-context tokens (distinct ids per
// sequence), then --decode-tokens steps, each one Forward of B one-token entries (logits of the
// last token) followed by a greedy argmax; tok/s = B * steps / seconds.
// Token ids come from a fixed hash so that the Python driver can feed llama.cpp the very same
// ids. Every measurement is warmed up once, then timed --reps times; the fastest run is reported
// (the least disturbed by other load), both as tokens per wall second and per process-CPU second
// (at --threads=1 the latter barely depends on other load). Never asserts on time.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cli.h"
#include "base/status_macros.h"
#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/cpu_forward.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace winnow::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kBlockSize = 16;
// Decode steps run before the timed ones, so that first-touch page faults in the scratch buffers
// and the pool are not charged to the measurement.
constexpr int32_t kDecodeWarmupSteps = 4;

struct Options {
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int32_t threads = 0;
  int32_t prompt_tokens = 512;
  int32_t prefill_chunk = 512;
  int32_t decode_tokens = 64;
  int32_t decode_context = 64;
  std::vector<int32_t> batches = {1, 8, 32};
  int32_t reps = 2;
  kernels::KvDtype kv_cache_dtype = kernels::KvDtype::kF16;  // the daemon's default
  model::CpuActivations activations = model::kDefaultCpuActivations;
  bool json = false;
};

// Deterministic prompt token for (sequence, position). Mirrored in bench/engine_bench.py:
// keep the two in step. Ids stay in [1000, 21000), clear of the special tokens at the start of
// every vocabulary the default models use.
int32_t TokenId(int32_t seq, int32_t pos) {
  const uint32_t h =
      static_cast<uint32_t>(seq + 1) * 2654435761u + static_cast<uint32_t>(pos) * 40503u;
  return 1000 + static_cast<int32_t>((h ^ (h >> 15)) % 20000u);
}

std::vector<int32_t> Prompt(int32_t seq, int32_t n) {
  std::vector<int32_t> tokens(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = TokenId(seq, i);
  return tokens;
}

// CPU seconds of every thread of this process. With --threads=1 it is the work itself, nearly
// independent of what else the machine runs (wall time is not, on a shared box).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and process-CPU time of one measured span.
struct Timing {
  double wall = 0;
  double cpu = 0;
};

class Stopwatch {
 public:
  Stopwatch() : wall0_(Clock::now()), cpu0_(ProcessCpuSeconds()) {}
  Timing Elapsed() const {
    return {std::chrono::duration<double>(Clock::now() - wall0_).count(),
            ProcessCpuSeconds() - cpu0_};
  }

 private:
  Clock::time_point wall0_;
  double cpu0_;
};

// Keeps the smallest wall and the smallest CPU time over repetitions, each the least disturbed
// by other load.
void KeepBest(const Timing& t, bool first, Timing* best) {
  best->wall = first ? t.wall : std::min(best->wall, t.wall);
  best->cpu = first ? t.cpu : std::min(best->cpu, t.cpu);
}

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// A pool for `num_seqs` sequences of up to `max_tokens` positions each.
absl::StatusOr<std::unique_ptr<cache::BlockPool>> MakePool(const model::Model& model,
                                                           int32_t num_seqs, int32_t max_tokens,
                                                           kernels::KvDtype dtype) {
  const cache::KvLayout layout = model.KvLayoutFor(kBlockSize, dtype);
  const int32_t per_seq = layout.num_layers * ((max_tokens + kBlockSize - 1) / kBlockSize);
  return cache::BlockPool::Create(layout, num_seqs * per_seq);
}

// Feeds `tokens` to a fresh sequence in chunks of `chunk`; returns the wall time.
absl::StatusOr<Timing> TimePrefill(model::CpuForward& forward, cache::BlockPool& pool,
                                   const std::vector<int32_t>& tokens, int32_t chunk) {
  cache::SequenceKv kv(forward.model().config().num_layers, kBlockSize);
  model::ForwardOutput out;
  absl::Status status;
  const int32_t total = static_cast<int32_t>(tokens.size());
  const Stopwatch watch;
  for (int32_t start = 0; start < total && status.ok(); start += chunk) {
    const int32_t n = std::min(chunk, total - start);
    if (!kv.Reserve(pool, n)) {
      status = absl::ResourceExhaustedError("KV pool too small for the prefill");
      break;
    }
    model::BatchEntry entry;
    entry.kv = &kv;
    entry.tokens = std::span<const int32_t>(tokens).subspan(start, n);
    entry.start_position = start;
    entry.logits = start + n == total ? model::LogitsMode::kLast : model::LogitsMode::kNone;
    status = forward.Forward({&entry, 1}, pool, &out);
  }
  const Timing t = watch.Elapsed();
  kv.Release(pool);
  if (!status.ok()) return status;
  return t;
}

absl::StatusOr<Timing> BestPrefill(model::CpuForward& forward, const Options& opt, int32_t chunk) {
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<cache::BlockPool> pool,
                          MakePool(forward.model(), 1, opt.prompt_tokens, opt.kv_cache_dtype));
  const std::vector<int32_t> tokens = Prompt(/*seq=*/0, opt.prompt_tokens);
  Timing best;
  for (int32_t rep = -1; rep < opt.reps; ++rep) {  // rep -1 is the warm-up
    WINNOW_ASSIGN_OR_RETURN(const Timing t, TimePrefill(forward, *pool, tokens, chunk));
    if (rep >= 0) KeepBest(t, rep == 0, &best);
  }
  return best;
}

struct DecodeRun {
  Timing time;
  // Greedy tokens of sequence 0 (first from its prompt's logits, then one per step): the Python
  // driver compares them with llama.cpp's as a sanity check that both ran the same model.
  std::vector<int32_t> seq0_tokens;
};

// One decode measurement at batch `b`: prefill, warm-up steps, then `opt.decode_tokens` timed
// steps.
absl::StatusOr<DecodeRun> TimeDecode(model::CpuForward& forward, cache::BlockPool& pool, int32_t b,
                                     const Options& opt) {
  const int32_t layers = forward.model().config().num_layers;
  std::vector<cache::SequenceKv> kvs;
  kvs.reserve(b);
  for (int32_t i = 0; i < b; ++i) kvs.emplace_back(layers, kBlockSize);
  auto release = [&] {
    for (cache::SequenceKv& kv : kvs) kv.Release(pool);
  };

  model::ForwardOutput out;
  std::vector<int32_t> next(b);
  std::vector<int32_t> position(b, opt.decode_context);
  // Prefill every sequence; a few per forward so that no single forward gets huge.
  std::vector<std::vector<int32_t>> prompts(b);
  for (int32_t i = 0; i < b; ++i) prompts[i] = Prompt(/*seq=*/i + 1, opt.decode_context);
  const int32_t per_forward = std::max(1, opt.prefill_chunk / std::max(1, opt.decode_context));
  for (int32_t first = 0; first < b; first += per_forward) {
    const int32_t last = std::min(b, first + per_forward);
    std::vector<model::BatchEntry> batch;
    for (int32_t i = first; i < last; ++i) {
      if (!kvs[i].Reserve(pool, opt.decode_context)) {
        release();
        return absl::ResourceExhaustedError("KV pool too small for the decode prompts");
      }
      model::BatchEntry e;
      e.kv = &kvs[i];
      e.tokens = prompts[i];
      e.start_position = 0;
      e.logits = model::LogitsMode::kLast;
      batch.push_back(e);
    }
    if (absl::Status s = forward.Forward(batch, pool, &out); !s.ok()) {
      release();
      return s;
    }
    for (int32_t i = first; i < last; ++i) next[i] = Argmax(out.Row(out.first_row[i - first]));
  }

  DecodeRun run;
  run.seq0_tokens.push_back(next[0]);
  std::vector<model::BatchEntry> batch(b);
  auto step = [&]() -> absl::Status {
    for (int32_t i = 0; i < b; ++i) {
      if (!kvs[i].Reserve(pool, 1)) return absl::ResourceExhaustedError("KV pool too small");
      batch[i].kv = &kvs[i];
      batch[i].tokens = std::span<const int32_t>(&next[i], 1);
      batch[i].start_position = position[i];
      batch[i].logits = model::LogitsMode::kLast;
    }
    WINNOW_RETURN_IF_ERROR(forward.Forward(batch, pool, &out));
    for (int32_t i = 0; i < b; ++i) {
      next[i] = Argmax(out.Row(out.first_row[i]));
      ++position[i];
    }
    run.seq0_tokens.push_back(next[0]);
    return absl::OkStatus();
  };

  absl::Status status;
  for (int32_t i = 0; i < kDecodeWarmupSteps && status.ok(); ++i) status = step();
  const Stopwatch watch;
  for (int32_t i = 0; i < opt.decode_tokens && status.ok(); ++i) status = step();
  run.time = watch.Elapsed();
  release();
  if (!status.ok()) return status;
  return run;
}

absl::StatusOr<DecodeRun> BestDecode(model::CpuForward& forward, int32_t b, const Options& opt) {
  const int32_t max_tokens = opt.decode_context + kDecodeWarmupSteps + opt.decode_tokens;
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<cache::BlockPool> pool,
                          MakePool(forward.model(), b, max_tokens, opt.kv_cache_dtype));
  // TimeDecode warms up inside; the first rep also warms the pool's pages.
  DecodeRun best;
  for (int32_t rep = 0; rep < opt.reps; ++rep) {
    WINNOW_ASSIGN_OR_RETURN(DecodeRun run, TimeDecode(forward, *pool, b, opt));
    // Greedy tokens are the same every repetition; only the times differ.
    if (rep == 0) {
      best = std::move(run);
    } else {
      KeepBest(run.time, false, &best.time);
    }
  }
  return best;
}

// std::nullopt: run with `opt`; otherwise the exit status (after --help or a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Options* opt) {
  CLI::App app("Times the CPU forward: prefill in chunks, then decode at several batch sizes.",
               "engine_bench");
  base::ConfigureApp(app);
  app.add_option("--model", opt->model, "GGUF model path");
  app.add_option("--threads", opt->threads, "0: one per hardware thread")
      ->check(base::AtLeast(0));
  app.add_option("--prompt-tokens", opt->prompt_tokens, "prefill length")
      ->check(base::AtLeast(1));
  app.add_option("--prefill-chunk", opt->prefill_chunk, "prefill chunk")->check(base::AtLeast(1));
  app.add_option("--decode-tokens", opt->decode_tokens, "timed decode steps")
      ->check(base::AtLeast(1));
  app.add_option("--decode-context", opt->decode_context, "tokens in the KV before decoding")
      ->check(base::AtLeast(1));
  app.add_option("--reps", opt->reps, "repetitions; the fastest counts")->check(base::AtLeast(1));
  app.add_option("--batches", opt->batches, "decode batch sizes, comma-separated")
      ->delimiter(',')
      ->check(base::AtLeast(1));
  app.add_option_function<std::string>(
         "--kv-cache-dtype",
         [opt](const std::string& v) { opt->kv_cache_dtype = *kernels::ParseKvDtype(v); },
         "KV cache dtype: f32, f16 (default), bf16, q8_0")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  app.add_option_function<std::string>(
         "--cpu-activations",
         [opt](const std::string& v) { opt->activations = *model::ParseCpuActivations(v); },
         "matmul activations: f32 or q8 (the daemon's default)")
      ->check(CLI::IsMember({"f32", "q8"}));
  app.add_flag("--json", opt->json, "print one JSON object instead of tables");
  return base::ParseCommandLine(app, argc, argv);
}

int Main(int argc, char** argv) {
  Options opt;
  if (std::optional<int> exit = ParseFlags(argc, argv, &opt)) return *exit;
  absl::StatusOr<std::unique_ptr<model::Model>> loaded =
      model::Model::Load(opt.model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "engine_bench: load %s: %s\n", opt.model.c_str(),
                 std::string(loaded.status().message()).c_str());
    return 1;
  }
  model::Model& model = **loaded;
  kernels::ThreadPool thread_pool(opt.threads);
  model::CpuForward forward(model, thread_pool, opt.activations);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "engine_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };

  nlohmann::json result;
  result["engine"] = "winnow";
  result["model"] = opt.model;
  // The thread pool reads 0 as one thread per hardware thread; record the count it resolves to.
  const int32_t threads =
      opt.threads > 0 ? opt.threads : static_cast<int32_t>(std::thread::hardware_concurrency());
  result["threads"] = threads;
  result["prompt_tokens"] = opt.prompt_tokens;
  result["prefill_chunk"] = opt.prefill_chunk;
  result["decode_tokens"] = opt.decode_tokens;
  result["decode_context"] = opt.decode_context;
  result["reps"] = opt.reps;
  result["kv_cache_dtype"] = kernels::KvDtypeName(opt.kv_cache_dtype);
  result["cpu_activations"] = model::CpuActivationsName(opt.activations);

  // One JSON entry per measurement: tokens / wall seconds and tokens / process-CPU seconds.
  auto entry = [](int64_t tokens, const Timing& t) {
    return nlohmann::json{{"seconds", t.wall},
                          {"cpu_seconds", t.cpu},
                          {"tok_s", tokens / t.wall},
                          {"tok_per_cpu_s", tokens / t.cpu}};
  };
  if (!opt.json) std::printf("model %s, threads %d\n", opt.model.c_str(), threads);
  for (const bool chunked : {false, true}) {
    const int32_t chunk = chunked ? opt.prefill_chunk : opt.prompt_tokens;
    absl::StatusOr<Timing> t = BestPrefill(forward, opt, chunk);
    if (!t.ok()) return fail(t.status());
    nlohmann::json e = entry(opt.prompt_tokens, *t);
    e["tokens"] = opt.prompt_tokens;
    e["chunk"] = chunk;
    result[chunked ? "prefill_chunked" : "prefill"] = e;
    if (!opt.json) {
      std::printf("prefill %5d tokens, chunks of %-5d %9.1f tok/s  (%.3f s, %.3f cpu-s)\n",
                  opt.prompt_tokens, chunk, opt.prompt_tokens / t->wall, t->wall, t->cpu);
      std::fflush(stdout);
    }
  }

  nlohmann::json decode = nlohmann::json::array();
  for (int32_t b : opt.batches) {
    absl::StatusOr<DecodeRun> run = BestDecode(forward, b, opt);
    if (!run.ok()) return fail(run.status());
    const Timing& t = run->time;
    const int64_t tokens = int64_t{b} * opt.decode_tokens;
    nlohmann::json e = entry(tokens, t);
    e["batch"] = b;
    e["steps"] = opt.decode_tokens;
    e["ms_per_step"] = 1e3 * t.wall / opt.decode_tokens;
    e["seq0_tokens"] = run->seq0_tokens;
    decode.push_back(e);
    if (!opt.json) {
      std::printf("decode  batch %3d, %d steps  %9.1f tok/s  (%.2f ms/step, %.3f cpu-s)\n", b,
                  opt.decode_tokens, tokens / t.wall, 1e3 * t.wall / opt.decode_tokens, t.cpu);
      std::fflush(stdout);
    }
  }
  result["decode"] = decode;
  if (opt.json) std::printf("%s\n", result.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace winnow::bench

int main(int argc, char** argv) {
  // Library warnings (a tokenizer's) go to stderr: stdout carries the --json report.
  spdlog::set_default_logger(spdlog::stderr_color_mt("engine_bench"));
  return winnow::bench::Main(argc, argv);
}
