// KV-compression quality benchmark: runs long-context tasks (bench/quality/tasks.py) through
// Model + CompressionSession directly, single sequences, no daemon, and compares every
// (policy, budget) against the full cache of the same prompt.
//
//   quality_bench --tasks=FILE.jsonl [--model=PATH] [--threads=N]
//                 [--policies=snapkv,h2o,vl_cache+kernel=7+pooling=max,...]
//                 [--budgets=0.05,0.1,0.2,0.5]
//                 [--gen-tokens=16] [--chunk=512] [--params=POLICY:k=v,k=v;POLICY2:k=v]
//                 [--free-run=all|none|POLICY,...] [--check-replay] [--json-out=FILE]
//                 [--cpu-activations=f32|q8] [--kv-dtype=f32|f16|bf16|q8_0]
//
// Per task:
//   1. The prompt is tokenised the way the daemon tokenises `segments` (BOS when the model asks
//      for it, special tokens parsed, context segments become kContext spans) and prefilled
//      ONCE in --chunk chunks, capturing the post-RoPE query rows of every position.
//   2. Reference: a copy of that cache decodes --gen-tokens greedy tokens (the first from the
//      prefill logits) and keeps each step's log-softmax.
//   3. Per (policy, budget), two fresh copies of the prompt cache, each with its own
//      CompressionSession. The session is handed the captured rows exactly as the forward would
//      have handed them during a one-chunk prefill (see ReplayCapture), then compresses. This
//      reuses one prefill for ~40 configurations; --check-replay verifies it against real
//      chunked prefills. Then, batched together:
//        - "forced": teacher-forced with the reference tokens, so that every step sees the same
//          context as the reference: next-token KL(full || compressed) and top-1 agreement;
//        - "free": greedy from its own tokens (what a client would get): the answer text and
//          the greedy agreement with the reference (identical leading tokens). Run only when
//          the forced run's argmax ever differed from the reference; otherwise it IS the
//          reference.
//      The first generated token comes from the full cache's prefill logits, as in the engine
//      (compression runs after the chunk that completes the prefill), so step metrics cover
//      tokens 2..N.
// Everything is written as JSON (--json-out) for bench/quality/run.py, which scores answers and
// renders the tables; a one-line summary per (policy, budget) goes to stderr. Never asserts.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/cli.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "cache/block_pool.h"
#include "cache/compression.h"
#include "cache/policies/policy.h"
#include "cache/query_capture.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/cpu_activations.h"
#include "model/cpu_forward.h"
#include "model/model.h"
#include "nlohmann/json.hpp"

namespace winnow::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace pol = cache::policies;

constexpr int32_t kBlockSize = 16;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string tasks;
  std::string json_out;
  int32_t threads = 0;
  std::vector<std::string> policies = {"none",      "streaming_llm", "h2o",          "snapkv",
                                       "pyramidkv", "vl_cache",      "aircache",     "xkv",
                                       "elastic_cache", "tokenselect"};
  std::vector<double> budgets = {0.05, 0.1, 0.2, 0.5};
  int32_t gen_tokens = 16;
  int32_t chunk = 512;
  // The numerics of the reference and every policy's run: f32 throughout by default, so a
  // policy's distance from the reference is its compression alone.
  model::CpuActivations activations = model::CpuActivations::kF32;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  // Policies whose free (greedy) runs are made; empty: none. Default: every policy.
  std::vector<std::string> free_run = {"*"};
  bool check_replay = false;
  // policy -> params as given on the command line (typed by ParsePolicyParam when used).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::string>> params;
};

struct Task {
  std::string id;
  std::string kind;
  std::string answer;
  std::vector<int32_t> tokens;
  pol::PromptLayout layout;
};

// --------------------------------------------------------------------------------------------
// Tasks.

// Mirrors server/request_builder.cc's BuildSegments for text and context segments.
absl::StatusOr<Task> ParseTask(const json& j, const model::Tokenizer& tok) {
  Task t;
  t.id = j.value("id", "");
  t.kind = j.value("kind", "");
  t.answer = j.value("answer", "");
  if (!j.contains("segments") || !j["segments"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("task ", t.id, ": no segments"));
  }
  if (tok.add_bos() && tok.bos_id() >= 0) t.tokens.push_back(tok.bos_id());
  for (const json& seg : j["segments"]) {
    const bool context = seg.contains("context");
    const std::string text = context ? seg["context"].get<std::string>()
                                     : seg.value("text", std::string());
    const int32_t begin = static_cast<int32_t>(t.tokens.size());
    std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/true);
    t.tokens.insert(t.tokens.end(), ids.begin(), ids.end());
    const int32_t end = static_cast<int32_t>(t.tokens.size());
    if (context && end > begin) t.layout.spans.push_back({pol::SpanKind::kContext, begin, end});
  }
  t.layout.num_tokens = static_cast<int32_t>(t.tokens.size());
  return t;
}

absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& path,
                                            const model::Tokenizer& tok) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<Task> tasks;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad JSON line ", tasks.size() + 1));
    }
    WINNOW_ASSIGN_OR_RETURN(Task t, ParseTask(j, tok));
    tasks.push_back(std::move(t));
  }
  return tasks;
}

// --------------------------------------------------------------------------------------------
// Cache helpers.

// A copy of the first `num_slots` slots of every layer of `src` into fresh blocks.
absl::StatusOr<cache::SequenceKv> CloneKv(const cache::SequenceKv& src, cache::BlockPool& pool) {
  cache::SequenceKv dst(src.num_layers(), src.block_size());
  const int32_t n = src.num_slots(0);
  if (!dst.Reserve(pool, n)) return absl::ResourceExhaustedError("KV pool too small for a copy");
  for (int32_t l = 0; l < src.num_layers(); ++l) {
    const std::span<const int32_t> from = src.block_table(l);
    const std::span<const int32_t> to = dst.block_table(l);
    const int32_t blocks = (src.num_slots(l) + src.block_size() - 1) / src.block_size();
    for (int32_t b = 0; b < blocks; ++b) {
      WINNOW_RETURN_IF_ERROR(pool.CopyBlock(from[b], to[b]));
    }
    dst.AppendSlots(l, src.num_slots(l));
  }
  return dst;
}

// Hands `session` the rows of `all` (every prompt position, one prefill) as the forward would
// have during a single prefill chunk covering the whole prompt: per layer, the rows at positions
// >= first_position are appended (positions at layer 0), then layer_done runs. Mirrors
// CpuForward::CaptureQueries; the cache already holds every layer's K/V, which is what layer_done
// sees after a one-chunk forward.
absl::Status ReplayCapture(const cache::QueryCapture& all, int32_t num_tokens,
                           cache::CompressionSession& session, const cache::SequenceKv& kv,
                           cache::ScoringBackend& scoring, int32_t row_floats) {
  cache::QueryCapture* cap = session.PrefillCapture(0, num_tokens);
  if (cap != nullptr) {
    const int32_t layers = static_cast<int32_t>(all.per_layer.size());
    cap->per_layer.resize(layers);
    const int32_t first = std::max(0, cap->first_position);
    for (int32_t l = 0; l < layers; ++l) {
      const std::vector<float>& src = all.per_layer[l];
      cap->per_layer[l].insert(cap->per_layer[l].end(),
                               src.begin() + int64_t{first} * row_floats, src.end());
      if (l == 0) {
        for (int32_t p = first; p < num_tokens; ++p) cap->positions.push_back(p);
      }
      if (cap->layer_done) cap->layer_done(l, kv, scoring);
    }
  }
  return session.AfterPrefillChunk();
}

// Log-softmax of a logits row, in double.
std::vector<double> LogSoftmax(std::span<const float> logits) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

// KL(p || q) with p given as log-probabilities and q as raw logits.
double KlDivergence(const std::vector<double>& log_p, std::span<const float> q_logits) {
  const std::vector<double> log_q = LogSoftmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p > 0) kl += p * (log_p[i] - log_q[i]);
  }
  return std::max(0.0, kl);
}

// log p(top-1) - log p(top-2): how near a tie the greedy choice was (a near tie is where any
// perturbation, compression or rounding, splits a greedy path).
double TopTwoMargin(const std::vector<double>& log_p) {
  double first = -INFINITY, second = -INFINITY;
  for (double v : log_p) {
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  return first - second;
}

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// --------------------------------------------------------------------------------------------
// Prefill and reference.

struct Prefilled {
  cache::SequenceKv kv;
  cache::QueryCapture capture;  // every position's query rows
  std::vector<float> last_logits;
  double seconds = 0;
};

absl::StatusOr<Prefilled> Prefill(model::CpuForward& forward, cache::BlockPool& pool,
                                  const std::vector<int32_t>& tokens, int32_t chunk,
                                  cache::CompressionSession* session) {
  Prefilled p{cache::SequenceKv(forward.model().config().num_layers, kBlockSize), {}, {}, 0};
  const Clock::time_point t0 = Clock::now();
  const int32_t n = static_cast<int32_t>(tokens.size());
  model::ForwardOutput out;
  for (int32_t start = 0; start < n; start += chunk) {
    const int32_t count = std::min(chunk, n - start);
    if (!p.kv.Reserve(pool, count)) {
      p.kv.Release(pool);
      return absl::ResourceExhaustedError("KV pool too small for the prefill");
    }
    model::BatchEntry e;
    e.kv = &p.kv;
    e.tokens = std::span<const int32_t>(tokens).subspan(start, count);
    e.start_position = start;
    e.logits = start + count == n ? model::LogitsMode::kLast : model::LogitsMode::kNone;
    e.capture = session != nullptr ? session->PrefillCapture(start, count) : &p.capture;
    absl::Status s = forward.Forward({&e, 1}, pool, &out);
    if (s.ok() && session != nullptr) s = session->AfterPrefillChunk();
    if (!s.ok()) {
      p.kv.Release(pool);
      return s;
    }
  }
  const std::span<const float> row = out.Row(out.first_row[0]);
  p.last_logits.assign(row.begin(), row.end());
  p.seconds = SecondsSince(t0);
  return p;
}

struct Reference {
  std::vector<int32_t> tokens;                 // greedy, first from the prefill logits
  std::vector<std::vector<double>> log_probs;  // [t] for tokens[t]'s distribution
  double decode_seconds = 0;
};

absl::StatusOr<Reference> RunReference(model::CpuForward& forward, cache::BlockPool& pool,
                                       const Prefilled& pre, int32_t gen_tokens) {
  Reference ref;
  WINNOW_ASSIGN_OR_RETURN(cache::SequenceKv kv, CloneKv(pre.kv, pool));
  const Clock::time_point t0 = Clock::now();
  ref.log_probs.push_back(LogSoftmax(pre.last_logits));
  ref.tokens.push_back(Argmax(pre.last_logits));
  int32_t position = pre.kv.num_slots(0);
  model::ForwardOutput out;
  absl::Status status;
  while (static_cast<int32_t>(ref.tokens.size()) < gen_tokens &&
         !forward.model().tokenizer().IsEndOfGeneration(ref.tokens.back())) {
    if (!kv.Reserve(pool, 1)) {
      status = absl::ResourceExhaustedError("KV pool too small");
      break;
    }
    model::BatchEntry e;
    e.kv = &kv;
    e.tokens = std::span<const int32_t>(&ref.tokens.back(), 1);
    e.start_position = position++;
    if (status = forward.Forward({&e, 1}, pool, &out); !status.ok()) break;
    const std::span<const float> row = out.Row(out.first_row[0]);
    ref.log_probs.push_back(LogSoftmax(row));
    ref.tokens.push_back(Argmax(row));
  }
  ref.decode_seconds = SecondsSince(t0);
  kv.Release(pool);
  if (!status.ok()) return status;
  return ref;
}

// A policy entry (bench::ParsePolicyEntry): "vl_cache+kernel=7+pooling=max" runs vl_cache with
// those parameters over --params for vl_cache.
absl::StatusOr<std::unique_ptr<cache::CompressionSession>> CreateSession(
    const std::string& entry, double budget, const pol::PolicyContext& context,
    const Options& opt) {
  WINNOW_ASSIGN_OR_RETURN(const PolicyEntry parsed, ParsePolicyEntry(entry));
  // Flag text becomes typed as a client would send it: numbers as params, the rest as options.
  pol::PolicyParams params;
  if (auto it = opt.params.find(parsed.name); it != opt.params.end()) {
    for (const auto& [k, v] : it->second) params[k] = pol::ParsePolicyParam(v);
  }
  for (const auto& [k, v] : parsed.params) params[k] = v;
  return cache::CompressionSession::Create(parsed.name, pol::PolicyConfig(budget, params), context);
}

// --------------------------------------------------------------------------------------------
// Compressed runs.

struct Run {
  double budget = 0;
  bool forced = false;
  cache::SequenceKv kv{0, kBlockSize};
  std::unique_ptr<cache::CompressionSession> session;
  std::vector<int32_t> tokens;  // generated (forced: the reference's)
  int32_t position = 0;
  bool done = false;
  // Metrics.
  std::vector<double> kl;   // forced: per step 1..
  int32_t top1_match = 0;   // forced: steps whose argmax is the reference token
  int32_t steps = 0;
  int32_t plan_step = 0;    // lookahead: steps decoded before the prompt plan (else 0)
  int64_t slots_after_compress = 0;
  int32_t blocks_freed = 0;
  double compress_seconds = 0;
  std::vector<int32_t> kept_per_layer;
};

absl::StatusOr<std::unique_ptr<Run>> StartRun(model::CpuForward& forward,
                                              cache::BlockPool& pool, const Task& task,
                                              const Prefilled& pre, const Reference& ref,
                                              const std::string& policy, double budget,
                                              bool forced, const Options& opt) {
  const model::ModelConfig& c = forward.model().config();
  auto run = std::make_unique<Run>();
  run->budget = budget;
  run->forced = forced;
  WINNOW_ASSIGN_OR_RETURN(run->kv, CloneKv(pre.kv, pool));
  pol::PolicyContext context;
  context.dims = forward.model().PolicyDims(kBlockSize, /*logit_bias=*/true);
  context.layout = task.layout;
  absl::StatusOr<std::unique_ptr<cache::CompressionSession>> session =
      CreateSession(policy, budget, context, opt);
  if (!session.ok()) {
    run->kv.Release(pool);
    return session.status();
  }
  run->session = *std::move(session);
  const int32_t n = task.layout.num_tokens;
  const Clock::time_point t0 = Clock::now();
  if (run->session != nullptr) {
    const int32_t before = run->kv.num_blocks_held();
    absl::Status s = ReplayCapture(pre.capture, n, *run->session, run->kv, forward.Scoring(pool),
                                   c.num_heads * c.head_dim);
    if (s.ok()) s = run->session->Compress(run->kv, pool, forward.Scoring(pool)).status();
    if (!s.ok()) {
      run->kv.Release(pool);
      return s;
    }
    run->blocks_freed = before - run->kv.num_blocks_held();
    run->kept_per_layer = run->session->stats().kept_per_layer;
  }
  run->compress_seconds = SecondsSince(t0);
  for (int32_t l = 0; l < c.num_layers; ++l) run->slots_after_compress += run->kv.num_slots(l);
  run->tokens.push_back(ref.tokens[0]);
  run->position = n;
  run->done = ref.tokens.size() < 2 || (!forced && forward.model().tokenizer().IsEndOfGeneration(
                                                       ref.tokens[0]));
  return run;
}

// A lookahead policy's prompt plan ran after this decode step: what it kept of the prompt (the
// lookahead's tokens, kept whole, are not counted) and freed.
void RecordPromptPlan(Run& r, const cache::CompactionStats& st) {
  const cache::CompressionStats& c = r.session->stats();
  r.plan_step = r.steps + 1;
  const int32_t lookahead = r.session->LookaheadSteps();
  r.kept_per_layer = c.kept_per_layer;
  for (int32_t& kept : r.kept_per_layer) kept -= lookahead;
  r.slots_after_compress = c.slots_after - int64_t{lookahead} * r.kv.num_layers();
  r.blocks_freed = st.blocks_freed;
}

// Decodes every run to completion, batched.
absl::Status DecodeRuns(model::CpuForward& forward, cache::BlockPool& pool,
                        const Reference& ref, int32_t gen_tokens,
                        std::vector<std::unique_ptr<Run>>& runs) {
  const int32_t ref_len = static_cast<int32_t>(ref.tokens.size());
  model::ForwardOutput out;
  while (true) {
    std::vector<Run*> active;
    for (auto& r : runs) {
      if (!r->done) active.push_back(r.get());
    }
    if (active.empty()) return absl::OkStatus();
    std::vector<model::BatchEntry> batch(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
      Run& r = *active[i];
      if (!r.kv.Reserve(pool, 1)) return absl::ResourceExhaustedError("KV pool too small");
      model::BatchEntry& e = batch[i];
      e.kv = &r.kv;
      e.tokens = std::span<const int32_t>(&r.tokens.back(), 1);
      e.start_position = r.position;
      if (r.session != nullptr) {
        e.attention_probs = r.session->DecodeAttentionBuffer();
        e.selector = r.session->selector();
      }
    }
    WINNOW_RETURN_IF_ERROR(forward.Forward(batch, pool, &out));
    for (size_t i = 0; i < active.size(); ++i) {
      Run& r = *active[i];
      if (r.session != nullptr) {
        const bool lookahead = r.session->prompt_plan_pending();
        WINNOW_ASSIGN_OR_RETURN(const cache::CompactionStats st,
                                r.session->AfterDecodeStep(r.position, r.kv, pool));
        if (lookahead && !r.session->prompt_plan_pending()) RecordPromptPlan(r, st);
      }
      ++r.position;
      const std::span<const float> row = out.Row(out.first_row[i]);
      const int32_t step = static_cast<int32_t>(r.tokens.size());  // index of the token predicted
      const int32_t top = Argmax(row);
      ++r.steps;
      if (r.forced) {
        r.kl.push_back(KlDivergence(ref.log_probs[step], row));
        if (top == ref.tokens[step]) ++r.top1_match;
        r.tokens.push_back(ref.tokens[step]);
        r.done = step + 1 >= ref_len;
      } else {
        r.tokens.push_back(top);
        r.done = step + 1 >= gen_tokens || forward.model().tokenizer().IsEndOfGeneration(top);
      }
    }
  }
}

json RunJson(const Run& r, const model::Tokenizer& tok, const Reference& ref) {
  json j;
  j["budget"] = r.budget;
  j["slots_after_compress"] = r.slots_after_compress;
  j["blocks_freed"] = r.blocks_freed;
  j["compress_seconds"] = r.compress_seconds;
  j["kept_per_layer"] = r.kept_per_layer;
  j["plan_step"] = r.plan_step;
  if (r.session != nullptr) {
    j["slots_evicted"] = r.session->stats().slots_evicted;
    j["decode_compactions"] = r.session->stats().decode_compactions;
  }
  if (r.forced) {
    j["kl"] = r.kl;
    j["top1_match"] = r.top1_match;
    j["steps"] = r.steps;
  } else {
    int32_t agree = 0;  // leading generated tokens equal to the reference's
    while (agree < static_cast<int32_t>(std::min(r.tokens.size(), ref.tokens.size())) &&
           r.tokens[agree] == ref.tokens[agree]) {
      ++agree;
    }
    j["tokens"] = r.tokens;
    j["text"] = tok.Decode(r.tokens, /*render_special=*/false);
    j["agree_prefix"] = agree;
  }
  return j;
}

// --check-replay: compresses the task once by a real chunked prefill with the session attached
// (what the engine does) and once by replay, and compares what each (layer, head) kept.
absl::StatusOr<json> CheckReplay(model::CpuForward& forward, cache::BlockPool& pool,
                                 const Task& task, const Prefilled& pre, const Reference& ref,
                                 const std::string& policy, double budget, const Options& opt) {
  const model::ModelConfig& c = forward.model().config();
  pol::PolicyContext context;
  context.dims = forward.model().PolicyDims(kBlockSize, /*logit_bias=*/true);
  context.layout = task.layout;
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<cache::CompressionSession> session,
                          CreateSession(policy, budget, context, opt));
  if (session == nullptr) return json();
  WINNOW_ASSIGN_OR_RETURN(Prefilled real,
                          Prefill(forward, pool, task.tokens, opt.chunk, session.get()));
  absl::Status s = session->Compress(real.kv, pool, forward.Scoring(pool)).status();
  real.kv.Release(pool);
  if (!s.ok()) return s;
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<Run> replay,
                          StartRun(forward, pool, task, pre, ref, policy, budget,
                                   /*forced=*/true, opt));
  replay->kv.Release(pool);
  const pol::SlotPositions& a = session->slot_positions();
  const pol::SlotPositions& b = replay->session->slot_positions();
  int64_t same = 0;
  int64_t total = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const std::span<const int32_t> pa = a.Positions(l, h);
      const std::span<const int32_t> pb = b.Positions(l, h);
      std::vector<int32_t> common;
      std::set_intersection(pa.begin(), pa.end(), pb.begin(), pb.end(),
                            std::back_inserter(common));
      same += static_cast<int64_t>(common.size());
      total += static_cast<int64_t>(std::max(pa.size(), pb.size()));
    }
  }
  json j;
  j["policy"] = policy;
  j["budget"] = budget;
  j["kept_overlap"] = total > 0 ? static_cast<double>(same) / static_cast<double>(total) : 1.0;
  std::fprintf(stderr, "  check-replay %-14s budget %.2f: kept-set overlap %.4f\n",
               policy.c_str(), budget, j["kept_overlap"].get<double>());
  return j;
}

// --------------------------------------------------------------------------------------------
// Flags.

// "--params=vl_cache:kernel=7,pooling=max;aircache:alpha=0.8"
bool ParseParams(const std::string& value, Options* opt) {
  for (absl::string_view group : absl::StrSplit(value, ';', absl::SkipEmpty())) {
    const size_t colon = group.find(':');
    if (colon == absl::string_view::npos) return false;
    const std::string policy(group.substr(0, colon));
    for (absl::string_view kv : absl::StrSplit(group.substr(colon + 1), ',', absl::SkipEmpty())) {
      const size_t eq = kv.find('=');
      if (eq == absl::string_view::npos) return false;
      opt->params[policy][std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    }
  }
  return true;
}

// --cpu-activations and --kv-dtype into `opt`; false (after saying which is wrong) when one
// names no known type.
bool ParseNumerics(const std::string& activations, const std::string& kv_dtype, Options* opt) {
  absl::StatusOr<model::CpuActivations> parsed_activations =
      model::ParseCpuActivations(activations);
  absl::StatusOr<kernels::KvDtype> parsed_kv_dtype = kernels::ParseKvDtype(kv_dtype);
  for (const auto& [flag, status] : {std::pair{"--cpu-activations", parsed_activations.status()},
                                     std::pair{"--kv-dtype", parsed_kv_dtype.status()}}) {
    if (!status.ok()) {
      std::fprintf(stderr, "quality_bench: %s: %s\n", flag, std::string(status.message()).c_str());
      return false;
    }
  }
  opt->activations = *parsed_activations;
  opt->kv_dtype = *parsed_kv_dtype;
  return true;
}

// std::nullopt: run with `opt`; otherwise the exit status (after --help or a usage error).
std::optional<int> ParseFlags(int argc, char** argv, Options* opt) {
  CLI::App app("Compression quality: each policy and budget against the full-cache reference "
               "on a task set.",
               "quality_bench");
  base::ConfigureApp(app);
  std::string policies, params, free_run;
  app.add_option("--model", opt->model, "GGUF model path");
  app.add_option("--tasks", opt->tasks, "JSONL task file")->required();
  app.add_option("--json-out", opt->json_out, "write the results to this JSON file");
  app.add_option("--threads", opt->threads, "0: one per hardware thread")
      ->check(base::AtLeast(0));
  app.add_option("--gen-tokens", opt->gen_tokens, "tokens generated per task")
      ->check(base::AtLeast(2));
  app.add_option("--chunk", opt->chunk, "prefill chunk")->check(base::AtLeast(1));
  // Empty --policies: the full-cache references only (checks that the model can do the tasks).
  CLI::Option* policies_flag =
      app.add_option("--policies", policies, "comma-separated (default: every policy)")
          ->expected(0, 1);  // --policies= (empty) is a valid list
  app.add_option("--budgets", opt->budgets, "comma-separated fractions of the prompt's KV")
      ->delimiter(',')
      ->check(base::AboveAtMost(0, 1));
  CLI::Option* params_flag =
      app.add_option("--params", params, "POLICY:k=v,k=v;POLICY2:k=v (policy parameters)");
  CLI::Option* free_run_flag =
      app.add_option("--free-run", free_run, "policies with free greedy runs: all, none or a list");
  app.add_flag("--check-replay", opt->check_replay, "check that forced replays keep the same KV");
  std::string activations = "f32", kv_dtype = "f32";
  app.add_option("--cpu-activations", activations, "f32 or q8 (the daemon's default is q8)")
      ->capture_default_str();
  app.add_option("--kv-dtype", kv_dtype, "f32, f16, bf16 or q8_0 (the daemon's default is f16)")
      ->capture_default_str();
  if (std::optional<int> exit = base::ParseCommandLine(app, argc, argv)) return exit;

  if (!ParseNumerics(activations, kv_dtype, opt)) return 2;
  if (*policies_flag) opt->policies = absl::StrSplit(policies, ',', absl::SkipEmpty());
  if (*params_flag && !ParseParams(params, opt)) {
    std::fputs("quality_bench: --params: expected POLICY:k=v,k=v;POLICY2:k=v\n", stderr);
    return 2;
  }
  if (*free_run_flag) {
    if (free_run == "all") {
      opt->free_run = {"*"};
    } else if (free_run == "none") {
      opt->free_run.clear();
    } else {
      opt->free_run = absl::StrSplit(free_run, ',', absl::SkipEmpty());
    }
  }
  return std::nullopt;
}

// --------------------------------------------------------------------------------------------
// The benchmark.

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "quality_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// One pool for the largest task: prompt cache + reference + one policy's runs (2 per budget),
// each at most prompt + generated tokens uncompressed (tokenselect and none free nothing).
absl::StatusOr<std::unique_ptr<cache::BlockPool>> CreatePool(model::Model& model,
                                                             const std::vector<Task>& tasks,
                                                             const Options& opt) {
  int32_t max_tokens = 0;
  for (const Task& t : tasks) max_tokens = std::max(max_tokens, t.layout.num_tokens);
  const int32_t seqs = 2 + 2 * static_cast<int32_t>(opt.budgets.size()) + 1;
  const cache::KvLayout layout =
      model.KvLayoutFor(kBlockSize, opt.kv_dtype, /*logit_bias=*/true);
  const int32_t per_seq =
      layout.num_layers * ((max_tokens + opt.gen_tokens + 1 + kBlockSize - 1) / kBlockSize + 1);
  return cache::BlockPool::Create(layout, seqs * per_seq);
}

// The settings part of the JSON; tasks, runs, errors and replay checks are appended as they run.
json ResultHeader(const Options& opt) {
  json result;
  result["model"] = opt.model;
  result["gen_tokens"] = opt.gen_tokens;
  result["chunk"] = opt.chunk;
  result["cpu_activations"] = std::string(model::CpuActivationsName(opt.activations));
  result["kv_dtype"] = kernels::KvDtypeName(opt.kv_dtype);
  result["budgets"] = opt.budgets;
  result["policies"] = opt.policies;
  result["known_policies"] = pol::KnownPolicies();
  json params = json::object();
  for (const auto& [policy, kv] : opt.params) {
    for (const auto& [k, v] : kv) params[policy][k] = v;
  }
  result["params"] = params;
  result["tasks"] = json::array();
  result["runs"] = json::array();
  result["errors"] = json::array();
  result["replay_checks"] = json::array();
  return result;
}

json TaskJson(const Task& task, const Prefilled& pre, const Reference& ref,
              const model::Tokenizer& tok) {
  json tj;
  tj["id"] = task.id;
  tj["kind"] = task.kind;
  tj["answer"] = task.answer;
  tj["num_tokens"] = task.layout.num_tokens;
  json spans = json::array();
  for (const pol::PromptSpan& s : task.layout.spans) spans.push_back({s.begin, s.end});
  tj["context_spans"] = spans;
  tj["ref_tokens"] = ref.tokens;
  tj["ref_text"] = tok.Decode(ref.tokens, /*render_special=*/false);
  json margins = json::array();
  for (const std::vector<double>& log_p : ref.log_probs) margins.push_back(TopTwoMargin(log_p));
  tj["ref_margins"] = margins;
  tj["prefill_seconds"] = pre.seconds;
  tj["ref_decode_seconds"] = ref.decode_seconds;
  return tj;
}

// What every run of one task shares.
struct TaskInputs {
  model::CpuForward& forward;
  cache::BlockPool& pool;
  const Task& task;
  const Prefilled& pre;
  const Reference& ref;
  const Options& opt;
};

// Phase 1: a teacher-forced run of every budget, decoded as one batch. The runs' caches are
// released whether or not it succeeds; their metrics stay.
absl::Status RunForced(const TaskInputs& in, const std::string& policy,
                       std::vector<std::unique_ptr<Run>>* forced) {
  absl::Status status;
  for (double budget : in.opt.budgets) {
    absl::StatusOr<std::unique_ptr<Run>> r = StartRun(in.forward, in.pool, in.task, in.pre, in.ref,
                                                      policy, budget, /*forced=*/true, in.opt);
    if (!r.ok()) {
      status = r.status();
      break;
    }
    forced->push_back(*std::move(r));
  }
  if (status.ok()) status = DecodeRuns(in.forward, in.pool, in.ref, in.opt.gen_tokens, *forced);
  for (auto& r : *forced) r->kv.Release(in.pool);
  return status;
}

// Phase 2, free runs, only where the forced run's argmax ever left the reference: where it never
// did, greedy decoding reproduces the reference token for token (same context at every step), so
// the free run would be the reference itself. Saves the compressions (H2O's and Elastic Cache's
// replay a full QK pass) of the budgets that lose nothing. (*free_runs)[i] is forced[i]'s.
absl::Status RunFree(const TaskInputs& in, const std::string& policy,
                     const std::vector<std::unique_ptr<Run>>& forced,
                     std::vector<std::unique_ptr<Run>>* free_runs) {
  absl::Status status;
  std::vector<std::unique_ptr<Run>> batch;
  std::vector<size_t> index;
  for (size_t i = 0; i < forced.size(); ++i) {
    if (forced[i]->top1_match == forced[i]->steps) continue;
    absl::StatusOr<std::unique_ptr<Run>> r =
        StartRun(in.forward, in.pool, in.task, in.pre, in.ref, policy, forced[i]->budget,
                 /*forced=*/false, in.opt);
    if (!r.ok()) {
      status = r.status();
      break;
    }
    batch.push_back(*std::move(r));
    index.push_back(i);
  }
  if (status.ok()) status = DecodeRuns(in.forward, in.pool, in.ref, in.opt.gen_tokens, batch);
  for (size_t k = 0; k < batch.size(); ++k) {
    batch[k]->kv.Release(in.pool);
    (*free_runs)[index[k]] = std::move(batch[k]);
  }
  return status;
}

// One (policy, budget) record: the forced run's metrics, the free run's answer (the reference's
// when the free run was skipped because it would have been the reference); logs its summary.
json BudgetJson(const TaskInputs& in, const std::string& policy, const Run& r, const Run* free,
                bool free_run) {
  const model::Tokenizer& tok = in.forward.model().tokenizer();
  json j = RunJson(r, tok, in.ref);
  if (free != nullptr) {
    json f = RunJson(*free, tok, in.ref);
    for (auto it = f.begin(); it != f.end(); ++it) {
      if (!j.contains(it.key())) j[it.key()] = it.value();
    }
  } else if (free_run) {
    j["tokens"] = in.ref.tokens;
    j["text"] = tok.Decode(in.ref.tokens, /*render_special=*/false);
    j["agree_prefix"] = static_cast<int32_t>(in.ref.tokens.size());
  }
  j["task"] = in.task.id;
  j["policy"] = policy;
  const double layers = in.forward.model().config().num_layers;
  j["retention"] =
      static_cast<double>(r.slots_after_compress) / (layers * in.task.layout.num_tokens);
  double kl = 0;
  for (double v : r.kl) kl += v;
  kl = r.kl.empty() ? 0 : kl / static_cast<double>(r.kl.size());
  std::fprintf(stderr, "  %-14s budget %.2f kept %.3f  KL %.4f  top1 %2d/%2d  %s\n", policy.c_str(),
               r.budget, j["retention"].get<double>(), kl, r.top1_match, r.steps,
               j.contains("text") ? j["text"].dump().c_str() : "");
  return j;
}

void RunPolicy(const TaskInputs& in, const std::string& policy, json* result) {
  const std::vector<std::string>& free_list = in.opt.free_run;
  const bool free_run = std::find(free_list.begin(), free_list.end(), "*") != free_list.end() ||
                        std::find(free_list.begin(), free_list.end(), policy) != free_list.end();
  const Clock::time_point t0 = Clock::now();
  std::vector<std::unique_ptr<Run>> forced;
  absl::Status status = RunForced(in, policy, &forced);
  std::vector<std::unique_ptr<Run>> free_runs(forced.size());
  if (status.ok() && free_run) status = RunFree(in, policy, forced, &free_runs);
  if (!status.ok()) {
    // An unregistered or failing policy is recorded, not fatal: the table shows the gap.
    std::fprintf(stderr, "  %s: %s\n", policy.c_str(), status.ToString().c_str());
    (*result)["errors"].push_back(
        {{"task", in.task.id}, {"policy", policy}, {"error", status.ToString()}});
    return;
  }
  for (size_t i = 0; i < forced.size(); ++i) {
    (*result)["runs"].push_back(BudgetJson(in, policy, *forced[i], free_runs[i].get(), free_run));
  }
  std::fprintf(stderr, "  %s: %.1fs\n", policy.c_str(), SecondsSince(t0));
}

void CheckReplays(const TaskInputs& in, json* result) {
  for (const std::string& policy : in.opt.policies) {
    absl::StatusOr<json> c =
        CheckReplay(in.forward, in.pool, in.task, in.pre, in.ref, policy, 0.1, in.opt);
    if (c.ok() && !c->is_null()) (*result)["replay_checks"].push_back(*c);
    if (!c.ok()) {
      std::fprintf(stderr, "  check-replay %s: %s\n", policy.c_str(),
                   c.status().ToString().c_str());
    }
  }
}

// Task `ti` of `num_tasks`: its prefill and reference, then every policy. Returns 0, or the exit
// status when the prefill or the reference fails.
int RunTask(model::CpuForward& forward, cache::BlockPool& pool, const Task& task, size_t ti,
            size_t num_tasks, const Options& opt, json* result) {
  absl::StatusOr<Prefilled> pre = Prefill(forward, pool, task.tokens, opt.chunk, nullptr);
  if (!pre.ok()) return Fail("prefill " + task.id, pre.status());
  absl::StatusOr<Reference> ref = RunReference(forward, pool, *pre, opt.gen_tokens);
  if (!ref.ok()) return Fail("reference " + task.id, ref.status());
  json tj = TaskJson(task, *pre, *ref, forward.model().tokenizer());
  (*result)["tasks"].push_back(tj);
  std::fprintf(stderr, "[%zu/%zu] %s: %d tokens, prefill %.1fs, full: %s\n", ti + 1, num_tasks,
               task.id.c_str(), task.layout.num_tokens, pre->seconds,
               json(tj["ref_text"]).dump().c_str());

  const TaskInputs in{forward, pool, task, *pre, *ref, opt};
  for (const std::string& policy : opt.policies) RunPolicy(in, policy, result);
  if (opt.check_replay && ti == 0) CheckReplays(in, result);
  pre->kv.Release(pool);
  return 0;
}

int WriteResult(const json& result, const Options& opt) {
  const std::string text = result.dump(1);
  if (!opt.json_out.empty()) {
    std::ofstream out(opt.json_out);
    out << text << "\n";
    if (!out) return Fail("write " + opt.json_out, absl::InternalError("write failed"));
  } else {
    std::printf("%s\n", text.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options opt;
  if (std::optional<int> exit = ParseFlags(argc, argv, &opt)) return *exit;

  absl::StatusOr<std::unique_ptr<model::Model>> loaded = model::Model::Load(opt.model);
  if (!loaded.ok()) return Fail("load " + opt.model, loaded.status());
  model::Model& model = **loaded;
  kernels::ThreadPool threads(opt.threads);
  model::CpuForward forward(model, threads, opt.activations);
  absl::StatusOr<std::vector<Task>> tasks = LoadTasks(opt.tasks, model.tokenizer());
  if (!tasks.ok()) return Fail("tasks", tasks.status());
  absl::StatusOr<std::unique_ptr<cache::BlockPool>> pool_or = CreatePool(model, *tasks, opt);
  if (!pool_or.ok()) return Fail("pool", pool_or.status());
  cache::BlockPool& pool = **pool_or;

  json result = ResultHeader(opt);
  const Clock::time_point start = Clock::now();
  for (size_t ti = 0; ti < tasks->size(); ++ti) {
    if (int exit = RunTask(forward, pool, (*tasks)[ti], ti, tasks->size(), opt, &result)) {
      return exit;
    }
  }
  result["seconds"] = SecondsSince(start);
  if (pool.num_used() != 0) {
    std::fprintf(stderr, "quality_bench: %d KV blocks leaked\n", pool.num_used());
  }
  return WriteResult(result, opt);
}

}  // namespace
}  // namespace winnow::bench

int main(int argc, char** argv) { return winnow::bench::Main(argc, argv); }
