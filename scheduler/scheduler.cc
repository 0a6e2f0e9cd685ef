#include "scheduler/scheduler.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "cache/prefix_cache.h"
#include "spdlog/spdlog.h"

namespace winnow::scheduler {
namespace {

// A prefill chunk of `count` tokens from `start` that would end inside the prompt's observation
// window stops where the window begins instead, so that the window arrives in one forward with
// the end of the prompt: a device forward then plans and compacts while it runs
// (QueryCapture::device_plan) instead of sending rows to the host. Only when the shorter chunk
// is not empty, so the prefill always moves on.
int32_t KeepWindowWhole(const Sequence& s, int32_t start, int32_t count) {
  if (!s.awaits_compression()) return count;
  const int32_t window_begin = s.compression->DeviceWindowBegin();
  const int32_t end = start + count;
  if (window_begin <= start || end <= window_begin || end >= s.compression->num_tokens()) {
    return count;
  }
  return window_begin - start;
}

// A chunk of a sequence awaiting compression stops where what its policy compresses ends (the
// prompt, or with CompressionSpec::context_tokens its context), so the plan runs before any
// later token is computed.
int32_t StopWhereCompressionRuns(const Sequence& s, int32_t start, int32_t count) {
  if (!s.awaits_compression()) return count;
  const int32_t end = s.compression->num_tokens();
  return start < end && start + count > end ? end - start : count;
}

// Both cuts above, for a chunk of up to `count` tokens from `start`.
int32_t CutPrefillChunk(const Sequence& s, int32_t start, int32_t count) {
  return KeepWindowWhole(s, start, StopWhereCompressionRuns(s, start, count));
}

// Slots a chunk of `count` tokens from `start` reserves beyond its own: those of the probe
// segments that
// the worker runs right after it when it completes a context whose probe is pending
// (CompressionSession::SetProbe), so that the probe finds them.
int32_t ProbeAfter(const Sequence& s, int32_t start, int32_t count) {
  if (!s.awaits_compression() || !s.compression->probe_pending() ||
      start + count != s.compression->num_tokens()) {
    return 0;
  }
  return s.compression->ProbeFootprint();
}

// Builds one IterationPlan. Holds the iteration's running tallies (token budget, sequences
// holding blocks, blocks that admitted compressing sequences still need) so each step below
// reads like the rule it implements.
class IterationBuilder {
 public:
  IterationBuilder(const SchedulerLimits& limits, cache::BlockPool& pool,
                   cache::CompressedPrefixCache* contexts, std::span<Sequence* const> live)
      : limits_(limits), pool_(pool), contexts_(contexts), budget_(limits.max_batched_tokens) {
    for (Sequence* s : live) (s->running() ? running_ : waiting_).push_back(s);
    std::sort(running_.begin(), running_.end(), ScheduledBefore);
    std::sort(waiting_.begin(), waiting_.end(), ScheduledBefore);
  }

  IterationPlan Build() {
    for (Sequence* s : running_) {
      if (s->num_uncomputed() == 1) ScheduleRunning(s);
    }
    for (Sequence* s : running_) {
      if (s->num_uncomputed() > 1) ScheduleRunning(s);
    }
    // After a preemption the pool is known to be short: admitting now would only set up the
    // next preemption.
    if (plan_.preempted.empty()) AdmitWaiting();
    return std::move(plan_);
  }

 private:
  void ScheduleRunning(Sequence* s);
  void AdmitWaiting();
  // What admitting a waiting sequence takes: prefix-cache hits (a compressed context, or whole
  // blocks per layer), the tokens left to compute, this iteration's chunk, and the free blocks
  // it consumes.
  struct Admission {
    const cache::CompressedContext* context = nullptr;  // found compressed: attached whole
    int32_t stage = 0;          // the context's stage it ends (the last of those attached)
    int32_t hit_blocks = 0;     // cached prompt blocks found in every layer
    int32_t cached_blocks = 0;  // hit_blocks x layers
    int32_t rest = 0;           // tokens to compute after the hit
    int32_t chunk = 0;          // of which this iteration
    int64_t need = 0;           // free blocks it needs now (the peak, when compressing)
  };
  Admission PlanAdmission(const Sequence& s) const;
  // A sequence whose context was found compressed up to the end of `stage`: attaches it and
  // computes the rest (compressing the later stages).
  Admission PlanContextAdmission(const Sequence& s, const cache::CompressedContext& c,
                                 int32_t stage) const;
  // Attaches the hit, reserves the chunk and marks the sequence running; false (and nothing
  // changed) when the reservation fails, or when the attach failed (the sequence is rejected).
  bool Admit(Sequence* s, const Admission& a);
  // Admit for a compressed context found: attaches it, reserves the chunk after it, and either
  // adopts it as the sequence's compression or starts the next stage's after it; false (kv
  // empty again, the sessions untouched) when the reservation fails.
  bool AdmitWithContext(Sequence* s, const Admission& a);
  // Preempts the last running sequence in scheduling order; returns it (null: none left).
  Sequence* PreemptLowest();
  // Preempts running sequences of lower priority than `s` when that makes room for `need`
  // blocks; false (and nothing preempted) otherwise.
  bool DisplaceLowerPriority(const Sequence* s, int64_t need);
  // Whether `need` more blocks and one more sequence fit once `freed_seqs` sequences holding
  // `freed` blocks (of which `freed_outstanding` were owed to prefills) are gone.
  bool Fits(int64_t need, int64_t freed, int64_t freed_outstanding, int32_t freed_seqs) const {
    return holding_ - freed_seqs < limits_.max_seqs &&
           need <= pool_.num_free() + freed - (outstanding_ - freed_outstanding);
  }
  // Blocks an admitted compressing sequence still needs to finish its prefill.
  // (Also the private copies of its attached cached blocks, made before compaction, and those
  // of its compressed context's partial blocks, made when it is published.)
  int64_t Outstanding(const Sequence* s) const {
    if (!s->running() || !s->awaits_compression()) return 0;
    return s->kv.BlocksNeeded(s->UncompressedPeak(s->num_computed)) + s->attached_cached_blocks +
           PublishReserve(*s);
  }
  // The free blocks a sequence that will publish its compressed context takes then (copies of
  // its partial blocks), counted only when its prefill's peak leaves room for them in the
  // whole pool: otherwise it could never be admitted, so it runs and publishes only if blocks
  // happen to be free by then.
  int64_t PublishReserve(const Sequence& s) const {
    const int32_t blocks = s.ContextPublishBlocks();
    const int64_t peak =
        s.kv.num_blocks_held() + s.kv.BlocksNeeded(s.UncompressedPeak(s.num_computed));
    return blocks > 0 && peak + blocks <= pool_.num_blocks() ? blocks : 0;
  }
  // Largest n <= want whose K/V fit in `blocks` new blocks (0 when not even one token does).
  static int32_t TokensWithin(const Sequence& s, int32_t want, int32_t blocks);
  // ... in the free blocks.
  int32_t TokensThatFit(const Sequence& s, int32_t want) const {
    return TokensWithin(s, want, pool_.num_free());
  }
  // A chunk whose logits are all kept (prompt_logprobs) takes at most what is left of the
  // iteration's kPromptLogprobsChunk such rows (0: it waits for the next iteration): a device
  // forward's logits buffers hold one row per sequence and that many more (engine.cc).
  int32_t LimitScoredChunk(const Sequence& s, int32_t start, int32_t count) const {
    return s.ScoresPrompt(start) ? std::min(count, scored_budget_) : count;
  }
  void AddChunk(Sequence* s, int32_t count);

  const SchedulerLimits& limits_;
  cache::BlockPool& pool_;
  cache::CompressedPrefixCache* contexts_;
  std::vector<Sequence*> running_;  // sorted by ScheduledBefore
  std::vector<Sequence*> waiting_;  // sorted by ScheduledBefore
  IterationPlan plan_;
  int32_t budget_;           // tokens this forward may still take
  int32_t scored_budget_ = kPromptLogprobsChunk;  // rows whose logits all come back (ditto)
  int32_t holding_ = 0;      // sequences holding blocks (set by AdmitWaiting)
  int64_t outstanding_ = 0;  // sum of Outstanding() over running sequences (AdmitWaiting)
};

void IterationBuilder::ScheduleRunning(Sequence* s) {
  if (!s->running() || budget_ == 0) return;
  int32_t n = LimitScoredChunk(
      *s, s->num_computed,
      CutPrefillChunk(*s, s->num_computed, std::min(s->num_uncomputed(), budget_)));
  if (n == 0) return;  // scored rows are used up: next iteration
  while (true) {
    // A prefill chunk shrinks to what the pool holds rather than evicting anyone; a decode
    // token cannot shrink, so it preempts.
    const int32_t fit = TokensThatFit(*s, n);
    if (fit > 0) {
      n = fit;
      break;
    }
    Sequence* victim = PreemptLowest();
    if (victim == nullptr || victim == s) return;
  }
  int32_t probe = ProbeAfter(*s, s->num_computed, n);
  if (probe > 0 && s->kv.BlocksNeeded(n + probe) > pool_.num_free()) {
    // The context's last chunk waits for room for its probe (admission counted it; decodes
    // of others may hold it for a while): stop short of the context's end until then.
    if (n == 1) return;
    n -= 1;
    probe = 0;
  }
  if (!s->kv.Reserve(pool_, n + probe)) {
    spdlog::critical("scheduler: KV reservation failed after fitting {} tokens", n + probe);
    std::abort();
  }
  AddChunk(s, n);
}

Sequence* IterationBuilder::PreemptLowest() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* victim = *it;
    if (!victim->running()) continue;
    std::erase_if(plan_.chunks, [&](const ScheduledChunk& c) {
      if (c.seq != victim) return false;
      budget_ += c.count;
      if (victim->ScoresPrompt(c.start)) scored_budget_ += c.count;
      return true;
    });
    // Recompute, not swap: the tokens are kept, so re-prefilling them later rebuilds exactly
    // this cache.
    victim->kv.Release(pool_);
    victim->state = SequenceState::kWaiting;
    victim->num_computed = 0;
    victim->published_blocks = 0;
    victim->attached_cached_blocks = 0;
    ++victim->preemptions;
    plan_.preempted.push_back(victim);
    return victim;
  }
  return nullptr;
}

void IterationBuilder::AdmitWaiting() {
  for (Sequence* s : running_) {
    holding_ += s->running() ? 1 : 0;
    outstanding_ += Outstanding(s);
  }
  for (Sequence* s : waiting_) {
    if (budget_ == 0) break;
    const bool compressing = s->awaits_compression();
    // A compressing sequence must be able to hold its whole prompt before its policy runs.
    const int32_t peak = s->UncompressedPeak(s->num_computed);
    if (compressing && s->kv.BlocksNeeded(peak) > pool_.num_blocks()) {
      // Only after a preemption: the recomputed prompt + generated tokens outgrew the pool.
      plan_.rejected.push_back(
          {s, absl::ResourceExhaustedError(absl::StrFormat(
                  "preempted request must recompute %d tokens uncompressed before its policy "
                  "can compress them, which needs %d KV blocks; the pool has %d",
                  peak, s->kv.BlocksNeeded(peak), pool_.num_blocks()))});
      continue;
    }
    const Admission a = PlanAdmission(*s);
    // Strict order: letting a smaller, lower-priority request slip past would starve long
    // prompts.
    if (a.context == nullptr && a.chunk == 0) break;  // scored rows used up (LimitScoredChunk)
    if (!Fits(a.need, 0, 0, 0) && !DisplaceLowerPriority(s, a.need)) break;
    if (!Admit(s, a)) break;
    outstanding_ += Outstanding(s);
    ++holding_;
  }
}

IterationBuilder::Admission IterationBuilder::PlanAdmission(const Sequence& s) const {
  if (contexts_ != nullptr && s.MayAttachContext()) {
    // The longest of the context's stages published (a chat's history up to an earlier turn).
    for (int32_t i = s.num_stages() - 1; i >= 0; --i) {
      if (const cache::CompressedContext* c = contexts_->Find(s.context_keys[i]); c != nullptr) {
        return PlanContextAdmission(s, *c, i);
      }
    }
  }
  Admission a;
  const int32_t layers = pool_.layout().num_layers;
  const int32_t block_size = pool_.layout().block_size;
  if (!s.prefix_keys.empty()) {
    a.hit_blocks = cache::CountCachedBlocks(pool_, s.prefix_keys, layers,
                                            s.CacheablePrefix() / block_size);
  }
  a.cached_blocks = a.hit_blocks * layers;
  a.rest = s.num_uncomputed() - a.hit_blocks * block_size;
  a.chunk = LimitScoredChunk(
      s, a.hit_blocks * block_size,
      CutPrefillChunk(s, a.hit_blocks * block_size, std::min(a.rest, budget_)));
  const bool compressing = s.awaits_compression();
  if (!compressing) {
    // A first chunk larger than the whole pool starts with what an empty pool holds: a
    // sliding-window model's long prompt runs on the blocks its windows give back (the engine
    // admitted it on that count), its later chunks shrinking to what is free.
    a.chunk = TokensWithin(s, a.chunk, pool_.num_blocks());
  }
  // New blocks for the chunk (compressing: for the whole rest of the prompt, its peak), the
  // cached blocks that leave the free queue when attached, and (compressing) a private copy
  // of each attached block, made before compaction rewrites the cache in place.
  a.need = s.kv.BlocksNeeded(compressing ? s.UncompressedPeak(a.hit_blocks * block_size)
                                         : a.chunk) +
           PublishReserve(s);
  if (a.hit_blocks > 0) {
    a.need += cache::CountFreeCachedBlocks(pool_, s.prefix_keys, layers, a.hit_blocks);
    if (compressing) a.need += a.cached_blocks;
  }
  return a;
}

IterationBuilder::Admission IterationBuilder::PlanContextAdmission(
    const Sequence& s, const cache::CompressedContext& c, int32_t stage) const {
  Admission a;
  a.context = &c;
  a.stage = stage;
  a.rest = s.num_uncomputed() - c.num_tokens;
  a.chunk = std::min(a.rest, budget_);
  a.need = contexts_->BlocksToAttach(c);
  if (stage + 1 == s.num_stages()) {
    a.need += contexts_->BlocksForSuffix(c, a.chunk);
    return a;
  }
  // Later stages to compress: the first chunk stops where the next one's compression runs,
  // and the peak is the rest uncompressed, or a stage's probe after it, and a publish's copies.
  const cache::CompressionSession& next = s.StageSession(stage + 1);
  a.chunk = std::min(a.chunk, next.num_tokens() - c.num_tokens);
  int32_t peak = a.rest;
  for (int32_t i = stage + 1; i < s.num_stages(); ++i) {
    const cache::CompressionSession& later = s.StageSession(i);
    peak = std::max(peak, later.num_tokens() + later.ProbeFootprint() - c.num_tokens);
  }
  a.need += contexts_->BlocksForSuffix(c, peak) + s.kv.num_layers();
  return a;
}

bool IterationBuilder::AdmitWithContext(Sequence* s, const Admission& a) {
  const bool more = a.stage + 1 < s->num_stages();
  // A chunk that completes the next stage reserves its probe too.
  const cache::CompressionSession* next = more ? &s->StageSession(a.stage + 1) : nullptr;
  const bool completes = next != nullptr && a.context->num_tokens + a.chunk == next->num_tokens();
  const int32_t probe = completes && next->probe_pending() ? next->ProbeFootprint() : 0;
  absl::Status attached = contexts_->Attach(*a.context, s->kv);
  if (attached.ok() && !s->kv.Reserve(pool_, a.chunk + probe)) {
    attached = absl::ResourceExhaustedError("no free KV block for the chunk after the context");
  }
  if (attached.ok()) {
    attached = more ? s->StartStage(a.stage + 1, a.context->positions)
                    : s->AdoptStages(a.stage, a.context->positions);
    if (absl::IsResourceExhausted(attached)) attached = absl::InternalError(attached.message());
  }
  if (!attached.ok()) {
    // Short of blocks only when displaced sequences shared the context's blocks (fewer were
    // freed than counted): wait. Anything else (a device's copy error) fails the request.
    s->kv.Release(pool_);
    if (!absl::IsResourceExhausted(attached)) plan_.rejected.push_back({s, attached});
    return false;
  }
  s->num_computed = a.context->num_tokens;
  s->state = SequenceState::kRunning;
  plan_.admitted.push_back(s);
  // (Queried: the whole context; a chat's history may be found up to an earlier stage.)
  plan_.prefix_lookups.push_back({s, /*compressed_context=*/true,
                                  s->req.compression.context_tokens, a.context->num_tokens,
                                  contexts_->KvBytes(*a.context)});
  AddChunk(s, a.chunk);
  return true;
}

bool IterationBuilder::Admit(Sequence* s, const Admission& a) {
  if (a.context != nullptr) return AdmitWithContext(s, a);
  const int32_t block_size = pool_.layout().block_size;
  // Attach before reserving, so the reservation cannot reclaim the blocks being reused.
  if (a.hit_blocks > 0) cache::AttachCachedPrefix(pool_, s->prefix_keys, a.hit_blocks, s->kv);
  s->num_computed = a.hit_blocks * block_size;
  if (!s->kv.Reserve(pool_, a.chunk + ProbeAfter(*s, s->num_computed, a.chunk))) {
    // Only when displaced sequences shared the reused blocks, so fewer were freed than
    // counted: undo and wait.
    s->kv.Release(pool_);
    s->num_computed = 0;
    return false;
  }
  s->attached_cached_blocks = a.cached_blocks;
  s->state = SequenceState::kRunning;
  plan_.admitted.push_back(s);
  if (contexts_ != nullptr && s->MayAttachContext()) {  // looked up, not found
    plan_.prefix_lookups.push_back({s, /*compressed_context=*/true,
                                    s->req.compression.context_tokens});
  }
  if (!s->prefix_keys.empty()) {
    plan_.prefix_lookups.push_back(
        {s, /*compressed_context=*/false, s->prompt_len, s->num_computed});
  }
  AddChunk(s, a.chunk);
  return true;
}

bool IterationBuilder::DisplaceLowerPriority(const Sequence* s, int64_t need) {
  int64_t freed = 0, freed_outstanding = 0;
  int32_t victims = 0;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    const Sequence* r = *it;
    if (!r->running()) continue;
    if (r->req.priority >= s->req.priority) break;  // sorted: no lower one is left
    freed += r->kv.BlocksFreedByRelease(pool_);
    freed_outstanding += Outstanding(r);
    ++victims;
    if (Fits(need, freed, freed_outstanding, victims)) {
      // PreemptLowest takes them in the order this loop counted them.
      for (int32_t i = 0; i < victims; ++i) PreemptLowest();
      holding_ -= victims;
      outstanding_ -= freed_outstanding;
      return true;
    }
  }
  return false;
}

int32_t IterationBuilder::TokensWithin(const Sequence& s, int32_t want, int32_t blocks) {
  if (s.kv.BlocksNeeded(want) <= blocks) return want;
  int32_t lo = 0, hi = want;  // invariant: lo fits, hi does not
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    (s.kv.BlocksNeeded(mid) <= blocks ? lo : hi) = mid;
  }
  return lo;
}

void IterationBuilder::AddChunk(Sequence* s, int32_t count) {
  ScheduledChunk chunk;
  chunk.seq = s;
  chunk.start = s->num_computed;
  chunk.count = count;
  chunk.samples = s->num_computed + count == s->num_tokens();
  plan_.chunks.push_back(chunk);
  budget_ -= count;
  if (s->ScoresPrompt(chunk.start)) scored_budget_ -= count;
}

}  // namespace

int32_t IterationPlan::num_tokens() const {
  int32_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.count;
  return n;
}

Scheduler::Scheduler(const SchedulerLimits& limits, cache::BlockPool& pool,
                     cache::CompressedPrefixCache* contexts)
    : limits_(limits), pool_(pool), contexts_(contexts) {}

IterationPlan Scheduler::Schedule(std::span<Sequence* const> live) {
  return IterationBuilder(limits_, pool_, contexts_, live).Build();
}

void Scheduler::PublishContext(Sequence& s) {
  const cache::CompressionSession& c = *s.compression;
  absl::StatusOr<bool> published =
      contexts_->Publish(s.context_key(), c.num_tokens(), c.slot_positions(), s.kv);
  // The sequence's own cache is intact either way; a context whose copy failed is not
  // published (and a lost device fails the next forward).
  if (!published.ok()) {
    spdlog::error("scheduler: request {}'s compressed context not published: {}", s.id,
                  published.status().ToString());
  }
}

void Scheduler::OnChunkComputed(const ScheduledChunk& chunk) {
  Sequence& s = *chunk.seq;
  s.num_computed += chunk.count;
  const bool stage_done = s.compression != nullptr && s.compression->compressed() &&
                          chunk.start + chunk.count == s.compression->num_tokens();
  if (stage_done && contexts_ != nullptr && s.context_key() != 0) PublishContext(s);
  if (stage_done && s.stage + 1 < s.num_stages()) {
    // The next stage of the context compresses after this one. Should it fail to start (it
    // cannot: its policy was checked at Submit), the rest stays whole, as after a context.
    absl::Status started = s.StartStage(s.stage + 1, s.compression->slot_positions());
    if (!started.ok()) {
      spdlog::error("scheduler: request {}'s next context stage: {}", s.id, started.ToString());
    }
  }
  if (s.compression == nullptr) {
    PublishPrefix(s);  // first: a block is keyed before it may be dropped
    DropBehindWindows(s);
  } else if (ReadsOnlyItsWindows(s)) {
    DropBehindWindows(s);  // its compacted slots behind the windows (never prefix blocks)
  }
}

// A compressing sequence reads every slot of a layer until its last stage is planned and
// compacted; after that only a policy that evicts or selects while decoding reads past a
// sliding window (it scores every slot), so the others' blocks behind the windows can go.
bool Scheduler::ReadsOnlyItsWindows(Sequence& s) {
  cache::CompressionSession& c = *s.compression;
  return c.compressed() && !c.prompt_plan_pending() && s.stage + 1 >= s.num_stages() &&
         !c.EvictsDuringDecode() && c.selector() == nullptr;
}

void Scheduler::PublishPrefix(Sequence& s) {
  if (s.prefix_keys.empty()) return;
  const int32_t full = std::min(std::min(s.num_computed, s.prompt_len) / pool_.layout().block_size,
                                static_cast<int32_t>(s.prefix_keys.size()));
  if (full <= s.published_blocks) return;
  cache::PublishPrefixBlocks(pool_, s.prefix_keys, s.published_blocks, full, s.kv);
  s.published_blocks = full;
}

void Scheduler::DropBehindWindows(Sequence& s) {
  const std::vector<int32_t>& windows = limits_.layer_windows;
  for (int32_t l = 0; l < static_cast<int32_t>(windows.size()); ++l) {
    // The next token, at slot num_slots, sees [num_slots - window + 1, num_slots].
    if (windows[l] > 0) s.kv.DropBlocksBefore(pool_, l, s.kv.num_slots(l) - windows[l] + 1);
  }
}

void Scheduler::Release(Sequence& seq) {
  seq.kv.Release(pool_);
  seq.state = SequenceState::kFinished;
}

}  // namespace winnow::scheduler
