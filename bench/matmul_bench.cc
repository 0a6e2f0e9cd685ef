// Throughput of the CPU weight matmul on the default model's shapes (SmolLM2-135M: hidden 576,
// KV 192, MLP 1536, vocab 49152), plus the thread pool's per-call overhead.
//
//   matmul_bench [--threads=N] [--min_seconds=S] [--json=PATH] [--cpu_time]
//
// Each case runs with float32 activations (MatMul) and with 8-bit activations (MatMulQ8, the
// activations' quantisation included in the time), and prints the ratio q8 / f32 of their rates.
//
// Decode-sized products (m = 1, 8) read every weight once, so they are timed with enough
// copies of the matrix in rotation to overflow the last-level cache, as in a real decode step
// where the whole model streams from DRAM. GB/s counts weight bytes only; GFLOP/s counts 2*m*k*n.
// Rates use the fastest call (the least disturbed by other load); the median is printed too.
// --cpu_time (with --threads=1) times with the thread's CPU clock instead of the wall clock, which
// keeps per-core numbers meaningful on a machine shared with other work.
// Prints a table; never asserts on time.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/cli.h"
#include "bench/bench_util.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 0;
  double min_seconds = 0.3;
  std::string json_path;
  bool cpu_time = false;
};

struct Case {
  const char* name;
  int64_t cols;  // input features (k)
  int64_t rows;  // output features (n)
  GgmlType type;
};

struct Result {
  Case c;
  int64_t m;
  bool q8;
  double median_s;  // per call
  double best_s;    // fastest call: the least disturbed by other load on the machine
};

// Random quantised weights whose fp16 scales (and mins) are a finite 0.0625.
std::vector<uint8_t> RandomWeights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeTraits traits = TraitsOf(type);
  std::vector<uint8_t> bytes(rows * RowBytes(type, cols));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  const uint16_t half = 0x2c00;  // 0.0625
  // Byte offsets of each format's fp16 scales within a block.
  std::vector<int> scales = {0};
  if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 || type == GgmlType::kQ4_K ||
      type == GgmlType::kQ5_K) {
    scales = {0, 2};
  } else if (type == GgmlType::kQ2_K) {
    scales = {80, 82};
  } else if (type == GgmlType::kQ3_K) {
    scales = {108};
  } else if (type == GgmlType::kQ6_K) {
    scales = {208};
  }
  for (size_t off = 0; off + traits.block_bytes <= bytes.size(); off += traits.block_bytes) {
    for (int at : scales) std::memcpy(&bytes[off + at], &half, 2);
  }
  return bytes;
}


Result Run(const Case& c, int64_t m, bool q8, ThreadPool& pool, const Options& opt,
           std::mt19937& rng) {
  const int64_t row_bytes = RowBytes(c.type, c.cols);
  const int64_t matrix_bytes = row_bytes * c.rows;
  // 64 MiB of weights in rotation outruns a 32 MiB L3; prefill is compute-bound, one copy will do.
  const int64_t copies = m <= 8 ? std::max<int64_t>(1, (int64_t{64} << 20) / matrix_bytes) : 1;
  std::vector<std::vector<uint8_t>> weights;
  for (int64_t i = 0; i < copies; ++i) {
    weights.push_back(RandomWeights(c.type, c.rows, c.cols, rng));
  }
  std::vector<float> x(m * c.cols), y(m * c.rows);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);

  Q8Activations xq;
  auto call = [&](int64_t i) {
    const WeightMatrix w{c.type, c.rows, c.cols, row_bytes, weights[i % copies].data()};
    absl::Status s;
    if (q8) {
      s = QuantizeActivations(x.data(), m, c.cols, &xq, pool);
      if (s.ok()) s = MatMulQ8(w, xq, y.data(), pool);
    } else {
      s = MatMul(w, x.data(), m, y.data(), pool);
    }
    if (!s.ok()) std::fprintf(stderr, "matmul failed: %s\n", s.ToString().c_str());
  };
  for (int64_t i = 0; i < std::min<int64_t>(copies, 8) + 2; ++i) call(i);  // warm up

  std::vector<double> samples;
  const double start = bench::Now(opt.cpu_time);
  for (int64_t i = 0;; ++i) {
    const double t0 = bench::Now(opt.cpu_time);
    call(i);
    const double t1 = bench::Now(opt.cpu_time);
    samples.push_back(t1 - t0);
    if (samples.size() >= 5 && t1 - start > opt.min_seconds) break;
  }
  std::sort(samples.begin(), samples.end());
  return Result{c, m, q8, samples[samples.size() / 2], samples.front()};
}

double PoolOverheadMicros(ThreadPool& pool) {
  std::vector<int64_t> sink(pool.num_threads() * 16);
  auto job = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sink[i * 16] += i;
  };
  for (int i = 0; i < 1000; ++i) pool.ParallelFor(pool.num_threads(), 1, job);
  const int calls = 100000;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) pool.ParallelFor(pool.num_threads(), 1, job);
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / calls;
}

void WriteJson(const std::string& path, const std::vector<Result>& results, int threads,
               bool cpu_time, double overhead_us) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f,
               "{\"threads\": %d, \"cpu_time\": %s, \"parallel_for_overhead_us\": %.3f, "
               "\"results\": [\n",
               threads, cpu_time ? "true" : "false", overhead_us);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double flops = 2.0 * r.m * r.c.rows * r.c.cols;
    const double bytes = static_cast<double>(RowBytes(r.c.type, r.c.cols)) * r.c.rows;
    std::fprintf(f,
                 "  {\"shape\": \"%s\", \"type\": \"%s\", \"activations\": \"%s\", \"m\": %lld, "
                 "\"median_us\": %.2f, "
                 "\"best_us\": %.2f, \"gflops\": %.2f, \"weight_gbps\": %.2f}%s\n",
                 r.c.name, std::string(TraitsOf(r.c.type).name).c_str(), r.q8 ? "q8" : "f32",
                 static_cast<long long>(r.m), r.median_s * 1e6, r.best_s * 1e6,
                 flops / r.best_s * 1e-9, bytes / r.best_s * 1e-9,
                 i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

// std::nullopt: run with `opt`; otherwise the exit status (after --help or a usage error).
std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("Times the CPU matmul kernels on the default model's shapes.", "matmul_bench");
  base::ConfigureApp(app);
  app.add_option("--threads", opt->threads, "0: one per hardware thread")
      ->check(base::AtLeast(0));
  app.add_option("--min_seconds", opt->min_seconds, "time per case at least")
      ->check(base::Above(0));
  app.add_option("--json", opt->json_path, "also write the results to this JSON file");
  app.add_flag("--cpu_time", opt->cpu_time, "time on the thread's CPU clock (needs --threads=1)");
  if (std::optional<int> exit = base::ParseCommandLine(app, argc, argv)) return exit;
  if (opt->cpu_time && opt->threads != 1) {
    std::fputs("matmul_bench: --cpu_time measures one thread; pass --threads=1 with it\n", stderr);
    return 2;
  }
  return std::nullopt;
}

int Main(int argc, char** argv) {
  Options opt;
  if (std::optional<int> exit = ParseOptions(argc, argv, &opt)) return *exit;
  ThreadPool pool(opt.threads);
  const double overhead_us = PoolOverheadMicros(pool);
  std::printf("threads: %d   clock: %s   ParallelFor(n = threads) overhead: %.2f us/call\n\n",
              pool.num_threads(), opt.cpu_time ? "thread CPU time" : "wall", overhead_us);

  const Case cases[] = {
      {"576->576", 576, 576, GgmlType::kQ4_1},     {"576->1536", 576, 1536, GgmlType::kQ4_1},
      {"1536->576", 1536, 576, GgmlType::kQ4_1},   {"576->576", 576, 576, GgmlType::kQ4_0},
      {"576->1536", 576, 1536, GgmlType::kQ4_0},   {"1536->576", 1536, 576, GgmlType::kQ4_0},
      {"576->576", 576, 576, GgmlType::kQ8_0},     {"576->192", 576, 192, GgmlType::kQ8_0},
      {"576->1536", 576, 1536, GgmlType::kQ8_0},   {"1536->576", 1536, 576, GgmlType::kQ8_0},
      {"576->1536", 576, 1536, GgmlType::kQ5_0},   {"1536->576", 1536, 576, GgmlType::kQ4_K},
      {"1536->576", 1536, 576, GgmlType::kQ6_K},   {"1536->576", 1536, 576, GgmlType::kQ2_K},
      {"1536->576", 1536, 576, GgmlType::kQ3_K},
      {"576->49152", 576, 49152, GgmlType::kQ8_0},
  };
  std::mt19937 rng(42);
  std::vector<Result> results;
  std::printf("%-11s %-5s %5s %12s %12s %9s %9s %11s %7s\n", "shape", "type", "m", "f32_best_us",
              "q8_best_us", "f32_GF/s", "q8_GF/s", "q8_weight_GB/s", "q8/f32");
  for (const Case& c : cases) {
    for (int64_t m : {1, 8, 32, 512}) {
      const Result f = Run(c, m, false, pool, opt, rng);
      const Result q = Run(c, m, true, pool, opt, rng);
      results.push_back(f);
      results.push_back(q);
      const double flops = 2.0 * m * c.rows * c.cols;
      const double bytes = static_cast<double>(RowBytes(c.type, c.cols)) * c.rows;
      std::printf("%-11s %-5s %5lld %12.1f %12.1f %9.1f %9.1f %11.1f %7.2f\n", c.name,
                  std::string(TraitsOf(c.type).name).c_str(), static_cast<long long>(m),
                  f.best_s * 1e6, q.best_s * 1e6, flops / f.best_s * 1e-9,
                  flops / q.best_s * 1e-9, bytes / q.best_s * 1e-9, f.best_s / q.best_s);
      std::fflush(stdout);
    }
  }
  if (!opt.json_path.empty()) WriteJson(opt.json_path, results, pool.num_threads(), opt.cpu_time, overhead_us);
  return 0;
}

}  // namespace
}  // namespace winnow::kernels

int main(int argc, char** argv) { return winnow::kernels::Main(argc, argv); }
