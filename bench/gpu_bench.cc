// The CUDA worker's forward on synthetic weights of a real model's shape, so that it runs from a
// bare checkout on any GPU machine (docs/benchmarks.md, "GPU"):
//
//   gpu_bench [--shape=llama3-8b|smollm2-135m] [--gguf=PATH] [--context=1024]
//             [--batches=1,8,32,128] [--steps=32] [--prefill_tokens=2048] [--prefill_seqs=1,8]
//
// 1. Copy bandwidth: a device-to-device copy (bytes read + written per second), the ceiling the
//    decode roofline uses.
// 2. Prefill: `prefill_seqs` prompts of `prefill_tokens` tokens in one forward; TFLOP/s counts
//    the GEMMs (2 x rows x parameters, the output head for the last rows only) and causal
//    attention (4 x heads x head_dim per query-key pair).
// 3. Decode: `batch` sequences at `context` tokens each, `steps` one-token steps replaying CUDA
//    graphs (and, in a column of its own, launching every kernel); the median step against the
//    roofline: the bytes every step must read (the weights the step touches, the batch's K/V)
//    over the copy bandwidth. Greedy sampling of the copied logits on the host
//    (model::Sampler, the rows spread over the host's threads as the workers do) is timed apart.
//
// The GGUF (bench/synthetic_gguf.h) is written to --gguf first if no file is there (4.5 GB for
// llama3-8b). Prints tables; never asserts on time.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/cli.h"
#include "bench/bench_util.h"
#include "bench/synthetic_gguf.h"
#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "model/cuda_model.h"
#include "model/model.h"
#include "model/sampler.h"

namespace winnow {
namespace {

constexpr int32_t kBlock = 16;
constexpr int32_t kWarmupSteps = 3;

struct Options {
  std::string shape = "llama3-8b";
  std::string gguf;
  int32_t device = 0;
  int32_t context = 1024;
  std::vector<int32_t> batches = {1, 8, 32, 128};
  int32_t steps = 32;
  int32_t prefill_tokens = 2048;
  std::vector<int32_t> prefill_seqs = {1, 8};
  bool profile = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Check(const absl::Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

void CheckCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

// Bytes read + written per second by a large device-to-device copy (median of 10).
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 31;
  void *a = nullptr, *b = nullptr;
  CheckCuda(cudaMalloc(&a, bytes), "cudaMalloc");
  CheckCuda(cudaMalloc(&b, bytes), "cudaMalloc");
  CheckCuda(cudaMemset(a, 1, bytes), "cudaMemset");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> rates;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    CheckCuda(cudaEventSynchronize(stop), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) rates.push_back(2.0 * bytes / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return Median(rates);
}

class Bench {
 public:
  Bench(const Options& opt, model::Model& model) : opt_(opt), model_(model) {}

  void Init() {
    const model::ModelConfig& c = model_.config();
    const int32_t max_batch = *std::max_element(opt_.batches.begin(), opt_.batches.end());
    const int32_t max_prefill =
        *std::max_element(opt_.prefill_seqs.begin(), opt_.prefill_seqs.end());
    const int64_t decode_blocks =
        (opt_.context + kWarmupSteps + opt_.steps + kBlock + kBlock - 1) / kBlock;
    const int64_t prefill_blocks = (opt_.prefill_tokens + kBlock - 1) / kBlock;
    const int64_t blocks = int64_t{c.num_layers} * std::max<int64_t>(max_batch * decode_blocks,
                                                                     max_prefill * prefill_blocks);
    auto pool = cache::BlockPool::Create(model_.KvLayoutFor(kBlock, kernels::KvDtype::kBF16),
                                         static_cast<int32_t>(blocks), /*host_arena=*/false);
    Check(pool.status(), "BlockPool::Create");
    pool_ = *std::move(pool);
    const double t0 = bench::Now(false);
    auto cuda = model::CudaModel::Create(model_, *pool_, threads_, opt_.device);
    Check(cuda.status(), "CudaModel::Create");
    cuda_ = *std::move(cuda);
    std::printf("weights on the device: %.2f GB bf16 (uploaded in %.1f s); KV arena %.2f GB "
                "(%lld blocks of %d slots)\n\n",
                cuda_->weight_bytes() / 1e9, bench::Now(false) - t0, cuda_->arena_bytes() / 1e9,
                static_cast<long long>(blocks), kBlock);
  }

  void Prefill() {
    std::printf("| prompts x tokens | ms | tokens/s | TFLOP/s |\n|---|---|---|---|\n");
    for (int32_t seqs : opt_.prefill_seqs) {
      std::vector<double> times;
      for (int rep = 0; rep < 4; ++rep) {
        std::vector<cache::SequenceKv> kvs = NewSequences(seqs);
        std::vector<std::vector<int32_t>> prompts(seqs);
        for (auto& p : prompts) p = RandomTokens(opt_.prefill_tokens);
        const double t = Forward(kvs, prompts, 0);
        if (rep > 0) times.push_back(t);  // the first call pays cuBLAS / FlashInfer set-up
        for (auto& kv : kvs) kv.Release(*pool_);
      }
      const double t = Median(times);
      const double tokens = static_cast<double>(seqs) * opt_.prefill_tokens;
      std::printf("| %d x %d | %.1f | %.0f | %.0f |\n", seqs, opt_.prefill_tokens, 1e3 * t,
                  tokens / t, PrefillFlops(seqs) / t / 1e12);
    }
    std::printf("\n");
  }

  void Decode(double bandwidth) {
    const model::ModelConfig& c = model_.config();
    const int32_t max_batch = *std::max_element(opt_.batches.begin(), opt_.batches.end());
    std::vector<cache::SequenceKv> kvs = NewSequences(max_batch);
    std::vector<std::vector<int32_t>> prompts(max_batch);
    for (auto& p : prompts) p = RandomTokens(opt_.context);
    // Prefill in forwards of at most 16k tokens.
    const int32_t per_forward = std::max(1, 16384 / opt_.context);
    for (int32_t first = 0; first < max_batch; first += per_forward) {
      const int32_t n = std::min(per_forward, max_batch - first);
      Forward(std::span(kvs).subspan(first, n), std::span(prompts).subspan(first, n), 0);
    }
    const double kv_bytes_per_token =
        2.0 * c.num_layers * c.num_kv_heads * c.head_dim * 2;  // K and V, bf16
    const double untied_embedding =
        c.tied_embeddings ? 0 : 2.0 * c.vocab_size * c.hidden_size;  // only gathered
    std::printf("Decode at context %d (median of %d steps after %d warm-up):\n\n", opt_.context,
                opt_.steps, kWarmupSteps);
    std::printf("| batch | step ms | step ms, no CUDA graphs | step ms, 1 logits row | "
                "tokens/s | bytes/step GB | roofline ms | of roofline | host greedy sampling "
                "ms (%d threads) |\n|---|---|---|---|---|---|---|---|---|\n",
                threads_.num_threads());
    std::vector<double> sampling;
    for (int32_t batch : opt_.batches) {
      // Steps that ask for every sequence's logits, as the engine does, then steps that ask
      // for one (the rest of the step unchanged): the difference is the logits' cost (output
      // head rows, the copy to the host).
      const std::vector<double> times = DecodeSteps(kvs, batch, /*all_logits=*/true, &sampling);
      const std::vector<double> one_row = DecodeSteps(kvs, batch, /*all_logits=*/false, nullptr);
      // The same steps launching every kernel (CudaModel::set_cuda_graphs).
      cuda_->set_cuda_graphs(false);
      const std::vector<double> eager = DecodeSteps(kvs, batch, /*all_logits=*/true, nullptr);
      cuda_->set_cuda_graphs(true);
      const double t = Median(times);
      const double mean_context = opt_.context + kWarmupSteps + opt_.steps / 2.0;
      const double bytes = cuda_->weight_bytes() - untied_embedding +
                           batch * mean_context * kv_bytes_per_token;
      const double floor = bytes / bandwidth;
      std::printf("| %d | %.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %.0f%% | %.2f |\n", batch,
                  1e3 * t, 1e3 * Median(eager), 1e3 * Median(one_row), batch / t, bytes / 1e9,
                  1e3 * floor, 100 * floor / t, 1e3 * Median(sampling));
    }
    for (auto& kv : kvs) kv.Release(*pool_);
    if (!cuda_->graph_capture_error().ok()) {
      std::printf("CUDA graphs turned off: %s\n", cuda_->graph_capture_error().ToString().c_str());
    }
    std::printf("\n");
  }

 private:
  // Warm-up and timed one-token steps of the first `batch` sequences (at opt_.context tokens),
  // which are cut back to opt_.context after. Seconds per step; with `sampling`, also the
  // host's greedy sampling of each step's logits.
  std::vector<double> DecodeSteps(std::vector<cache::SequenceKv>& kvs, int32_t batch,
                                  bool all_logits, std::vector<double>* sampling) {
    const int32_t layers = model_.config().num_layers;
    std::vector<double> times;
    if (sampling != nullptr) sampling->clear();
    std::vector<std::vector<int32_t>> next(batch, std::vector<int32_t>(1));
    model::ForwardOutput out;  // reused, as the workers reuse theirs
    for (int32_t step = 0; step < kWarmupSteps + opt_.steps; ++step) {
      for (auto& t : next) t[0] = RandomTokens(1)[0];
      const bool profiled = opt_.profile && all_logits && step == kWarmupSteps + opt_.steps - 1;
      if (profiled) cudaProfilerStart();
      const double t = Forward(std::span(kvs).first(batch), next, opt_.context + step, &out,
                               all_logits ? batch : 1);
      if (profiled) cudaProfilerStop();
      if (step < kWarmupSteps) continue;
      times.push_back(t);
      if (sampling == nullptr) continue;
      const double s0 = bench::Now(false);
      threads_.ParallelFor(batch, 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          model::Sampler sampler(model::SamplingParams{});
          const int32_t row = out.first_row[b];
          sampler.Sample(out.Row(row), out.log_norm.empty() ? std::nullopt
                                                            : std::optional(out.log_norm[row]));
        }
      });
      sampling->push_back(bench::Now(false) - s0);
    }
    for (int32_t b = 0; b < batch; ++b) {
      for (int32_t l = 0; l < layers; ++l) kvs[b].Truncate(*pool_, l, opt_.context);
    }
    return times;
  }

  std::vector<cache::SequenceKv> NewSequences(int32_t n) {
    std::vector<cache::SequenceKv> kvs;
    for (int32_t i = 0; i < n; ++i) kvs.emplace_back(model_.config().num_layers, kBlock);
    return kvs;
  }

  std::vector<int32_t> RandomTokens(int32_t n) {
    std::uniform_int_distribution<int32_t> id(259, model_.config().vocab_size - 1);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = id(rng_);
    return tokens;
  }

  // One forward of each sequence's `tokens` at `start`, last-token logits for the first
  // `logits_for` sequences (all by default); seconds, synced.
  double Forward(std::span<cache::SequenceKv> kvs, std::span<const std::vector<int32_t>> tokens,
                 int32_t start, model::ForwardOutput* out = nullptr, size_t logits_for = SIZE_MAX) {
    std::vector<model::BatchEntry> batch;
    for (size_t i = 0; i < kvs.size(); ++i) {
      if (!kvs[i].Reserve(*pool_, static_cast<int32_t>(tokens[i].size()))) {
        Check(absl::ResourceExhaustedError("KV pool too small"), "Reserve");
      }
      batch.push_back({&kvs[i], tokens[i], {}, start,
                       i < logits_for ? model::LogitsMode::kLast : model::LogitsMode::kNone});
    }
    model::ForwardOutput local;
    const double t0 = bench::Now(false);
    Check(cuda_->Forward(batch, *pool_, out != nullptr ? out : &local), "Forward");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return bench::Now(false) - t0;
  }

  double PrefillFlops(int32_t seqs) const {
    const model::ModelConfig& c = model_.config();
    const double q = 1.0 * c.num_heads * c.head_dim, kv = 1.0 * c.num_kv_heads * c.head_dim;
    const double layer_params =
        c.hidden_size * (2 * q + 2 * kv) + 3.0 * c.hidden_size * c.ffn_size;
    const double n = opt_.prefill_tokens;
    const double gemm = 2.0 * seqs * n * c.num_layers * layer_params +
                        2.0 * seqs * c.vocab_size * c.hidden_size;
    const double attention = 4.0 * c.num_layers * q * seqs * n * (n + 1) / 2;
    return gemm + attention;
  }

  const Options& opt_;
  model::Model& model_;
  kernels::ThreadPool threads_{0};  // the worker's: the CUDA forward's host side, sampling
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<model::CudaModel> cuda_;
  std::mt19937 rng_{7};
};

std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("The CUDA forward on synthetic weights of a real shape: copy bandwidth, "
               "prefill TFLOP/s, decode step time against the HBM roofline.",
               "gpu_bench");
  base::ConfigureApp(app);
  app.add_option("--shape", opt->shape, "llama3-8b or smollm2-135m");
  app.add_option("--gguf", opt->gguf,
                 "synthetic GGUF path, written first if missing (default: "
                 "/tmp/winnow-synthetic-<shape>.gguf)");
  app.add_option("--device", opt->device, "CUDA device")->check(base::AtLeast(0));
  app.add_option("--context", opt->context, "decode: tokens in each sequence's cache")
      ->check(base::AtLeast(1));
  app.add_option("--batches", opt->batches, "decode batch sizes, comma-separated")
      ->delimiter(',')
      ->check(base::AtLeast(1));
  app.add_option("--steps", opt->steps, "decode steps timed per batch size")
      ->check(base::AtLeast(1));
  app.add_option("--prefill_tokens", opt->prefill_tokens, "prefill: tokens per prompt")
      ->check(base::AtLeast(1));
  app.add_option("--prefill_seqs", opt->prefill_seqs,
                 "prefill: prompts per forward, comma-separated")
      ->delimiter(',')
      ->check(base::AtLeast(1));
  app.add_flag("--profile", opt->profile,
               "wrap the last decode step of each batch size in cudaProfilerStart/Stop (for "
               "ncu --profile-from-start off)");
  return base::ParseCommandLine(app, argc, argv);
}

int Run(const Options& opt) {
  bench::SyntheticShape shape;
  Check(bench::ShapeByName(opt.shape, &shape), "--shape");
  absl::StatusOr<std::string> path = bench::EnsureSyntheticGguf(shape, opt.gguf);
  Check(path.status(), "writing the synthetic GGUF");
  auto model = model::Model::Load(*path);
  Check(model.status(), "Model::Load");
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
  const double bandwidth = CopyBandwidth();
  std::printf("%s, shape %s; device-to-device copy: %.0f GB/s (read + write)\n", prop.name,
              opt.shape.c_str(), bandwidth / 1e9);
  Bench bench(opt, **model);
  bench.Init();
  bench.Prefill();
  bench.Decode(bandwidth);
  return 0;
}

}  // namespace
}  // namespace winnow

int main(int argc, char** argv) {
  winnow::Options opt;
  if (std::optional<int> exit = winnow::ParseOptions(argc, argv, &opt)) return *exit;
  return winnow::Run(opt);
}
