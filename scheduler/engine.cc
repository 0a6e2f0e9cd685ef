#include "scheduler/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/block_pool.h"
#include "cache/compression.h"
#include "cache/sequence_kv.h"
#include "scheduler/stop_strings.h"
#include "spdlog/spdlog.h"

namespace winnow::scheduler {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The compression session for a prefill of `num_tokens` tokens of `req` (null for no policy).
absl::StatusOr<std::unique_ptr<cache::CompressionSession>> MakeCompressionSession(
    const model::Model& model, int32_t block_size, const GenerationRequest& req,
    int32_t num_tokens) {
  const model::ModelConfig& c = model.config();
  cache::policies::PolicyContext context;
  context.dims = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, block_size};
  context.layout.num_tokens = num_tokens;
  context.layout.spans = req.prompt_spans;
  return cache::CompressionSession::Create(
      req.compression.policy,
      cache::policies::PolicyConfig(req.compression.budget, req.compression.params), context);
}

// One request from Submit to finish. All fields are touched only by the engine thread once the
// sequence has left the submit inbox.
struct Sequence {
  Sequence(const model::Model& model, int32_t block_size, GenerationRequest request,
           std::shared_ptr<RequestSink> request_sink)
      : req(std::move(request)),
        sink(std::move(request_sink)),
        kv(model.config().num_layers, block_size),
        sampler(req.sampling),
        detok(model.tokenizer()),
        stops(req.stop_strings) {}

  uint64_t id = 0;
  uint64_t arrival = 0;  // submit order; breaks priority ties (earlier first)
  GenerationRequest req;
  std::shared_ptr<RequestSink> sink;
  absl::Time submit_time;

  // Prompt then generated tokens; position i of the request is tokens[i]. After a preemption
  // the whole list is recomputed, which is why generated tokens live here too.
  std::vector<int32_t> tokens;
  // emb_prefix[i]: how many kEmbeddingInput positions precede prompt position i (size
  // prompt_len + 1), so a chunk finds its embedding rows without scanning.
  std::vector<int32_t> emb_prefix;
  int32_t prompt_len = 0;
  int32_t num_computed = 0;  // leading tokens whose K/V sit in `kv`
  int32_t num_generated = 0;

  cache::SequenceKv kv;
  model::Sampler sampler;
  model::StreamingDetokenizer detok;
  StopStringMatcher stops;

  bool running = false;  // holds KV blocks (admitted); false: waiting
  bool finished = false;
  bool started = false;
  bool has_first_token = false;
  absl::Time start_time;
  absl::Time first_token_time;
  absl::Time last_token_time;
  int32_t preemptions = 0;
  int32_t kv_blocks_peak = 0;

  // Compression: the session of the current prefill (null without a policy); recreated on
  // preemption so the recomputed cache is compressed again. Totals survive preemptions.
  std::unique_ptr<cache::CompressionSession> compression;
  int32_t compression_blocks_freed = 0;
  int64_t compression_slots_evicted = 0;
  std::vector<int32_t> compression_kept_per_layer;
};

// Scheduling order: higher priority first, then earlier arrival. Preemption victims are taken
// from the other end.
bool Before(const Sequence* a, const Sequence* b) {
  if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
  return a->arrival < b->arrival;
}

}  // namespace

struct Engine::Impl {
  model::Model* model = nullptr;
  EngineLimits limits;
  EngineObserver* observer = nullptr;
  std::unique_ptr<cache::BlockPool> pool;
  int32_t hidden_size = 0;

  // --- Shared with other threads, guarded by mu. ---
  mutable std::mutex mu;
  std::condition_variable wake_cv;  // engine thread: new work, cancel or stop
  std::condition_variable idle_cv;  // WaitForIdle
  std::deque<std::unique_ptr<Sequence>> inbox;
  std::vector<uint64_t> cancels;
  absl::flat_hash_set<uint64_t> live;  // submitted and not yet finished
  bool draining = false;
  bool stopping = false;
  uint64_t next_id = 1;
  SchedulerState published;

  std::thread thread;

  // --- Engine thread only. ---
  std::vector<std::unique_ptr<Sequence>> seqs;  // waiting and running
  std::vector<uint64_t> finished_ids;           // to drop from `live` at the next publish
  int64_t preemptions_total = 0;

  void Run();
  // Schedules and runs one iteration; false when nothing could be scheduled.
  bool Step();
  void Preempt(Sequence* s);
  // After the forward: prefill-chunk bookkeeping, compression after the last prefill chunk,
  // decode-time eviction. An error finishes the sequence.
  absl::Status AfterForward(Sequence* s, int32_t start, int32_t count);
  void ProcessToken(Sequence* s, const model::SampledToken& t);
  void Finish(Sequence* s, FinishReason reason, absl::Status status);
  void RemoveFinished();
  void Publish();
  void CheckPoolInvariant() const;
  // Largest n <= want whose K/V fit in the free blocks (0 when not even one token fits).
  int32_t TokensThatFit(const Sequence& s, int32_t want) const;
};

Engine::Engine(model::Model* model, EngineLimits limits)
    : model_(model), limits_(limits), impl_(std::make_unique<Impl>()) {}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(model::Model* model,
                                                       const EngineOptions& options,
                                                       EngineObserver* observer) {
  if (model == nullptr) return absl::InvalidArgumentError("engine: model is null");
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 1, got ", v));
    return absl::OkStatus();
  };
  for (auto [name, value] : {std::pair<const char*, int64_t>{"max_batched_tokens",
                                                             options.max_batched_tokens},
                             {"max_seqs", options.max_seqs},
                             {"max_queue", options.max_queue},
                             {"block_size", options.block_size}}) {
    if (absl::Status s = positive(name, value); !s.ok()) return s;
  }
  if (options.kv_blocks < 0 || options.max_prompt_tokens < 0 || options.max_tokens_limit < 0) {
    return absl::InvalidArgumentError(
        "kv_blocks, max_prompt_tokens and max_tokens_limit must not be negative");
  }
  if (options.kv_blocks == 0 && options.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError("either kv_blocks or kv_cache_bytes must be positive");
  }

  const model::ModelConfig& config = model->config();
  const cache::KvLayout layout = model->KvLayoutFor(options.block_size);
  const int32_t num_blocks = options.kv_blocks > 0
                                 ? options.kv_blocks
                                 : cache::BlockPool::BlocksForBytes(layout, options.kv_cache_bytes);
  if (num_blocks < config.num_layers) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV pool of %d blocks (%d bytes each) cannot hold a single token: that takes one block "
        "per layer (%d layers)",
        num_blocks, layout.bytes_per_block(), config.num_layers));
  }
  absl::StatusOr<std::unique_ptr<cache::BlockPool>> pool =
      cache::BlockPool::Create(layout, num_blocks);
  if (!pool.ok()) return pool.status();

  EngineLimits limits;
  limits.max_batched_tokens = options.max_batched_tokens;
  limits.max_seqs = options.max_seqs;
  limits.max_queue = options.max_queue;
  limits.block_size = options.block_size;
  limits.context_length = config.context_length;
  limits.max_prompt_tokens = options.max_prompt_tokens > 0
                                 ? std::min(options.max_prompt_tokens, config.context_length)
                                 : config.context_length;
  limits.max_tokens_limit = options.max_tokens_limit;
  limits.kv_blocks_total = num_blocks;
  limits.max_tokens_in_pool = int64_t{num_blocks / config.num_layers} * options.block_size;

  std::unique_ptr<Engine> engine(new Engine(model, limits));
  Impl& impl = *engine->impl_;
  impl.model = model;
  impl.limits = limits;
  impl.observer = observer;
  impl.pool = *std::move(pool);
  impl.hidden_size = config.hidden_size;
  impl.published.kv_blocks_total = num_blocks;
  impl.published.kv_blocks_free = num_blocks;
  spdlog::info(
      "engine: KV pool {} blocks x {} tokens ({:.1f} MiB, {} tokens per sequence at most), "
      "max_batched_tokens={} max_seqs={} max_queue={}",
      num_blocks, options.block_size,
      static_cast<double>(layout.bytes_per_block()) * num_blocks / (1 << 20),
      limits.max_tokens_in_pool, limits.max_batched_tokens, limits.max_seqs, limits.max_queue);
  impl.thread = std::thread([&impl] { impl.Run(); });
  return engine;
}

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request,
                                        std::shared_ptr<RequestSink> sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("sink is null");
  const model::ModelConfig& config = model_->config();
  const int32_t vocab = config.vocab_size;

  const int64_t prompt_len = static_cast<int64_t>(request.prompt_tokens.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("prompt_tokens: the prompt is empty");
  int64_t embedding_rows = 0;
  for (int64_t i = 0; i < prompt_len; ++i) {
    const int32_t id = request.prompt_tokens[i];
    if (id == model::kEmbeddingInput) {
      ++embedding_rows;
    } else if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt_tokens[%d]: token id %d is outside the vocabulary [0, %d)", i, id, vocab));
    }
  }
  const int64_t want_floats = embedding_rows * config.hidden_size;
  if (static_cast<int64_t>(request.embeddings.size()) != want_floats) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "embeddings: got %d floats, expected %d (%d embedding positions x hidden size %d)",
        request.embeddings.size(), want_floats, embedding_rows, config.hidden_size));
  }
  for (size_t i = 0; i < request.embeddings.size(); ++i) {
    if (!std::isfinite(request.embeddings[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "embeddings: row %d column %d is not finite", i / config.hidden_size,
          i % config.hidden_size));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: must be at least 1, got ", request.max_tokens));
  }
  if (limits_.max_tokens_limit > 0 && request.max_tokens > limits_.max_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_tokens: %d exceeds the server limit of %d", request.max_tokens,
        limits_.max_tokens_limit));
  }
  if (absl::Status s = request.sampling.Validate(); !s.ok()) return s;
  for (size_t i = 0; i < request.stop_strings.size(); ++i) {
    if (request.stop_strings[i].empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("stop_strings[%d]: empty", i));
    }
  }
  for (size_t i = 0; i < request.stop_token_ids.size(); ++i) {
    const int32_t id = request.stop_token_ids[i];
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_token_ids[%d]: token id %d is outside the vocabulary [0, %d)", i, id, vocab));
    }
  }
  // Also validates the prompt spans, the budget and the policy's params.
  absl::StatusOr<std::unique_ptr<cache::CompressionSession>> compression =
      MakeCompressionSession(*model_, limits_.block_size, request,
                             static_cast<int32_t>(prompt_len));
  if (!compression.ok()) return compression.status();
  if (prompt_len > limits_.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt_tokens: the prompt has %d tokens, more than the limit of %d", prompt_len,
        limits_.max_prompt_tokens));
  }
  const int64_t total = prompt_len + request.max_tokens;
  if (total > limits_.context_length) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) = %d exceeds the model context of %d tokens",
        prompt_len, request.max_tokens, total, limits_.context_length));
  }
  // The last generated token is never fed back, so its K/V is never stored.
  const int64_t kv_slots = total - 1;
  int64_t blocks_needed = int64_t{config.num_layers} * CeilDiv(kv_slots, limits_.block_size);
  if (*compression != nullptr) {
    // The uncompressed prompt must fit (the prefill peak), then the compressed footprint at
    // max_tokens (each layer rounds up to whole blocks, hence the extra block per layer).
    const int64_t peak = int64_t{config.num_layers} * CeilDiv(prompt_len, limits_.block_size);
    const int64_t steady =
        CeilDiv((*compression)->SteadyStateSlots(static_cast<int32_t>(prompt_len),
                                                 request.max_tokens - 1),
                limits_.block_size) +
        config.num_layers;
    blocks_needed = std::max(peak, std::min(steady, blocks_needed));
  }
  if (*compression != nullptr && blocks_needed > limits_.kv_blocks_total) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) with compression policy %s at budget %g needs %d "
        "KV blocks (the larger of the uncompressed prompt and the compressed footprint at "
        "max_tokens) but the whole pool has %d, enough for %d tokens per sequence",
        prompt_len, request.max_tokens, request.compression.policy, request.compression.budget,
        blocks_needed, limits_.kv_blocks_total, limits_.max_tokens_in_pool));
  }
  if (blocks_needed > limits_.kv_blocks_total) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) needs %d KV blocks (%d layers x %d blocks of %d "
        "tokens) but the whole pool has %d, enough for %d tokens per sequence",
        prompt_len, request.max_tokens, blocks_needed, config.num_layers,
        CeilDiv(kv_slots, limits_.block_size), limits_.block_size, limits_.kv_blocks_total,
        limits_.max_tokens_in_pool));
  }

  // Build the sequence outside the lock: it copies the prompt and seeds the sampler.
  auto seq = std::make_unique<Sequence>(*model_, limits_.block_size, std::move(request),
                                        std::move(sink));
  seq->tokens = seq->req.prompt_tokens;
  seq->prompt_len = static_cast<int32_t>(prompt_len);
  seq->compression = *std::move(compression);
  seq->emb_prefix.resize(prompt_len + 1);
  std::vector<int32_t> prompt_ids;
  prompt_ids.reserve(prompt_len);
  for (int64_t i = 0; i < prompt_len; ++i) {
    const int32_t id = seq->tokens[i];
    seq->emb_prefix[i + 1] = seq->emb_prefix[i] + (id == model::kEmbeddingInput ? 1 : 0);
    if (id != model::kEmbeddingInput) prompt_ids.push_back(id);
  }
  seq->sampler.AddPromptTokens(prompt_ids);
  seq->tokens.reserve(total);
  seq->submit_time = absl::Now();

  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopping) return absl::UnavailableError("engine is shut down");
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
  impl_->wake_cv.notify_one();
  return id;
}

bool Engine::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->live.contains(id)) return false;
  impl_->cancels.push_back(id);
  impl_->wake_cv.notify_one();
  return true;
}

EngineSnapshot Engine::Snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
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
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->draining = true;
}

bool Engine::WaitForIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  auto idle = [this] { return impl_->live.empty(); };
  if (timeout == absl::InfiniteDuration()) {
    impl_->idle_cv.wait(lock, idle);
    return true;
  }
  return impl_->idle_cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), idle);
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->wake_cv.notify_one();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

// ---------------------------------------------------------------------------------------------
// Engine thread.

void Engine::Impl::Run() {
  // Gauges (pool size, free blocks) are visible from start-up, before any request arrives.
  Publish();
  while (true) {
    std::vector<std::unique_ptr<Sequence>> arrived;
    std::vector<uint64_t> to_cancel;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (seqs.empty()) {
        wake_cv.wait(lock, [this] { return stopping || !inbox.empty() || !cancels.empty(); });
      }
      // Until the next Publish these count as waiting, so Submit's queue-full check and
      // Snapshot never lose sight of them in between.
      published.waiting += static_cast<int32_t>(inbox.size());
      while (!inbox.empty()) {
        arrived.push_back(std::move(inbox.front()));
        inbox.pop_front();
      }
      to_cancel.swap(cancels);
      stop = stopping;
    }
    for (std::unique_ptr<Sequence>& s : arrived) {
      if (observer) observer->OnRequestQueued(s->id, s->prompt_len);
      seqs.push_back(std::move(s));
    }

    if (stop) {
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
    for (uint64_t id : to_cancel) {
      for (auto& s : seqs) {
        if (s->id == id && !s->finished) {
          Finish(s.get(), FinishReason::kCancelled, absl::CancelledError("request cancelled"));
        }
      }
    }
    const absl::Time now = absl::Now();
    for (auto& s : seqs) {
      if (!s->finished && now >= s->req.deadline) {
        Finish(s.get(), FinishReason::kDeadline,
               absl::DeadlineExceededError("request deadline passed"));
      }
    }
    RemoveFinished();
    if (!seqs.empty()) {
      if (!Step()) {
        // Cannot happen while every admitted request fits the pool alone (Submit checks
        // that); if it does, wait for a cancel or deadline instead of spinning.
        spdlog::error("engine: {} requests but nothing schedulable", seqs.size());
        std::unique_lock<std::mutex> lock(mu);
        wake_cv.wait_for(lock, std::chrono::milliseconds(10));
      }
      RemoveFinished();
    }
    CheckPoolInvariant();
    Publish();
  }
}

int32_t Engine::Impl::TokensThatFit(const Sequence& s, int32_t want) const {
  const int32_t free_blocks = pool->num_free();
  if (s.kv.BlocksNeeded(want) <= free_blocks) return want;
  int32_t lo = 0, hi = want;  // invariant: lo fits, hi does not
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (s.kv.BlocksNeeded(mid) <= free_blocks) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

bool Engine::Impl::Step() {
  struct Planned {
    Sequence* seq;
    int32_t start;
    int32_t count;
    bool removed = false;  // preempted after being planned
  };
  std::vector<Planned> plan;
  int32_t budget = limits.max_batched_tokens;
  int32_t planned_seqs = 0;
  int32_t preempted_now = 0;

  std::vector<Sequence*> running;
  std::vector<Sequence*> waiting;
  for (auto& s : seqs) (s->running ? running : waiting).push_back(s.get());
  std::sort(running.begin(), running.end(), Before);
  std::sort(waiting.begin(), waiting.end(), Before);

  // Preempts the last running sequence in scheduling order; returns it.
  auto preempt_lowest = [&]() -> Sequence* {
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      Sequence* victim = *it;
      if (!victim->running) continue;
      for (Planned& p : plan) {
        if (p.seq == victim && !p.removed) {
          p.removed = true;
          budget += p.count;
          --planned_seqs;
        }
      }
      Preempt(victim);
      ++preempted_now;
      return victim;
    }
    return nullptr;
  };

  // Decodes first (one token each keeps every stream moving and is cheap), then the next chunk
  // of sequences still prefilling (or recomputing after a preemption).
  auto schedule_running = [&](Sequence* s) {
    if (!s->running || budget == 0) return;
    const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
    int32_t n = std::min(remaining, budget);
    while (true) {
      // A prefill chunk shrinks to what the pool holds rather than evicting anyone; a decode
      // token cannot shrink, so it preempts.
      const int32_t fit = TokensThatFit(*s, n);
      if (fit > 0) {
        n = fit;
        break;
      }
      Sequence* victim = preempt_lowest();
      if (victim == nullptr || victim == s) return;
    }
    if (!s->kv.Reserve(*pool, n)) {
      spdlog::critical("engine: KV reservation failed after fitting {} tokens", n);
      std::abort();
    }
    plan.push_back({s, s->num_computed, n});
    budget -= n;
    ++planned_seqs;
  };
  for (Sequence* s : running) {
    if (static_cast<int32_t>(s->tokens.size()) - s->num_computed == 1) schedule_running(s);
  }
  for (Sequence* s : running) {
    if (static_cast<int32_t>(s->tokens.size()) - s->num_computed > 1) schedule_running(s);
  }

  // Admission. After a preemption the pool is known to be short, so admitting now would only
  // set up the next preemption. A waiting sequence is admitted only when its whole first chunk
  // fits, and in strict order: letting a smaller, lower-priority request slip past would starve
  // long prompts.
  //
  // Compression-aware: a sequence with a policy holds its whole prompt uncompressed until its
  // last chunk has run, so it is admitted only when the free blocks, less what already-admitted
  // compressing sequences still need to finish their prefill, hold its whole prefill (the
  // peak), and every admission leaves those outstanding prefills room. Once compressed, a
  // sequence counts with the blocks it actually holds, so the blocks its compaction freed
  // admit waiting requests at the next iteration.
  //
  // Priority: a waiting sequence that does not fit may displace running sequences of strictly
  // lower priority (lowest first; they are recomputed later, like any preemption), but only
  // when displacing all of those would make room, so nothing is preempted for nothing. Equal
  // priorities never preempt each other: that is plain arrival order.
  if (preempted_now == 0) {
    int32_t holding = 0;
    for (Sequence* s : running) holding += s->running ? 1 : 0;
    // Blocks an admitted compressing sequence still needs to finish its prefill.
    auto outstanding_of = [](const Sequence* s) -> int64_t {
      if (!s->running || s->compression == nullptr || s->compression->compressed()) return 0;
      return s->kv.BlocksNeeded(static_cast<int32_t>(s->tokens.size()) - s->num_computed);
    };
    int64_t outstanding = 0;
    for (Sequence* s : running) outstanding += outstanding_of(s);
    auto fits = [&](int64_t need, int64_t freed, int64_t freed_outstanding, int32_t freed_seqs) {
      return holding - freed_seqs < limits.max_seqs &&
             need <= pool->num_free() + freed - (outstanding - freed_outstanding);
    };
    auto displace_lower_priority = [&](const Sequence* s, int64_t need) -> bool {
      int64_t freed = 0, freed_outstanding = 0;
      int32_t victims = 0;
      for (auto it = running.rbegin(); it != running.rend(); ++it) {
        const Sequence* r = *it;
        if (!r->running) continue;
        if (r->req.priority >= s->req.priority) break;  // sorted: no lower one is left
        freed += r->kv.num_blocks_held();
        freed_outstanding += outstanding_of(r);
        ++victims;
        if (fits(need, freed, freed_outstanding, victims)) {
          // preempt_lowest takes them in the same order this loop counted them.
          for (int32_t i = 0; i < victims; ++i) preempt_lowest();
          holding -= victims;
          outstanding -= freed_outstanding;
          return true;
        }
      }
      return false;
    };
    for (Sequence* s : waiting) {
      if (budget == 0) break;
      const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
      const int32_t n = std::min(remaining, budget);
      const bool compressing = s->compression != nullptr;
      const int64_t need = s->kv.BlocksNeeded(compressing ? remaining : n);
      if (compressing && need > pool->num_blocks()) {
        // Only after a preemption: the recomputed prompt + generated tokens outgrew the pool.
        Finish(s, FinishReason::kError,
               absl::ResourceExhaustedError(absl::StrFormat(
                   "preempted request must recompute %d tokens uncompressed before its policy "
                   "can compress them, which needs %d KV blocks; the pool has %d",
                   remaining, need, pool->num_blocks())));
        continue;
      }
      if (!fits(need, 0, 0, 0) && !displace_lower_priority(s, need)) break;
      if (!s->kv.Reserve(*pool, n)) break;
      if (compressing) outstanding += s->kv.BlocksNeeded(remaining - n);
      s->running = true;
      ++holding;
      if (!s->started) {
        s->started = true;
        s->start_time = absl::Now();
        if (observer) observer->OnRequestStarted(s->id, s->start_time - s->submit_time);
      }
      plan.push_back({s, s->num_computed, n});
      budget -= n;
      ++planned_seqs;
    }
  }

  std::erase_if(plan, [](const Planned& p) { return p.removed; });
  if (plan.empty()) return false;

  std::vector<model::BatchEntry> batch;
  batch.reserve(plan.size());
  IterationStats stats;
  stats.preemptions = preempted_now;
  for (const Planned& p : plan) {
    Sequence* s = p.seq;
    model::BatchEntry e;
    e.kv = &s->kv;
    e.tokens = std::span<const int32_t>(s->tokens).subspan(p.start, p.count);
    e.start_position = p.start;
    const int32_t end = p.start + p.count;
    if (p.start < s->prompt_len) {
      const int32_t first_row = s->emb_prefix[p.start];
      const int32_t rows = s->emb_prefix[std::min(end, s->prompt_len)] - first_row;
      e.embeddings = std::span<const float>(s->req.embeddings)
                         .subspan(int64_t{first_row} * hidden_size, int64_t{rows} * hidden_size);
    }
    const bool samples = end == static_cast<int32_t>(s->tokens.size());
    e.logits = samples ? model::LogitsMode::kLast : model::LogitsMode::kNone;
    if (s->compression != nullptr) {
      if (!s->compression->compressed()) {
        e.capture = s->compression->PrefillCapture(p.start, p.count);
      } else {
        e.attention_probs = s->compression->DecodeAttentionBuffer();
        e.selector = s->compression->selector();
      }
    }
    batch.push_back(e);
    stats.batch_tokens += p.count;
    if (samples && p.count == 1 && p.start >= s->prompt_len) {
      ++stats.decode_tokens;
    } else {
      stats.prefill_tokens += p.count;
    }
  }
  stats.batch_seqs = static_cast<int32_t>(plan.size());

  model::ForwardOutput out;
  const absl::Time t0 = absl::Now();
  const absl::Status status = model->Forward(batch, *pool, &out);
  stats.forward_time = absl::Now() - t0;
  if (observer) observer->OnIteration(stats);

  if (!status.ok()) {
    // The batch's caches may be half written; those sequences cannot continue.
    spdlog::error("engine: forward failed for {} sequences: {}", plan.size(), status.ToString());
    for (const Planned& p : plan) Finish(p.seq, FinishReason::kError, status);
    return true;
  }

  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence* s = plan[i].seq;
    s->num_computed += plan[i].count;
    s->kv_blocks_peak = std::max(s->kv_blocks_peak, s->kv.num_blocks_held());
    if (s->compression != nullptr) {
      // Before sampling: the first token comes from the full cache's logits (computed), and
      // a sequence that finishes on it must not be compressed after its blocks are gone.
      if (absl::Status st = AfterForward(s, plan[i].start, plan[i].count); !st.ok()) {
        spdlog::error("engine: compression failed for request {}: {}", s->id, st.ToString());
        Finish(s, FinishReason::kError, st);
        continue;
      }
    }
    if (batch[i].logits == model::LogitsMode::kNone) continue;
    const int32_t row = i < out.first_row.size() ? out.first_row[i] : -1;
    if (row < 0) {
      Finish(s, FinishReason::kError, absl::InternalError("forward returned no logits"));
      continue;
    }
    ProcessToken(s, s->sampler.Sample(out.Row(row)));
  }
  return true;
}

absl::Status Engine::Impl::AfterForward(Sequence* s, int32_t start, int32_t count) {
  cache::CompressionSession& c = *s->compression;
  if (c.compressed()) {
    // A decode step: the token at `start` has its K/V written; the policy may evict.
    const int64_t before = s->kv.num_blocks_held();
    int64_t slots_before = 0;
    for (int32_t l = 0; l < s->kv.num_layers(); ++l) slots_before += s->kv.num_slots(l);
    absl::StatusOr<cache::CompactionStats> st = c.AfterDecodeStep(start, s->kv, *pool);
    if (!st.ok()) return st.status();
    if (st->layers_changed > 0 && observer) {
      observer->OnCompression({s->id, c.policy_name(), false, slots_before,
                               slots_before - st->slots_removed,
                               static_cast<int32_t>(before - s->kv.num_blocks_held())});
    }
    return absl::OkStatus();
  }
  if (absl::Status st = c.AfterPrefillChunk(s->kv, *pool, model->threads()); !st.ok()) return st;
  if (s->num_computed < static_cast<int32_t>(s->tokens.size())) return absl::OkStatus();
  absl::StatusOr<cache::CompactionStats> st = c.Compress(s->kv, *pool, model->threads());
  if (!st.ok()) return st.status();
  s->compression_kept_per_layer = c.stats().kept_per_layer;
  if (observer) {
    observer->OnCompression({s->id, c.policy_name(), true, c.stats().slots_before,
                             c.stats().slots_after, st->blocks_freed});
  }
  return absl::OkStatus();
}

void Engine::Impl::Preempt(Sequence* s) {
  // Recompute, not swap: the prompt and generated tokens are kept, so re-prefilling them later
  // rebuilds exactly this cache, and the sampler (with its RNG state) carries on untouched.
  // A compressed sequence gets a fresh session: its recomputed prompt (now including the
  // generated tokens) is compressed again after its last chunk.
  if (s->compression != nullptr) {
    s->compression_blocks_freed += s->compression->stats().blocks_freed;
    s->compression_slots_evicted += s->compression->stats().slots_evicted;
    absl::StatusOr<std::unique_ptr<cache::CompressionSession>> fresh = MakeCompressionSession(
        *model, limits.block_size, s->req, static_cast<int32_t>(s->tokens.size()));
    // The spec was validated at Submit and the layout only grew, so this cannot fail; if it
    // did, the sequence would recompute uncompressed rather than fail.
    if (!fresh.ok()) spdlog::error("engine: recreating compression: {}", fresh.status().ToString());
    s->compression = fresh.ok() ? *std::move(fresh) : nullptr;
  }
  s->kv.Release(*pool);
  s->running = false;
  s->num_computed = 0;
  ++s->preemptions;
  ++preemptions_total;
  if (observer) observer->OnPreemption(s->id);
}

void Engine::Impl::ProcessToken(Sequence* s, const model::SampledToken& t) {
  const absl::Time now = absl::Now();
  s->tokens.push_back(t.id);
  ++s->num_generated;
  if (observer) {
    if (!s->has_first_token) {
      observer->OnFirstToken(s->id, now - s->submit_time);
    } else {
      observer->OnToken(s->id, now - s->last_token_time);
    }
  }
  if (!s->has_first_token) {
    s->has_first_token = true;
    s->first_token_time = now;
  }
  s->last_token_time = now;

  TokenEvent event;
  event.token_ids.push_back(t.id);
  if (s->req.logprobs) event.logprobs.push_back({t.id, t.logprob, t.top_logprobs});

  const model::Tokenizer& tokenizer = model->tokenizer();
  const bool eog = !s->req.ignore_eos && tokenizer.IsEndOfGeneration(t.id);
  const bool stop_id = std::find(s->req.stop_token_ids.begin(), s->req.stop_token_ids.end(),
                                 t.id) != s->req.stop_token_ids.end();
  bool done = false;
  FinishReason reason = FinishReason::kStop;
  bool matched = false;
  // An end-of-generation token ends the text; it is reported as a token but not rendered.
  if (!eog && t.id >= 0 && t.id < tokenizer.vocab_size()) {
    event.text = s->stops.Append(s->detok.Append(t.id), &matched);
  }
  if (matched) {
    done = true;
  } else if (eog || stop_id) {
    done = true;
  } else if (s->num_generated >= s->req.max_tokens ||
             static_cast<int32_t>(s->tokens.size()) >= limits.context_length) {
    done = true;
    reason = FinishReason::kLength;
  }
  if (done && !matched) {
    // Bytes the detokenizer held for an incomplete character may still complete a stop string.
    event.text += s->stops.Append(s->detok.Flush(), &matched);
    if (matched) {
      reason = FinishReason::kStop;
    } else {
      event.text += s->stops.Flush();
    }
  }
  s->sink->OnTokens(event);
  if (done) Finish(s, reason, absl::OkStatus());
}

void Engine::Impl::Finish(Sequence* s, FinishReason reason, absl::Status status) {
  if (s->finished) return;
  FinishEvent event;
  event.reason = reason;
  event.status = status;
  Usage& u = event.usage;
  u.prompt_tokens = s->prompt_len;
  u.completion_tokens = s->num_generated;
  u.kv_blocks_at_finish = s->kv.num_blocks_held();
  u.kv_blocks_peak = std::max(s->kv_blocks_peak, u.kv_blocks_at_finish);
  u.kv_tokens_per_layer.resize(s->kv.num_layers());
  for (int32_t l = 0; l < s->kv.num_layers(); ++l) u.kv_tokens_per_layer[l] = s->kv.num_slots(l);
  u.preemptions = s->preemptions;
  u.kv_blocks_freed_by_compression = s->compression_blocks_freed;
  u.kv_tokens_evicted = s->compression_slots_evicted;
  if (s->compression != nullptr) {
    u.kv_blocks_freed_by_compression += s->compression->stats().blocks_freed;
    u.kv_tokens_evicted += s->compression->stats().slots_evicted;
  }
  u.kv_tokens_kept_per_layer = s->compression_kept_per_layer;

  s->kv.Release(*pool);
  s->running = false;
  s->finished = true;
  finished_ids.push_back(s->id);
  s->sink->OnFinish(event);
  s->sink.reset();

  if (observer) {
    RequestStats stats;
    stats.id = s->id;
    stats.request_id = s->req.request_id;
    stats.reason = reason;
    stats.status = status;
    stats.prompt_tokens = u.prompt_tokens;
    stats.completion_tokens = u.completion_tokens;
    stats.preemptions = u.preemptions;
    stats.kv_blocks_peak = u.kv_blocks_peak;
    stats.compression_policy =
        s->req.compression.policy == "none" ? std::string() : s->req.compression.policy;
    stats.kv_blocks_freed_by_compression = u.kv_blocks_freed_by_compression;
    stats.started = s->started;
    stats.has_first_token = s->has_first_token;
    if (s->started) stats.queue_time = s->start_time - s->submit_time;
    if (s->has_first_token) stats.ttft = s->first_token_time - s->submit_time;
    stats.e2e = absl::Now() - s->submit_time;
    observer->OnRequestFinished(stats);
  }
}

void Engine::Impl::RemoveFinished() {
  std::erase_if(seqs, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
}

void Engine::Impl::Publish() {
  SchedulerState state;
  for (const auto& s : seqs) (s->running ? state.running : state.waiting) += 1;
  state.kv_blocks_total = pool->num_blocks();
  state.kv_blocks_free = pool->num_free();
  state.preemptions_total = preemptions_total;
  // Observer first: once WaitForIdle returns, the gauges already show the idle state.
  if (observer) observer->OnSchedulerState(state);
  std::lock_guard<std::mutex> lock(mu);
  published = state;
  for (uint64_t id : finished_ids) live.erase(id);
  finished_ids.clear();
  if (live.empty()) idle_cv.notify_all();
}

void Engine::Impl::CheckPoolInvariant() const {
  int64_t held = 0;
  for (const auto& s : seqs) held += s->kv.num_blocks_held();
  if (held != pool->num_used()) {
    // Leaked or double-owned blocks corrupt other sequences' caches or shrink the pool for
    // good; in debug builds that is worth a crash, in release a loud log.
    spdlog::critical("engine: KV pool says {} blocks in use but sequences hold {}",
                     pool->num_used(), held);
#ifndef NDEBUG
    std::abort();
#endif
  }
}

}  // namespace winnow::scheduler
