// How much decode-attention work TokenSelect removes, and what selection costs.
//
//   tokenselect_bench [--threads=N] [--contexts=1024,4096,...] [--reps=R] [--cpu_time]
//                     [--model=PATH --prompt_tokens=P --decode_tokens=G]
//
// Part 1 (kernel level, one layer, the default model's attention shape unless --model gives
// another): a single decode token over N cached tokens of random K/V. Times the dense paged
// attention, the sparse one over TokenSelect's list, and the selection itself on a Selection
// Cache miss (one scoring pass over the candidates: soft vote + top-k) and on a hit. Times are
// the fastest of --reps calls.
// Part 2 (with --model): a long prompt is prefilled once per policy, then G greedy tokens are
// decoded with no selection, then teacher-forced on those tokens with tokenselect; prints ms per
// decode step, keys attended, the Selection Cache hit rate under real queries, and how close the
// next-token distributions stay to the full attention's (top-1 agreement, mean KL).
// --cpu_time (with --threads=1) times with the thread's CPU clock instead of the wall clock: the
// work done, whatever else loads the machine.
// Prints tables; never asserts on time.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "bench/bench_util.h"
#include "cache/block_pool.h"
#include "cache/compression.h"
#include "cache/host_scoring.h"
#include "cache/policies/tokenselect.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/cpu_forward.h"
#include "model/model.h"

namespace winnow {
namespace {

using cache::policies::TokenSelectOptions;
using cache::policies::TokenSelectSelector;

struct Options {
  int threads = 2;
  int reps = 30;
  std::vector<int32_t> contexts = {1024, 4096, 16384, 32768};
  std::string model;
  int32_t prompt_tokens = 3000;
  int32_t decode_tokens = 32;
  bool cpu_time = false;
};

// The fastest call: the least disturbed by other load on a shared machine.
double MinMicros(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end()) * 1e6;
}

template <typename Fn>
double Time(const Options& opt, Fn fn) {
  std::vector<double> t;
  fn();  // warm up
  for (int r = 0; r < opt.reps; ++r) {
    const double t0 = bench::Now(opt.cpu_time);
    fn();
    t.push_back(bench::Now(opt.cpu_time) - t0);
  }
  return MinMicros(t);
}

struct Shape {
  int32_t heads = 9, kv_heads = 3, head_dim = 64;  // SmolLM2-135M
};

constexpr int32_t kKernelBlock = 16;
constexpr float kKernelScale = 1.0f / 8.0f;  // 1/sqrt(head_dim)

void PrintKernelHeader(const Options& opt, const Shape& shape) {
  std::printf("\n## Kernel level: one layer, one decode token, H=%d, H_kv=%d, d=%d, %d threads, "
              "%s time\n\n",
              shape.heads, shape.kv_heads, shape.head_dim, opt.threads,
              opt.cpu_time ? "thread CPU" : "wall");
  std::printf("| N cached | setting | keys attended | dense attn (us) | sparse attn (us) | "
              "select miss (us) | select hit (us) | speedup miss | speedup hit |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
}

// One context length's layer: n cached tokens and the decode token's slot, all random, and the
// decode token's query.
struct KernelCase {
  int32_t n = 0;
  std::unique_ptr<cache::BlockPool> pool;
  cache::SequenceKv kv{1, kKernelBlock};
  kernels::PagedKvView view;
  std::vector<int32_t> table;  // the layer's block table
  std::vector<float> q;
  std::vector<float> out;
};

// `normal` is shared across cases (it keeps state between draws), so that every case draws
// what it did when they were made in one loop.
KernelCase MakeKernelCase(const Shape& shape, int32_t n, std::mt19937& rng,
                          std::normal_distribution<float>& normal) {
  KernelCase kc;
  kc.n = n;
  const int32_t blocks = (n + 1 + kKernelBlock - 1) / kKernelBlock;
  kc.pool = *cache::BlockPool::Create(
      cache::KvLayout{1, shape.kv_heads, shape.head_dim, kKernelBlock}, blocks);
  if (!kc.kv.Reserve(*kc.pool, n + 1)) std::abort();
  kc.kv.AppendSlots(0, n + 1);
  std::vector<float> row(shape.head_dim);
  for (int32_t b = 0; b < blocks; ++b) {
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      for (int32_t s = 0; s < kKernelBlock; ++s) {
        for (bool values : {false, true}) {
          for (float& x : row) x = normal(rng);
          kc.pool->WriteRow(b, h, s, values, row.data());
        }
      }
    }
  }
  kc.q.resize(static_cast<size_t>(shape.heads) * shape.head_dim);
  for (float& x : kc.q) x = normal(rng);
  kc.out.resize(kc.q.size());
  kc.view = kc.pool->View();
  kc.table.assign(kc.kv.block_table(0).begin(), kc.kv.block_table(0).end());
  return kc;
}

struct KernelSetting {
  std::string name;
  TokenSelectOptions o;
};

// The paper's fixed 128 + 2048 + 512 selection, and one relative to the context.
std::vector<KernelSetting> KernelSettings(const Shape& shape) {
  std::vector<KernelSetting> settings;
  TokenSelectOptions base;
  base.num_heads = shape.heads;
  base.num_kv_heads = shape.kv_heads;
  base.head_dim = shape.head_dim;
  TokenSelectOptions paper = base;
  paper.k = 2048;
  settings.push_back({"128+2048+512", paper});
  TokenSelectOptions relative = base;
  relative.budget = 0.1;
  settings.push_back({"budget 0.1", relative});
  return settings;
}

// One table row: the selection on a Selection Cache miss and on a hit, and the sparse attention
// over what it selected, against the dense attention's `dense` microseconds.
void PrintKernelRow(const Options& opt, const Shape& shape, const KernelSetting& setting,
                    KernelCase& kc, double dense, kernels::ThreadPool& threads) {
  const int32_t n = kc.n;
  cache::BlockPool& pool = *kc.pool;
  TokenSelectOptions no_cache = setting.o;
  no_cache.selection_cache = false;
  cache::HostScoring scoring(pool, threads);
  TokenSelectSelector miss_sel(no_cache);
  miss_sel.set_scoring(&scoring);
  std::vector<int32_t> slots;
  if (!miss_sel.Select(0, kc.q, 1, n, kc.kv, &slots)) {
    std::printf("| %d | %s | %d (dense) | %.1f | - | - | - | 1.00 | 1.00 |\n", n,
                setting.name.c_str(), n, dense);
    return;
  }
  const double miss = Time(opt, [&] { miss_sel.Select(0, kc.q, 1, n, kc.kv, &slots); });
  TokenSelectSelector hit_sel(setting.o);
  hit_sel.set_scoring(&scoring);
  hit_sel.Select(0, kc.q, 1, n, kc.kv, &slots);
  const double hit = Time(opt, [&] { hit_sel.Select(0, kc.q, 1, n, kc.kv, &slots); });
  kernels::AttentionSequence sparse_seq{kc.table.data(), n + 1, 1, 0};
  sparse_seq.selected = slots.data();
  sparse_seq.num_selected = static_cast<int32_t>(slots.size());
  const double sparse = Time(opt, [&] {
    kernels::PagedAttention(kc.view, {&sparse_seq, 1}, kc.q.data(), shape.heads, kKernelScale,
                            kc.out.data(), threads);
  });
  std::printf("| %d | %s | %zu + 1 | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", n,
              setting.name.c_str(), slots.size(), dense, sparse, miss, hit, dense / (sparse + miss),
              dense / (sparse + hit));
}

void KernelLevel(const Options& opt, const Shape& shape) {
  kernels::ThreadPool threads(opt.threads);
  PrintKernelHeader(opt, shape);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t n : opt.contexts) {
    KernelCase kc = MakeKernelCase(shape, n, rng, normal);
    kernels::AttentionSequence dense_seq{kc.table.data(), n + 1, 1, 0};
    const double dense = Time(opt, [&] {
      kernels::PagedAttention(kc.view, {&dense_seq, 1}, kc.q.data(), shape.heads, kKernelScale,
                              kc.out.data(), threads);
    });
    for (const KernelSetting& setting : KernelSettings(shape)) {
      PrintKernelRow(opt, shape, setting, kc, dense, threads);
    }
    kc.kv.Release(*kc.pool);
  }
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// KL(p || q) of the softmaxes of two logit rows.
double Kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_softmax = [](const std::vector<float>& x) {
    const double m = *std::max_element(x.begin(), x.end());
    double z = 0.0;
    for (float v : x) z += std::exp(v - m);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(z);
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0.0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

// A long, varied document: numbered facts, so attention has something to find. Exactly
// `num_tokens` tokens (the text is cut mid-entry).
std::vector<int32_t> LongPrompt(const model::Tokenizer& tokenizer, int32_t num_tokens) {
  std::string text = "Read the log, then answer.\n";
  std::vector<int32_t> prompt;
  for (int i = 0; static_cast<int32_t>(prompt.size()) < num_tokens; ++i) {
    absl::StrAppend(&text, "Entry ", i, ": sensor ", (i * 37) % 101, " read ", (i * 53) % 997,
                    " at hour ", i % 24, ".\n");
    // The growing text is re-encoded every 50 entries rather than after every one: cheaper.
    if (i % 50 == 49) prompt = tokenizer.Encode(text, true, true);
  }
  prompt.resize(num_tokens);
  return prompt;
}

struct ModelSetting {
  std::string name;
  std::string policy;  // "": no compression
  double budget;
  cache::policies::PolicyParams params;
};

// The rows of the model-level table, the reference (none) first.
std::vector<ModelSetting> ModelSettings() {
  return {
      {"none", "", 1.0, {}},
      {"tokenselect budget 0.1", "tokenselect", 0.1, {}},
      {"tokenselect budget 0.1, no selection cache", "tokenselect", 0.1,
       {{"selection_cache", "false"}}},
      {"tokenselect budget 0.1, theta 0.8", "tokenselect", 0.1, {{"theta", 0.8}}},
      {"tokenselect budget 0.1, theta 0.7", "tokenselect", 0.1, {{"theta", 0.7}}},
      {"tokenselect budget 0.25", "tokenselect", 0.25, {}},
  };
}

constexpr int32_t kModelBlock = 16;
constexpr int32_t kPrefillChunk = 512;

// Prefills `prompt` into `kv` in chunks, `session` (may be null) watching and then compressing,
// and returns the last position's logits.
std::vector<float> PrefillPrompt(model::CpuForward& m, cache::BlockPool& pool,
                                 cache::SequenceKv& kv,
                                 const std::vector<int32_t>& prompt,
                                 cache::CompressionSession* session) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  std::vector<float> last;
  for (int32_t start = 0; start < n; start += kPrefillChunk) {
    const int32_t count = std::min(kPrefillChunk, n - start);
    if (!kv.Reserve(pool, count)) std::abort();
    model::BatchEntry e{&kv, std::span<const int32_t>(prompt).subspan(start, count), {}, start,
                        start + count == n ? model::LogitsMode::kLast : model::LogitsMode::kNone};
    if (session) e.capture = session->PrefillCapture(start, count);
    model::ForwardOutput out;
    if (!m.Forward({&e, 1}, pool, &out).ok()) std::abort();
    if (session && !session->AfterPrefillChunk().ok()) std::abort();
    if (start + count == n) last.assign(out.Row(0).begin(), out.Row(0).end());
  }
  if (session && !session->Compress(kv, pool, m.Scoring(pool)).ok()) std::abort();
  return last;
}

struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [s]: the distribution after tokens[s]
  double seconds = 0.0;                    // in Forward only
};

// --decode_tokens steps after a prompt of `n` tokens: greedy from `last` when `reference` is
// empty, else teacher-forced on it.
Decoded DecodeSteps(const Options& opt, model::CpuForward& m, cache::BlockPool& pool,
                    cache::SequenceKv& kv, int32_t n, std::vector<float> last,
                    const std::vector<int32_t>& reference, cache::CompressionSession* session) {
  Decoded d;
  for (int32_t s = 0; s < opt.decode_tokens; ++s) {
    const int32_t token =
        reference.empty()
            ? static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin())
            : reference[s];
    d.tokens.push_back(token);
    if (!kv.Reserve(pool, 1)) std::abort();
    model::BatchEntry e{&kv, std::span<const int32_t>(&token, 1), {}, n + s,
                        model::LogitsMode::kLast};
    if (session) e.selector = session->selector();
    model::ForwardOutput out;
    const double t0 = bench::Now(opt.cpu_time);
    if (!m.Forward({&e, 1}, pool, &out).ok()) std::abort();
    d.seconds += bench::Now(opt.cpu_time) - t0;
    if (session && !session->AfterDecodeStep(n + s, kv, pool).ok()) std::abort();
    last.assign(out.Row(0).begin(), out.Row(0).end());
    d.logits.push_back(last);
  }
  return d;
}

void PrintModelRow(const Options& opt, const ModelSetting& setting,
                   cache::CompressionSession* session, const Decoded& d,
                   const std::vector<std::vector<float>>& reference_logits) {
  int agree = 0;
  double kl = 0.0;
  for (size_t s = 0; s < d.logits.size(); ++s) {
    agree += Argmax(d.logits[s]) == Argmax(reference_logits[s]);
    kl += Kl(reference_logits[s], d.logits[s]);
  }
  std::string keys = "100%";
  std::string hits = "-";
  if (session) {
    const auto& st =
        dynamic_cast<cache::policies::TokenSelectSelector*>(session->selector())->stats();
    keys = absl::StrCat(st.keys_attended, " / ", st.keys_total, " (",
                        100 * st.keys_attended / std::max<int64_t>(st.keys_total, 1), "%)");
    hits = absl::StrCat(st.hits, " / ", st.hits + st.misses);
  }
  std::printf("| %s | %.2f | %s | %s | %d / %d | %.5f |\n", setting.name.c_str(),
              1e3 * d.seconds / opt.decode_tokens, keys.c_str(), hits.c_str(), agree,
              opt.decode_tokens, kl / opt.decode_tokens);
}

void ModelLevel(const Options& opt) {
  auto loaded = model::Model::Load(opt.model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", opt.model.c_str(),
                 loaded.status().ToString().c_str());
    return;
  }
  std::unique_ptr<model::Model> m = *std::move(loaded);
  kernels::ThreadPool threads(opt.threads);
  model::CpuForward forward(*m, threads);
  const model::ModelConfig& c = m->config();
  const std::vector<int32_t> prompt = LongPrompt(m->tokenizer(), opt.prompt_tokens);
  const int32_t n = opt.prompt_tokens;
  const int32_t per_seq = (n + opt.decode_tokens + kModelBlock) / kModelBlock + 1;
  auto pool = *cache::BlockPool::Create(m->KvLayoutFor(kModelBlock), c.num_layers * per_seq);

  std::printf("\n## Model level: %s, prompt %d tokens, %d decode steps, %d threads, %s time\n\n",
              opt.model.c_str(), n, opt.decode_tokens, opt.threads,
              opt.cpu_time ? "thread CPU" : "wall");
  std::printf("| policy | ms / decode step | past keys attended | selection cache hits | "
              "top-1 = none | mean KL(none, policy) |\n|---|---|---|---|---|---|\n");
  // The first setting (none) decodes greedily; the others are teacher-forced on its tokens, so
  // every step compares next-token distributions over the same context.
  std::vector<int32_t> reference;
  std::vector<std::vector<float>> reference_logits;
  for (const ModelSetting& setting : ModelSettings()) {
    cache::policies::PolicyContext context;
    context.dims = m->PolicyDims(kModelBlock);
    context.layout.num_tokens = n;
    std::unique_ptr<cache::CompressionSession> session;
    if (!setting.policy.empty()) {
      session = *cache::CompressionSession::Create(
          setting.policy, cache::policies::PolicyConfig(setting.budget, setting.params), context);
    }
    cache::SequenceKv kv(c.num_layers, kModelBlock);
    std::vector<float> last = PrefillPrompt(forward, *pool, kv, prompt, session.get());
    Decoded d = DecodeSteps(opt, forward, *pool, kv, n, std::move(last), reference, session.get());
    kv.Release(*pool);
    if (reference.empty()) {
      reference = d.tokens;
      reference_logits = d.logits;
    }
    PrintModelRow(opt, setting, session.get(), d, reference_logits);
  }
}

// std::nullopt: run with `opt`; otherwise the exit status (after --help or a usage error).
std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("TokenSelect's selection kernel against full attention, then (with --model) its "
               "decode speed and agreement on a real model.",
               "tokenselect_bench");
  base::ConfigureApp(app);
  app.add_option("--threads", opt->threads, "threads")->check(base::AtLeast(1));
  app.add_option("--reps", opt->reps, "repetitions; the fastest counts")->check(base::AtLeast(1));
  app.add_option("--contexts", opt->contexts, "kernel-level context lengths, comma-separated")
      ->delimiter(',')
      ->check(base::AtLeast(1));
  app.add_option("--model", opt->model, "GGUF model for the model-level table (default: none)");
  app.add_option("--prompt_tokens", opt->prompt_tokens, "model level: prompt length")
      ->check(base::AtLeast(1));
  app.add_option("--decode_tokens", opt->decode_tokens, "model level: decode steps")
      ->check(base::AtLeast(1));
  app.add_flag("--cpu_time", opt->cpu_time, "time on the thread's CPU clock");
  return base::ParseCommandLine(app, argc, argv);
}

}  // namespace
}  // namespace winnow

int main(int argc, char** argv) {
  winnow::Options opt;
  if (std::optional<int> exit = winnow::ParseOptions(argc, argv, &opt)) return *exit;
  winnow::Shape shape;
  winnow::KernelLevel(opt, shape);
  if (!opt.model.empty()) winnow::ModelLevel(opt);
  return 0;
}
