#include "scheduler/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fatal_error.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "cache/block_pool.h"
#include "cache/prefix_cache.h"
#include "scheduler/device.h"
#include "scheduler/output_processor.h"
#include "scheduler/scheduler.h"
#include "scheduler/sequence.h"
#include "spdlog/spdlog.h"

namespace winnow::scheduler {
namespace {

// EngineOptions::inject_fatal_error_at: the real worker, whose forward of iteration `at` then
// reports a lost device, as a sticky CUDA error would after the kernels ran.
class LostDeviceWorker : public Worker {
 public:
  LostDeviceWorker(std::unique_ptr<Worker> inner, int64_t at)
      : inner_(std::move(inner)), at_(at) {}
  WorkerOutput Execute(std::span<const ScheduledChunk> chunks) override {
    WorkerOutput out = inner_->Execute(chunks);
    if (++iterations_ != at_) return out;
    out.status = base::MarkFatal(
        absl::InternalError("injected fault: the device was lost (inject_fatal_error_at)"));
    out.chunks.clear();
    return out;
  }
  absl::Status Admits(const GenerationRequest& request) const override {
    return inner_->Admits(request);
  }

 private:
  std::unique_ptr<Worker> inner_;
  const int64_t at_;
  int64_t iterations_ = 0;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status BrokenContract(const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("engine: request was not validated by the server: ", what));
}

// What the forward relies on for memory safety and the loop for termination. The server
// validates every field with errors that name the wire field; this only guards the engine
// against a caller that skipped that.
absl::Status CheckContract(const GenerationRequest& r, const model::ModelConfig& config,
                           const EngineLimits& limits) {
  if (r.prompt_tokens.empty()) return BrokenContract("empty prompt");
  int64_t embedding_rows = 0;
  for (int32_t id : r.prompt_tokens) {
    if (id == model::kEmbeddingInput) {
      ++embedding_rows;
    } else if (id < 0 || id >= config.vocab_size) {
      return BrokenContract(absl::StrCat("token id ", id, " outside the vocabulary"));
    }
  }
  if (static_cast<int64_t>(r.embeddings.size()) != embedding_rows * config.hidden_size) {
    return BrokenContract("embedding rows do not match the embedding positions");
  }
  if (r.max_tokens < 1) return BrokenContract("max_tokens < 1");
  if (r.grammar != nullptr && r.ignore_eos) return BrokenContract("a grammar with ignore_eos");
  if (static_cast<int64_t>(r.prompt_tokens.size()) > limits.max_prompt_tokens) {
    return BrokenContract(absl::StrCat("prompt longer than ", limits.max_prompt_tokens));
  }
  if (r.compression.context_tokens < 0 ||
      r.compression.context_tokens > static_cast<int64_t>(r.prompt_tokens.size()) ||
      (r.compression.context_tokens > 0 && !r.compression.enabled())) {
    return BrokenContract("compression.context_tokens outside [0, prompt] or without a policy");
  }
  const std::vector<int32_t>& ends = r.compression.stage_ends;
  if (!ends.empty() && (ends.front() <= 0 || ends.back() != r.compression.context_tokens ||
                        std::adjacent_find(ends.begin(), ends.end(), std::greater_equal<>()) !=
                            ends.end())) {
    return BrokenContract("compression.stage_ends not ascending up to context_tokens");
  }
  if (r.compression.probe != ContextProbe::kNone) {
    const auto context = std::span<const int32_t>(r.prompt_tokens).first(
        std::max(r.compression.context_tokens, 0));
    if (r.compression.context_tokens == 0 ||
        std::find(context.begin(), context.end(), model::kEmbeddingInput) != context.end()) {
      return BrokenContract("compression.probe without a context, or over embedding inputs");
    }
  }
  return absl::OkStatus();
}

// A policy that compresses only the prompt's context cannot also act on the tokens after it:
// those are prefilled over the compressed context, many at once, where its decode-time hooks
// expect one token a step.
absl::Status CheckContextScope(const GenerationRequest& r, cache::CompressionSession& c) {
  if (r.compression.context_tokens == 0) return absl::OkStatus();
  const char* why = c.EvictsDuringDecode()    ? "evicts while decoding"
                    : c.LookaheadSteps() > 0  ? "plans after a lookahead"
                    : c.selector() != nullptr ? "selects per decode token"
                                              : nullptr;
  if (why == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "compression.context_tokens: policy ", r.compression.policy, " ", why,
      ", so it cannot compress a context alone; use it on the whole prompt (scope \"prompt\"), "
      "or turn that off in its params"));
}

// The most blocks an uncompressed sequence of `slots` K/V slots holds when it runs alone: a
// global layer all its slots; a sliding layer, once past its window, the blocks that cover the
// next token's window, since the scheduler gives back those behind it after every chunk and a
// prefill chunk shrinks to what the pool holds.
int64_t BlocksHeldAlone(const model::ModelConfig& config, int64_t slots, int32_t block_size) {
  int64_t blocks = 0;
  for (int32_t l = 0; l < config.num_layers; ++l) {
    const int32_t window = config.WindowOf(l);
    const int64_t all = CeilDiv(slots, block_size);
    blocks += window > 0 ? std::min(all, CeilDiv(window - 1, block_size) + 1) : all;
  }
  return blocks;
}

// Whether the request could ever run alone: prompt + max_tokens within the context, and its KV
// within the whole pool (with compression, the uncompressed prompt and the compressed
// footprint at max_tokens).
absl::Status CheckCapacity(const GenerationRequest& r, const cache::CompressionSession* c,
                           const model::ModelConfig& config, const EngineLimits& limits) {
  const int64_t prompt_len = static_cast<int64_t>(r.prompt_tokens.size());
  const int64_t total = prompt_len + r.max_tokens;
  if (total > limits.context_length) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) = %d exceeds the model context of %d tokens",
        prompt_len, r.max_tokens, total, limits.context_length));
  }
  // The last generated token is never fed back, so its K/V is never stored.
  const int64_t kv_slots = total - 1;
  const int64_t layers = config.num_layers;
  const int64_t blocks = layers * CeilDiv(kv_slots, limits.block_size);
  if (c == nullptr) {
    const int64_t held = BlocksHeldAlone(config, kv_slots, limits.block_size);
    if (held <= limits.kv_blocks_total) return absl::OkStatus();
    const bool slides = held < blocks;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) needs %d KV blocks (%d layers x %d blocks of %d "
        "tokens%s) but the whole pool has %d, enough for %d tokens per sequence",
        prompt_len, r.max_tokens, held, layers, CeilDiv(kv_slots, limits.block_size),
        limits.block_size, slides ? ", less what sliding windows give back" : "",
        limits.kv_blocks_total, limits.max_tokens_in_pool));
  }
  // Each layer rounds up to whole blocks, hence the extra block per layer at steady state. A
  // lookahead holds the uncompressed prompt and its first tokens until the plan.
  // With context_tokens the rest of the prompt stays whole, like the tokens generated after.
  const int64_t lookahead = std::min<int64_t>(c->LookaheadSteps(), r.max_tokens - 1);
  // A probe runs after the context, one segment at a time, before the rest of the prompt.
  int64_t probe = 0;  // the longest segment of any stage's probe
  for (const std::vector<cache::ProbeSegment>& segments : r.compression.stage_probes) {
    for (const cache::ProbeSegment& s : segments) {
      probe = std::max<int64_t>(probe, static_cast<int64_t>(s.tokens.size()));
    }
  }
  const int64_t probed = int64_t{r.compression.context_tokens} + probe;
  const int64_t peak =
      layers * CeilDiv(std::max(prompt_len + lookahead, probed), limits.block_size);
  const int32_t compressed = c->num_tokens();
  const int64_t steady =
      CeilDiv(c->SteadyStateSlots(compressed, static_cast<int32_t>(prompt_len) - compressed +
                                                  r.max_tokens - 1),
              limits.block_size) +
      layers;
  const int64_t needed = std::max(peak, std::min(steady, blocks));
  if (needed <= limits.kv_blocks_total) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "prompt (%d tokens) + max_tokens (%d) with compression policy %s at budget %g needs %d "
      "KV blocks (the larger of the uncompressed prompt and the compressed footprint at "
      "max_tokens) but the whole pool has %d, enough for %d tokens per sequence",
      prompt_len, r.max_tokens, r.compression.policy, r.compression.budget, needed,
      limits.kv_blocks_total, limits.max_tokens_in_pool));
}

// Each layer's sliding window (0: global); empty when no layer slides.
std::vector<int32_t> LayerWindows(const model::ModelConfig& c) {
  if (c.sliding_layers.empty()) return {};
  std::vector<int32_t> windows(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) windows[l] = c.WindowOf(l);
  return windows;
}

}  // namespace

// The engine loop wires the three parts: the scheduler decides, the worker executes, the
// output processor streams. Fields under "shared" are guarded by `mu`; the rest belong to the
// engine thread.
struct Engine::Impl {
  Impl(model::Model& m, const EngineLimits& l, EngineObserver* obs,
       std::unique_ptr<cache::BlockPool> p, std::unique_ptr<Worker> w)
      : model(m),
        limits(l),
        observer(obs),
        dims(m.PolicyDims(l.block_size, l.kv_logit_bias)),
        pool(std::move(p)),
        contexts(l.prefix_caching ? std::make_unique<cache::CompressedPrefixCache>(*pool)
                                  : nullptr),
        scheduler({l.max_batched_tokens, l.max_seqs, LayerWindows(m.config())}, *pool,
                  contexts.get()),
        worker(std::move(w)),
        output(m.tokenizer(), l.context_length, obs) {}

  model::Model& model;
  const EngineLimits limits;
  EngineObserver* const observer;
  const cache::policies::ModelDims dims;
  std::unique_ptr<cache::BlockPool> pool;
  // Published compressed contexts (null without prefix caching).
  std::unique_ptr<cache::CompressedPrefixCache> contexts;
  Scheduler scheduler;
  std::unique_ptr<Worker> worker;
  OutputProcessor output;

  // The vocabulary as structured output reads it, built by the first request with a grammar.
  const std::shared_ptr<const structured::TokenVocabulary>& Vocabulary() {
    std::call_once(vocabulary_once, [this] {
      const model::Tokenizer& tok = model.tokenizer();
      vocabulary = std::make_shared<const structured::TokenVocabulary>(
          tok.Pieces(/*render_special=*/false), tok.end_of_generation_ids());
    });
    return vocabulary;
  }
  std::once_flag vocabulary_once;
  std::shared_ptr<const structured::TokenVocabulary> vocabulary;

  // --- Shared with the callers' threads. ---
  mutable base::Mutex mu;
  std::deque<std::unique_ptr<Sequence>> inbox ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> cancels ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> live ABSL_GUARDED_BY(mu);  // submitted, not yet finished
  bool draining ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  absl::Status failure ABSL_GUARDED_BY(mu);  // a fatal forward error (base/fatal_error.h)
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  SchedulerState published ABSL_GUARDED_BY(mu);
  std::thread thread;

  // --- Engine thread only. ---
  std::vector<std::unique_ptr<Sequence>> seqs;  // waiting and running
  std::vector<uint64_t> finished_ids;           // to drop from `live` at the next publish
  int64_t preemptions_total = 0;
  absl::Status failed_with;  // a fatal forward error, as `failure`: nothing runs again

  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return stopping || !inbox.empty() || !cancels.empty();
  }
  bool Idle() const ABSL_SHARED_LOCKS_REQUIRED(mu) { return live.empty(); }

  void Run();
  // Moves submitted sequences in (also when shutting down, so that Run cancels them) and
  // returns the cancels; false once shutting down.
  bool TakeSubmitted(std::vector<uint64_t>* to_cancel);
  void ExpireAndCancel(const std::vector<uint64_t>& to_cancel);
  // Plans and runs one iteration; false when nothing could be scheduled.
  bool RunIteration();
  void ApplyPlan(const IterationPlan& plan);
  // After a preemption: a fresh compression session for the recomputed tokens.
  void RestartCompression(Sequence* s);
  void ApplyResults(const IterationPlan& plan, const WorkerOutput& out);
  // After a fatal forward error: Submit refuses from now on and the observer hears of it once;
  // the caller then ends every request (FailRemaining), as Run does with any submitted later.
  void StopAfterFatal(const absl::Status& status);
  void FailRemaining();
  void Finish(Sequence* s, FinishReason reason, absl::Status status);
  void RemoveFinished();
  void Publish();
  void CheckPoolInvariant() const;
};

Engine::Engine(model::Model* model, EngineLimits limits)
    : model_(model),
      limits_(limits),
      probe_frame_(model->chat_template().ok() ? ChatProbeFrame(*model->chat_template())
                                               : ProbeFrame{}) {}

Engine::~Engine() { Shutdown(); }

namespace {

absl::Status ValidateOptions(const EngineOptions& options) {
  if (options.max_seqs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_seqs must be >= 1, or 0 for auto, got ", options.max_seqs));
  }
  for (auto [name, value] : {std::pair<const char*, int64_t>{"max_batched_tokens",
                                                             options.max_batched_tokens},
                             {"max_queue", options.max_queue},
                             {"block_size", options.block_size}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 1, got ", value));
    }
  }
  if (options.kv_blocks < 0 || options.max_prompt_tokens < 0 || options.max_tokens_limit < 0) {
    return absl::InvalidArgumentError(
        "kv_blocks, max_prompt_tokens and max_tokens_limit must not be negative");
  }
  if (options.kv_blocks == 0 && options.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError("either kv_blocks or kv_cache_bytes must be positive");
  }
  return absl::OkStatus();
}

EngineLimits LimitsOf(const EngineOptions& options, const model::ModelConfig& config,
                      const cache::KvLayout& layout, int32_t num_blocks) {
  EngineLimits limits;
  limits.max_batched_tokens = options.max_batched_tokens;
  // Auto: a running sequence holds at least one block per layer.
  limits.max_seqs = options.max_seqs > 0 ? options.max_seqs
                                         : std::max(1, std::min(MaxSeqsBound(options),
                                                                num_blocks / config.num_layers));
  limits.max_queue = options.max_queue;
  limits.block_size = options.block_size;
  limits.context_length = config.context_length;
  limits.max_prompt_tokens = options.max_prompt_tokens > 0
                                 ? std::min(options.max_prompt_tokens, config.context_length)
                                 : config.context_length;
  limits.max_tokens_limit = options.max_tokens_limit;
  limits.kv_blocks_total = num_blocks;
  limits.max_tokens_in_pool = int64_t{num_blocks / config.num_layers} * options.block_size;
  limits.prefix_caching = options.enable_prefix_caching;
  limits.probe_segment_tokens = options.probe_segment_tokens;
  limits.kv_cache_dtype = layout.dtype;
  limits.kv_bytes_per_token = layout.kv_bytes_per_token();
  limits.kv_logit_bias = layout.logit_bias;
  limits.device = DescribeDevice(options.device);
  return limits;
}

}  // namespace

int32_t MaxSeqsBound(const EngineOptions& options) {
  return options.max_seqs > 0 ? options.max_seqs
                              : std::min(options.max_batched_tokens, kMaxSeqsAuto);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(model::Model* model,
                                                       const EngineOptions& options,
                                                       EngineObserver* observer) {
  if (model == nullptr) return absl::InvalidArgumentError("engine: model is null");
  WINNOW_RETURN_IF_ERROR(ValidateOptions(options));
  const model::ModelConfig& config = model->config();
  // A host pool carries per-slot logit biases (mass-preserving merges); the CUDA attention does
  // not read them yet, so a device pool has none.
  const cache::KvLayout layout = model->KvLayoutFor(options.block_size, options.kv_cache_dtype,
                                                    NeedsHostArena(options.device));
  WINNOW_RETURN_IF_ERROR(kernels::CheckKvDtype(layout.dtype, layout.head_dim));
  // Logits rows: one per sequence, and the rows of chunks whose logits all come back
  // (prompt_logprobs; the scheduler gives them at most kPromptLogprobsChunk per iteration).
  const model::ForwardLimits forward_limits{
      options.max_batched_tokens,
      std::min<int64_t>(options.max_batched_tokens,
                        int64_t{MaxSeqsBound(options)} + kPromptLogprobsChunk)};
  int64_t kv_cache_bytes = options.kv_cache_bytes;
  if (options.kv_blocks == 0 && options.gpu_memory_utilization > 0.0) {
    WINNOW_ASSIGN_OR_RETURN(kv_cache_bytes,
                            KvBytesForGpuMemory(options.device, *model,
                                                options.gpu_memory_utilization, forward_limits));
  }
  const int32_t num_blocks = options.kv_blocks > 0
                                 ? options.kv_blocks
                                 : cache::BlockPool::BlocksForBytes(layout, kv_cache_bytes);
  if (num_blocks < config.num_layers) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV pool of %d blocks (%d bytes each) cannot hold a single token: that takes one block "
        "per layer (%d layers)",
        num_blocks, layout.bytes_per_block(), config.num_layers));
  }
  WINNOW_ASSIGN_OR_RETURN(
      std::unique_ptr<cache::BlockPool> pool,
      cache::BlockPool::Create(layout, num_blocks, NeedsHostArena(options.device)));
  std::unique_ptr<Worker> worker;
  if (options.worker_factory) {
    worker = options.worker_factory(*model, *pool);
    if (worker == nullptr) {
      return absl::InvalidArgumentError("engine: the worker factory returned no worker");
    }
  } else {
    WINNOW_ASSIGN_OR_RETURN(worker, MakeWorker(options.device, *model, *pool, options.worker,
                                               forward_limits, options.cuda_graphs));
  }
  if (options.inject_fatal_error_at > 0) {
    worker = std::make_unique<LostDeviceWorker>(std::move(worker), options.inject_fatal_error_at);
  }

  const EngineLimits limits = LimitsOf(options, config, layout, num_blocks);
  std::unique_ptr<Engine> engine(new Engine(model, limits));
  engine->impl_ = std::make_unique<Impl>(*model, limits, observer, std::move(pool),
                                         std::move(worker));
  Impl& impl = *engine->impl_;
  {
    base::MutexLock lock(&impl.mu);
    impl.published.kv_blocks_total = num_blocks;
    impl.published.kv_blocks_free = num_blocks;
  }
  spdlog::info(
      "engine: device {}, KV pool {} blocks x {} tokens ({:.1f} MiB, {} KV, {} bytes per token, {} tokens "
      "per sequence at most), max_batched_tokens={} max_seqs={} max_queue={}",
      limits.device, num_blocks, options.block_size,
      static_cast<double>(layout.bytes_per_block()) * num_blocks / (1 << 20),
      kernels::KvDtypeName(layout.dtype), layout.kv_bytes_per_token(), limits.max_tokens_in_pool,
      limits.max_batched_tokens, limits.max_seqs, limits.max_queue);
  impl.thread = std::thread([&impl] { impl.Run(); });
  return engine;
}

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request,
                                        std::shared_ptr<RequestSink> sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("sink is null");
  const model::ModelConfig& config = model_->config();
  WINNOW_RETURN_IF_ERROR(CheckContract(request, config, limits_));
  WINNOW_RETURN_IF_ERROR(impl_->worker->Admits(request));
  if (request.compression.probe == ContextProbe::kRepeat) {
    CompressionSpec& spec = request.compression;
    for (int32_t i = 0; i < spec.num_stages(); ++i) {
      const std::span<const int32_t> stage = std::span<const int32_t>(request.prompt_tokens)
                                                 .first(spec.StageEnd(i))
                                                 .subspan(spec.StageBegin(i));
      // The probe runs at the positions after its stage, which the model's context bounds.
      const int32_t room = limits_.context_length - spec.StageEnd(i);
      absl::StatusOr<std::vector<cache::ProbeSegment>> segments = RepeatProbeSegments(
          model_->tokenizer(), stage, std::min(limits_.probe_segment_tokens, room), probe_frame_);
      if (!segments.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compression.probe: the context ends at position ", spec.StageEnd(i), " of the "
            "model's ", limits_.context_length, ", so ", segments.status().message()));
      }
      spec.stage_probes.push_back(*std::move(segments));
    }
  }
  absl::StatusOr<std::unique_ptr<cache::CompressionSession>> compression =
      MakeCompressionSession(impl_->dims, request,
                             static_cast<int32_t>(request.prompt_tokens.size()));
  if (!compression.ok()) return BrokenContract(std::string(compression.status().message()));
  if (*compression != nullptr) {
    WINNOW_RETURN_IF_ERROR(CheckContextScope(request, **compression));
  }
  WINNOW_RETURN_IF_ERROR(CheckCapacity(request, compression->get(), config, limits_));
  absl::StatusOr<std::vector<std::unique_ptr<cache::CompressionSession>>> stages =
      MakeStageSessions(impl_->dims, request, static_cast<int32_t>(request.prompt_tokens.size()));
  if (!stages.ok()) {
    if (absl::IsInvalidArgument(stages.status())) return stages.status();
    return BrokenContract(std::string(stages.status().message()));
  }

  // Build the sequence outside the lock: it copies the prompt and seeds the sampler.
  auto seq = std::make_unique<Sequence>(std::move(request), config.num_layers,
                                        limits_.block_size);
  seq->compression = *std::move(compression);
  seq->stage_sessions = *std::move(stages);
  if (seq->req.grammar != nullptr) {
    seq->constraint =
        std::make_unique<structured::Constraint>(seq->req.grammar, impl_->Vocabulary());
  }
  if (limits_.prefix_caching) {
    seq->prefix_keys = cache::PrefixBlockKeys(seq->req.prompt_tokens, seq->req.embeddings,
                                              config.hidden_size, limits_.block_size,
                                              seq->req.cache_salt);
    for (int32_t i = 0; seq->req.compression.context_tokens > 0 && i < seq->num_stages(); ++i) {
      seq->context_keys.push_back(CompressedContextKey(seq->req, config.hidden_size, i));
    }
  }
  seq->output = std::make_unique<OutputStream>(model_->tokenizer(), seq->req.stop_strings,
                                               std::move(sink));
  seq->submit_time = absl::Now();

  base::MutexLock lock(&impl_->mu);
  if (impl_->stopping) return absl::UnavailableError("engine is shut down");
  if (!impl_->failure.ok()) {
    return absl::UnavailableError(absl::StrCat("the engine stopped after a device failure: ",
                                               impl_->failure.message()));
  }
  if (impl_->draining) {
    return absl::UnavailableError("server is draining; not accepting new requests");
  }
  const int64_t queued = impl_->published.waiting + static_cast<int64_t>(impl_->inbox.size());
  if (queued >= limits_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request queue is full: %d requests waiting (max_queue %d)", queued, limits_.max_queue));
  }
  const uint64_t id = impl_->next_id++;
  seq->id = id;
  seq->arrival = id;
  impl_->live.insert(id);
  impl_->inbox.push_back(std::move(seq));
  return id;
}

bool Engine::Cancel(uint64_t id) {
  base::MutexLock lock(&impl_->mu);
  if (!impl_->live.contains(id)) return false;
  impl_->cancels.push_back(id);
  return true;
}

EngineSnapshot Engine::Snapshot() const {
  base::MutexLock lock(&impl_->mu);
  EngineSnapshot snap;
  snap.running = impl_->published.running;
  snap.waiting = impl_->published.waiting + static_cast<int32_t>(impl_->inbox.size());
  snap.kv_blocks_total = impl_->published.kv_blocks_total;
  snap.kv_blocks_free = impl_->published.kv_blocks_free;
  snap.preemptions_total = impl_->published.preemptions_total;
  snap.draining = impl_->draining;
  snap.limits = limits_;
  return snap;
}

void Engine::BeginDrain() {
  base::MutexLock lock(&impl_->mu);
  impl_->draining = true;
}

bool Engine::WaitForIdle(absl::Duration timeout) {
  base::MutexLock lock(&impl_->mu);
  Impl* impl = impl_.get();
  auto idle = [impl]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return impl->Idle(); };
  return impl->mu.AwaitWithTimeout(idle, timeout);
}

void Engine::Shutdown() {
  {
    base::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

// ---------------------------------------------------------------------------------------------
// Engine thread.

void Engine::Impl::Run() {
  // Gauges (pool size, free blocks) are visible from start-up, before any request arrives.
  Publish();
  while (true) {
    std::vector<uint64_t> to_cancel;
    if (!TakeSubmitted(&to_cancel)) {
      for (auto& s : seqs) {
        Finish(s.get(), FinishReason::kCancelled,
               absl::UnavailableError("engine shut down before the request finished"));
      }
      RemoveFinished();
      Publish();
      return;
    }
    // Cancels and deadlines act before scheduling, so their blocks are free for this very
    // iteration and no work is spent on them.
    ExpireAndCancel(to_cancel);
    if (!failed_with.ok()) FailRemaining();
    RemoveFinished();
    if (!seqs.empty()) {
      if (!RunIteration()) {
        // Cannot happen while every admitted request fits the pool alone (Submit checks
        // that); if it does, wait for a cancel or deadline instead of spinning.
        spdlog::error("engine: {} requests but nothing schedulable", seqs.size());
        base::MutexLock lock(&mu);
        mu.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWork(); },
                           absl::Milliseconds(10));
      }
      RemoveFinished();
    }
    CheckPoolInvariant();
    Publish();
  }
}

bool Engine::Impl::TakeSubmitted(std::vector<uint64_t>* to_cancel) {
  std::deque<std::unique_ptr<Sequence>> arrived;
  bool stop;
  {
    base::MutexLock lock(&mu);
    if (seqs.empty()) mu.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWork(); });
    stop = stopping;
    // Until the next Publish these count as waiting, so Submit's queue-full check and
    // Snapshot never lose sight of them in between.
    published.waiting += static_cast<int32_t>(inbox.size());
    arrived.swap(inbox);
    to_cancel->swap(cancels);
  }
  // Taken even when stopping: Run then cancels them with the rest, so every accepted request
  // gets its terminal event.
  for (std::unique_ptr<Sequence>& s : arrived) {
    if (observer) observer->OnRequestQueued(s->id, s->prompt_len);
    seqs.push_back(std::move(s));
  }
  return !stop;
}

void Engine::Impl::ExpireAndCancel(const std::vector<uint64_t>& to_cancel) {
  for (uint64_t id : to_cancel) {
    for (auto& s : seqs) {
      if (s->id == id && !s->finished()) {
        Finish(s.get(), FinishReason::kCancelled, absl::CancelledError("request cancelled"));
      }
    }
  }
  const absl::Time now = absl::Now();
  for (auto& s : seqs) {
    if (!s->finished() && now >= s->req.deadline) {
      Finish(s.get(), FinishReason::kDeadline,
             absl::DeadlineExceededError("request deadline passed"));
    }
  }
}

bool Engine::Impl::RunIteration() {
  std::vector<Sequence*> live;
  live.reserve(seqs.size());
  for (auto& s : seqs) live.push_back(s.get());
  const IterationPlan plan = scheduler.Schedule(live);
  ApplyPlan(plan);
  if (plan.chunks.empty()) return false;
  // Admitted requests stop counting as waiting now, not after the forward: a request submitted
  // meanwhile (its client may already hold the first token) must not see a full queue.
  Publish();

  const WorkerOutput out = worker->Execute(plan.chunks);
  if (observer) {
    IterationStats stats;
    stats.preemptions = static_cast<int32_t>(plan.preempted.size());
    stats.batch_seqs = static_cast<int32_t>(plan.chunks.size());
    for (const ScheduledChunk& c : plan.chunks) {
      stats.batch_tokens += c.count;
      (c.is_decode() ? stats.decode_tokens : stats.prefill_tokens) += c.count;
    }
    stats.forward_time = out.forward_time;
    stats.sampling_time = out.sampling_time;
    stats.compression_time = out.compression_time;
    stats.compression_phases = out.compression_phases;
    observer->OnIteration(stats);
  }
  ApplyResults(plan, out);
  return true;
}

void Engine::Impl::ApplyPlan(const IterationPlan& plan) {
  for (const IterationPlan::Rejection& r : plan.rejected) {
    Finish(r.seq, FinishReason::kError, r.status);
  }
  for (Sequence* s : plan.preempted) {
    RestartCompression(s);
    ++preemptions_total;
    if (observer) observer->OnPreemption(s->id);
  }
  const absl::Time now = absl::Now();
  for (Sequence* s : plan.admitted) {
    if (s->started) continue;
    s->started = true;
    s->start_time = now;
    if (observer) observer->OnRequestStarted(s->id, now - s->submit_time);
  }
  for (const PrefixLookup& lookup : plan.prefix_lookups) {
    // Usage reports the first admission's hit; a recompute after preemption is internal.
    if (lookup.seq->preemptions == 0) {
      lookup.seq->cached_prompt_tokens =
          std::max(lookup.seq->cached_prompt_tokens, lookup.hit_tokens);
    }
    if (lookup.compressed_context && lookup.hit_tokens > 0) {
      lookup.seq->compression_kept_per_layer = lookup.seq->compression->stats().kept_per_layer;
    }
    if (observer == nullptr) continue;
    if (lookup.compressed_context) {
      observer->OnCompressedContextLookup(lookup.queried_tokens, lookup.hit_tokens,
                                          lookup.hit_kv_bytes);
    } else {
      observer->OnPrefixCacheLookup(lookup.queried_tokens, lookup.hit_tokens);
    }
  }
  for (const ScheduledChunk& c : plan.chunks) {
    c.seq->kv_blocks_peak = std::max(c.seq->kv_blocks_peak, c.seq->kv.num_blocks_held());
  }
}

void Engine::Impl::RestartCompression(Sequence* s) {
  if (s->compression == nullptr) return;
  // The recomputed prompt (now including the generated tokens) is compressed again after its
  // last chunk, by a fresh session; the totals of the old one are kept.
  s->compression_blocks_freed += s->compression->stats().blocks_freed;
  s->compression_slots_evicted += s->compression->stats().slots_evicted;
  absl::StatusOr<std::unique_ptr<cache::CompressionSession>> fresh =
      MakeCompressionSession(dims, s->req, s->num_tokens());
  absl::StatusOr<std::vector<std::unique_ptr<cache::CompressionSession>>> stages =
      MakeStageSessions(dims, s->req, s->num_tokens());
  // The spec was accepted at Submit and the layout only grew, so this cannot fail; if it did,
  // the sequence would recompute uncompressed rather than fail.
  if (!fresh.ok() || !stages.ok()) {
    spdlog::error("engine: recreating compression: {}",
                  (fresh.ok() ? stages.status() : fresh.status()).ToString());
  }
  s->compression = fresh.ok() && stages.ok() ? *std::move(fresh) : nullptr;
  s->stage_sessions = stages.ok() ? *std::move(stages)
                                  : std::vector<std::unique_ptr<cache::CompressionSession>>();
  s->stage = 0;
}

void Engine::Impl::ApplyResults(const IterationPlan& plan, const WorkerOutput& out) {
  if (!out.status.ok()) {
    spdlog::error("engine: forward failed for {} sequences: {}", plan.chunks.size(),
                  out.status.ToString());
    if (base::IsFatal(out.status)) StopAfterFatal(out.status);
    for (const ScheduledChunk& c : plan.chunks) Finish(c.seq, FinishReason::kError, out.status);
    if (!failed_with.ok()) FailRemaining();
    return;
  }
  // A chunk's hooks may meet a lost device too; the batch's results still apply.
  for (const ChunkResult& r : out.chunks) {
    if (base::IsFatal(r.status) && failed_with.ok()) StopAfterFatal(r.status);
  }
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Sequence* s = plan.chunks[i].seq;
    const ChunkResult& r = out.chunks[i];
    if (r.compression.has_value()) {
      if (r.compression->prefill) {
        s->compression_kept_per_layer = s->compression->stats().kept_per_layer;
      }
      if (observer) observer->OnCompression(*r.compression);
      if (s->req.trace.sampled) {
        if (s->traced_compressions.size() < kMaxTracedCompressions) {
          s->traced_compressions.push_back(*r.compression);
        } else {
          ++s->untraced_compressions;
        }
      }
    }
    if (!r.status.ok()) {
      // Before OnChunkComputed: the K/V of a failed chunk is not trusted, so its prompt blocks
      // are never offered to the prefix cache.
      spdlog::error("engine: request {} failed: {}", s->id, r.status.ToString());
      Finish(s, FinishReason::kError, r.status);
      continue;
    }
    scheduler.OnChunkComputed(plan.chunks[i]);
    if (!r.token.has_value()) continue;
    std::optional<FinishReason> reason = output.OnToken(*s, *r.token, now);
    if (reason.has_value()) Finish(s, *reason, absl::OkStatus());
  }
  if (!failed_with.ok()) FailRemaining();
}

void Engine::Impl::StopAfterFatal(const absl::Status& status) {
  spdlog::critical("engine: the device failed; no forward can run again: {}",
                   status.ToString());
  {
    base::MutexLock lock(&mu);
    failure = status;
  }
  failed_with = status;
  if (observer) observer->OnFatalError(status);
}

void Engine::Impl::FailRemaining() {
  for (auto& s : seqs) {
    if (s->finished()) continue;
    Finish(s.get(), FinishReason::kError,
           absl::UnavailableError(absl::StrCat("the device failed: ", failed_with.message())));
  }
}

void Engine::Impl::Finish(Sequence* s, FinishReason reason, absl::Status status) {
  if (s->finished()) return;
  const FinishEvent event = output.MakeFinishEvent(*s, reason, std::move(status));
  scheduler.Release(*s);
  finished_ids.push_back(s->id);
  output.DeliverFinish(*s, event, absl::Now());
}

void Engine::Impl::RemoveFinished() {
  std::erase_if(seqs, [](const std::unique_ptr<Sequence>& s) { return s->finished(); });
}

void Engine::Impl::Publish() {
  SchedulerState state;
  for (const auto& s : seqs) {
    if (!s->finished()) (s->running() ? state.running : state.waiting) += 1;
  }
  state.kv_blocks_total = pool->num_blocks();
  state.kv_blocks_free = pool->num_free();
  state.preemptions_total = preemptions_total;
  state.compressed_contexts = contexts != nullptr ? contexts->resident() : 0;
  // Observer first: once WaitForIdle returns, the gauges already show the idle state.
  if (observer) observer->OnSchedulerState(state);
  base::MutexLock lock(&mu);
  published = state;
  for (uint64_t id : finished_ids) live.erase(id);
  finished_ids.clear();
}

void Engine::Impl::CheckPoolInvariant() const {
  int64_t held = 0;
  for (const auto& s : seqs) held += s->kv.num_blocks_held();
  if (held != pool->num_references()) {
    // Leaked or double-owned blocks corrupt other sequences' caches or shrink the pool for
    // good; in debug builds that is worth a crash, in release a loud log.
    spdlog::critical("engine: KV pool counts {} block references but sequences hold {}",
                     pool->num_references(), held);
#ifndef NDEBUG
    std::abort();
#endif
  }
}

}  // namespace winnow::scheduler
