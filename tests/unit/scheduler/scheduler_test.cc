// The scheduler alone: no model, no tokenizer. A scripted worker stands in for the forward (it
// records the K/V slots the scheduler reserved, and "samples" token 7), so every test runs in
// microseconds and checks only decisions: admission, chunk sizes, preemption, priorities and
// block accounting.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cache/block_pool.h"
#include "cache/host_scoring.h"
#include "cache/prefix_cache.h"
#include "kernels/cpu/thread_pool.h"
#include "scheduler/sequence.h"

namespace winnow::scheduler {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kBlockSize = 4;

struct Arrival {
  Arrival(int32_t prompt_len, int32_t max_tokens = 4, int32_t priority = 0,
          std::string policy = "", double budget = 0.0)
      : prompt_len(prompt_len),
        max_tokens(max_tokens),
        priority(priority),
        policy(std::move(policy)),
        budget(budget) {}

  int32_t prompt_len;
  int32_t max_tokens;
  int32_t priority;
  std::string policy;  // "" or a compression policy
  double budget;
};

// A pool, a scheduler and the sequences it schedules, driven one iteration at a time.
class Harness {
 public:
  Harness(int32_t num_blocks, SchedulerLimits limits, bool prefix_caching = false)
      : prefix_caching_(prefix_caching) {
    const cache::KvLayout layout{kLayers, /*num_kv_heads=*/1, /*head_dim=*/4, kBlockSize};
    pool_ = *cache::BlockPool::Create(layout, num_blocks);
    if (prefix_caching) contexts_ = std::make_unique<cache::CompressedPrefixCache>(*pool_);
    scheduler_ = std::make_unique<Scheduler>(limits, *pool_, contexts_.get());
  }
  ~Harness() {
    for (auto& s : seqs_) s->kv.Release(*pool_);
  }

  // `tokens` (default: prompt_len ones) matter only with prefix caching.
  Sequence* Add(const Arrival& a, std::vector<int32_t> tokens = {}, std::string salt = "") {
    GenerationRequest r;
    r.prompt_tokens = tokens.empty() ? std::vector<int32_t>(a.prompt_len, 1) : tokens;
    r.max_tokens = a.max_tokens;
    r.priority = a.priority;
    r.compression.policy = a.policy;
    r.compression.budget = a.budget;
    // streaming_llm would also evict while decoding; these tests count prompt plans only.
    if (a.policy == "streaming_llm") r.compression.params["decode"] = std::string("off");
    auto seq = std::make_unique<Sequence>(std::move(r), kLayers, kBlockSize);
    seq->id = seq->arrival = static_cast<uint64_t>(seqs_.size());
    if (prefix_caching_) {
      seq->prefix_keys = cache::PrefixBlockKeys(seq->tokens, {}, 0, kBlockSize, salt);
    }
    if (!a.policy.empty()) {
      auto session = MakeCompressionSession({kLayers, 1, 1, 4, kBlockSize}, seq->req,
                                            a.prompt_len);
      EXPECT_TRUE(session.ok()) << session.status();
      seq->compression = std::move(*session);
    }
    seqs_.push_back(std::move(seq));
    return seqs_.back().get();
  }

  // Plans one iteration and executes it with the scripted worker.
  IterationPlan Step() {
    std::vector<Sequence*> live;
    for (auto& s : seqs_) {
      if (!s->finished()) live.push_back(s.get());
    }
    IterationPlan plan = scheduler_->Schedule(live);
    for (IterationPlan::Rejection& r : plan.rejected) scheduler_->Release(*r.seq);
    for (Sequence* s : plan.preempted) {
      if (s->compression == nullptr) continue;
      s->compression = *MakeCompressionSession({kLayers, 1, 1, 4, kBlockSize}, s->req,
                                               s->num_tokens());
    }
    for (const ScheduledChunk& c : plan.chunks) Execute(c);
    return plan;
  }

  // Steps until every sequence finished; false after `max_steps`.
  bool RunToCompletion(int max_steps) {
    for (int i = 0; i < max_steps; ++i) {
      if (AllFinished()) return true;
      Step();
    }
    return AllFinished();
  }

  bool AllFinished() const {
    for (const auto& s : seqs_) {
      if (!s->finished()) return false;
    }
    return true;
  }

  Scheduler& scheduler() { return *scheduler_; }
  cache::BlockPool& pool() { return *pool_; }
  cache::CompressedPrefixCache& contexts() { return *contexts_; }
  Sequence* seq(int i) { return seqs_[i].get(); }

 private:
  void Execute(const ScheduledChunk& c) {
    Sequence& s = *c.seq;
    ASSERT_EQ(c.start, s.num_computed);
    for (int32_t l = 0; l < kLayers; ++l) s.kv.AppendSlots(l, c.count);  // as the forward does
    // As the worker does: compress once the compressed part (the prompt, or its context) is in.
    if (s.awaits_compression() && c.start + c.count == s.compression->num_tokens()) {
      ASSERT_TRUE(s.kv.MakePrivate(*pool_).ok());
      cache::HostScoring scoring(*pool_, threads_);
      ASSERT_TRUE(s.compression->Compress(s.kv, *pool_, scoring).ok());
    }
    scheduler_->OnChunkComputed(c);
    if (!c.samples) return;
    s.tokens.push_back(7);
    if (++s.num_generated >= s.req.max_tokens) scheduler_->Release(s);
  }

  bool prefix_caching_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<cache::CompressedPrefixCache> contexts_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  kernels::ThreadPool threads_{1};
};

// (sequence index, tokens) of each chunk, in batch order.
using Chunks = std::vector<std::pair<int, int>>;

Chunks ChunksOf(const IterationPlan& plan, Harness& h, int num_seqs) {
  Chunks out;
  for (const ScheduledChunk& c : plan.chunks) {
    for (int i = 0; i < num_seqs; ++i) {
      if (h.seq(i) == c.seq) out.push_back({i, c.count});
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The first iteration over a set of arrivals: admission, budgets and order.

struct FirstPlanCase {
  std::string name;
  int32_t num_blocks;  // the pool; each token takes one slot in each of the 2 layers
  SchedulerLimits limits;
  std::vector<Arrival> arrivals;
  Chunks expected;

  friend void PrintTo(const FirstPlanCase& c, std::ostream* os) { *os << c.name; }
};

class FirstPlanTest : public ::testing::TestWithParam<FirstPlanCase> {};

TEST_P(FirstPlanTest, PlansTheExpectedChunks) {
  const FirstPlanCase& c = GetParam();
  Harness h(c.num_blocks, c.limits);
  for (const Arrival& a : c.arrivals) h.Add(a);
  const IterationPlan plan = h.Step();
  EXPECT_EQ(ChunksOf(plan, h, static_cast<int>(c.arrivals.size())), c.expected);
  EXPECT_TRUE(plan.preempted.empty());
  int32_t reserved = 0;
  for (int i = 0; i < static_cast<int>(c.arrivals.size()); ++i) {
    reserved += h.seq(i)->kv.num_blocks_held();
  }
  EXPECT_EQ(reserved, h.pool().num_used());
}

INSTANTIATE_TEST_SUITE_P(
    Admission, FirstPlanTest,
    ::testing::Values(
        FirstPlanCase{"ChunkedPrefillTakesTheTokenBudget", 64, {16, 8}, {{40}}, {{0, 16}}},
        FirstPlanCase{"BudgetSharedInArrivalOrder", 64, {16, 8}, {{10}, {10}}, {{0, 10}, {1, 6}}},
        FirstPlanCase{"MaxSeqsCapsAdmission", 64, {64, 2}, {{4}, {4}, {4}}, {{0, 4}, {1, 4}}},
        // 12 tokens take 3 blocks per layer; the second prompt's 2 x 2 blocks do not fit in 2.
        FirstPlanCase{"FirstChunkMustFitThePool", 8, {64, 8}, {{12}, {8}}, {{0, 12}}},
        // The 2-token request would fit, but passing the waiting 12-token one would starve it.
        FirstPlanCase{"StrictOrderNoSlippingPast", 8, {64, 8}, {{12}, {12}, {2}}, {{0, 12}}},
        FirstPlanCase{"HigherPriorityFirst", 64, {8, 8}, {{8, 4, 0}, {8, 4, 5}}, {{1, 8}}},
        FirstPlanCase{"EqualPriorityByArrival", 64, {8, 8}, {{8, 4, 3}, {8, 4, 3}}, {{0, 8}}},
        // A running 12-token prompt holds 6 of 24 blocks. Without a policy, the 40-token
        // prompt behind it starts with what the token budget leaves (16 tokens, 8 blocks)...
        FirstPlanCase{"PlainPromptNeedsOnlyItsChunk", 24, {28, 8}, {{12}, {40}},
                      {{0, 12}, {1, 16}}},
        // ...with a policy its whole prompt (2 x 10 blocks) must fit first: the prefill peak.
        FirstPlanCase{"CompressingPromptNeedsItsPeak", 24, {28, 8},
                      {{12}, {40, 4, 0, "streaming_llm", 0.25}}, {{0, 12}}},
        FirstPlanCase{"CompressingPromptAdmittedAtItsPeak", 26, {28, 8},
                      {{12}, {40, 4, 0, "streaming_llm", 0.25}}, {{0, 12}, {1, 16}}}),
    [](const ::testing::TestParamInfo<FirstPlanCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Over several iterations.

TEST(SchedulerTest, DecodesComeBeforePrefillChunks) {
  Harness h(64, {8, 8});
  h.Add({4, 8});
  h.Step();  // seq 0 prefilled, sampled its first token
  h.Add({20, 4});
  EXPECT_EQ(ChunksOf(h.Step(), h, 2), (Chunks{{0, 1}, {1, 7}}));
  EXPECT_EQ(ChunksOf(h.Step(), h, 2), (Chunks{{0, 1}, {1, 7}}));
}

// Chunks whose every row's logits come back (prompt_logprobs) share kPromptLogprobsChunk rows
// per iteration; a waiting prompt that finds none left waits in order, like one without room.
TEST(SchedulerTest, ScoredPromptsShareTheIterationsScoredRows) {
  Harness h(1024, {1000, 8});
  for (int32_t len : {300, 100, 50}) h.Add({len, 2})->req.prompt_logprobs = 0;
  h.Add({40, 2});
  EXPECT_EQ(ChunksOf(h.Step(), h, 4), (Chunks{{0, kPromptLogprobsChunk}}));
  EXPECT_EQ(ChunksOf(h.Step(), h, 4), (Chunks{{0, 44}, {1, 100}, {2, 50}, {3, 40}}));
  EXPECT_TRUE(h.RunToCompletion(10));
}

TEST(SchedulerTest, DecodeThatDoesNotFitPreemptsTheLatestLowestPriority) {
  Harness h(8, {64, 8});  // 16 tokens per sequence
  Sequence* high = h.Add({4, 8, /*priority=*/1});
  Sequence* early = h.Add({4, 8});
  Sequence* late = h.Add({4, 8});
  h.Step();  // each holds 1 block per layer, 4 slots full: 2 blocks free
  IterationPlan plan = h.Step();  // the next decode of each needs a new block per layer
  ASSERT_EQ(plan.preempted, (std::vector<Sequence*>{late}));
  EXPECT_EQ(ChunksOf(plan, h, 3), (Chunks{{0, 1}, {1, 1}}));
  EXPECT_TRUE(plan.admitted.empty());  // never admit in an iteration that preempted
  EXPECT_EQ(late->state, SequenceState::kWaiting);
  EXPECT_EQ(late->num_computed, 0);
  EXPECT_EQ(late->kv.num_blocks_held(), 0);
  EXPECT_EQ(late->preemptions, 1);
  EXPECT_TRUE(high->running());
  EXPECT_TRUE(early->running());
  // Recompute: the prompt and the generated token are fed again as one chunk.
  ASSERT_TRUE(h.RunToCompletion(100));
  EXPECT_EQ(late->num_generated, 8);
  EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks());
}

// The pool just proved short: admitting now would only set up the next preemption.
TEST(SchedulerTest, NothingIsAdmittedInAnIterationThatPreempted) {
  Harness h(10, {64, 8});
  h.Add({4, 8, /*priority=*/1});
  Sequence* late = h.Add({12, 8});
  h.Step();  // 2 + 6 blocks held
  Sequence* small = h.Add({4, 4, /*priority=*/1});
  IterationPlan plan = h.Step();  // both decodes need a block per layer; 2 are free
  ASSERT_EQ(plan.preempted, (std::vector<Sequence*>{late}));
  EXPECT_TRUE(plan.admitted.empty());  // though `small` would fit in late's 6 blocks
  EXPECT_FALSE(small->running());
  plan = h.Step();
  EXPECT_EQ(plan.admitted, (std::vector<Sequence*>{small}));
}

TEST(SchedulerTest, HigherPriorityDisplacesLowerWhenThatMakesRoom) {
  Harness h(8, {64, 8});
  Sequence* low_a = h.Add({12, 4});
  h.Step();  // 3 blocks per layer held
  Sequence* high = h.Add({8, 4, /*priority=*/2});  // needs 2 blocks per layer, 2 free
  const IterationPlan plan = h.Step();
  EXPECT_EQ(plan.preempted, (std::vector<Sequence*>{low_a}));
  EXPECT_EQ(plan.admitted, (std::vector<Sequence*>{high}));
  ASSERT_TRUE(h.RunToCompletion(100));
  EXPECT_EQ(low_a->num_generated, 4);
}

TEST(SchedulerTest, EqualPriorityWaitsInsteadOfDisplacing) {
  Harness h(8, {64, 8});
  Sequence* first = h.Add({12, 4, 2});
  h.Step();
  Sequence* second = h.Add({8, 4, 2});
  const IterationPlan plan = h.Step();
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_TRUE(first->running());
  EXPECT_FALSE(second->running());
}

TEST(SchedulerTest, NoDisplacementWhenEvenAllLowerPriorityCannotMakeRoom) {
  Harness h(12, {64, 8});
  Sequence* low = h.Add({4, 20, 0});
  Sequence* peer = h.Add({12, 20, 9});
  h.Step();  // 1 + 3 blocks per layer held; their next decodes take the 4 free ones
  // Needs 5 blocks per layer: only `low` may be displaced (`peer` has its priority), and
  // freeing it gives 2.
  Sequence* top = h.Add({20, 4, 9});
  const IterationPlan plan = h.Step();
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_TRUE(low->running());
  EXPECT_TRUE(peer->running());
  EXPECT_FALSE(top->running());
}

TEST(SchedulerTest, ReleaseFreesEveryBlockInEveryState) {
  Harness h(60, {32, 8});
  Sequence* compressed = h.Add({16, 100, 0, "streaming_llm", 0.5});
  Sequence* decoding = h.Add({8, 100});
  Sequence* prefilling = h.Add({60, 4});
  Sequence* waiting = h.Add({8, 4});
  h.Step();
  h.Step();
  ASSERT_TRUE(decoding->running());
  ASSERT_TRUE(prefilling->running());
  ASSERT_LT(prefilling->num_computed, 60);  // still prefilling: a cancel mid-prompt
  ASSERT_TRUE(compressed->compression->compressed());
  for (Sequence* s : {decoding, prefilling, compressed, waiting}) h.scheduler().Release(*s);
  EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks());
  for (Sequence* s : {decoding, prefilling, compressed, waiting}) EXPECT_TRUE(s->finished());
  EXPECT_TRUE(h.Step().chunks.empty());
}

TEST(SchedulerTest, BlocksFreedByCompressionAdmitWaitingRequestsNextIteration) {
  Harness h(20, {64, 8});
  Sequence* compressing = h.Add({40, 20, 0, "streaming_llm", 0.25});
  Sequence* next = h.Add({16, 4});
  IterationPlan plan = h.Step();  // the whole prompt; compressed after it: 10 -> 3 blocks/layer
  EXPECT_EQ(plan.admitted, (std::vector<Sequence*>{compressing}));
  EXPECT_LE(compressing->kv.num_blocks_held(), 2 * 3);
  plan = h.Step();
  EXPECT_EQ(plan.admitted, (std::vector<Sequence*>{next}));
}

TEST(SchedulerTest, ADevicePlannableWindowStaysInOneChunk) {
  // snapkv observes the last 32 prompt tokens (positions 28-59 of 60): a 48-token chunk would
  // end inside them, so the first chunk stops at 28 and the second brings the whole window
  // with the end of the prompt (QueryCapture::device_plan's condition). streaming_llm observes
  // nothing: its prompt is cut where the budget falls.
  Harness h(80, {48, 8});
  Sequence* snap = h.Add({60, 2, 0, "snapkv", 0.5});
  ASSERT_EQ(snap->compression->DeviceWindowBegin(), 28);
  IterationPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 28);
  plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 28);
  EXPECT_EQ(plan.chunks[0].count, 32);
  EXPECT_TRUE(snap->compression->compressed());

  Harness other(80, {48, 8});
  Sequence* streaming = other.Add({60, 2, 0, "streaming_llm", 0.5});
  EXPECT_EQ(streaming->compression->DeviceWindowBegin(), -1);
  plan = other.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 48);
}

TEST(SchedulerTest, AChunkStopsWhereACompressedContextEnds) {
  // 60 prompt tokens of which the first 40 are the context (CompressionSpec::context_tokens):
  // the 48-token budget would run past it, so the first chunk stops at 40 and the policy
  // compresses before the other 20 are computed.
  Harness h(80, {48, 8});
  Sequence* s = h.Add({60, 2, 0, "snapkv", 0.5});
  s->req.compression.context_tokens = 40;
  s->compression = *MakeCompressionSession({kLayers, 1, 1, 4, kBlockSize}, s->req, 60);
  ASSERT_EQ(s->compression->num_tokens(), 40);
  IterationPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 40);
  EXPECT_FALSE(plan.chunks[0].samples);
  EXPECT_TRUE(s->compression->compressed());
  const int32_t context_slots = s->kv.num_slots(0);
  EXPECT_LT(context_slots, 40);
  plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 40);
  EXPECT_EQ(plan.chunks[0].count, 20);
  EXPECT_TRUE(plan.chunks[0].samples);
  EXPECT_EQ(s->kv.num_slots(0), context_slots + 20);  // the rest of the prompt stays whole
}

TEST(SchedulerTest, AContextWhosePrefillFillsThePoolIsAdmittedPublishedAndAttached) {
  // 40 prompt tokens, 39 of them the context: the prefill's peak is the whole pool, with no
  // room for the copies publishing takes. It runs anyway, and publishes after its compaction
  // freed blocks; the same request then attaches the context and computes one token.
  Harness h(2 * kLayers * 5, {64, 8}, /*prefix_caching=*/true);
  auto add = [&] {
    Sequence* s = h.Add({40, 2, 0, "snapkv", 0.5});
    s->req.compression.context_tokens = 39;
    s->compression = *MakeCompressionSession({kLayers, 1, 1, 4, kBlockSize}, s->req, 40);
    s->context_keys = {CompressedContextKey(s->req, /*hidden=*/4)};
    return s;
  };
  Sequence* first = add();
  ASSERT_TRUE(h.RunToCompletion(10));
  EXPECT_EQ(first->num_generated, 2);
  EXPECT_EQ(h.contexts().resident(), 1);
  Sequence* second = add();
  const IterationPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 39);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_TRUE(second->compression->compressed());
  ASSERT_TRUE(h.RunToCompletion(10));
  EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks());
}

TEST(SchedulerTest, PreemptedCompressingSequenceThatOutgrewThePoolIsRejected) {
  Harness h(20, {64, 8});  // 40 tokens per sequence
  Sequence* compressing = h.Add({36, 30, 0, "streaming_llm", 0.25});
  h.Step();  // compressed to 9 slots per layer, then decodes
  for (int i = 0; i < 8; ++i) h.Step();  // 36 + 9 tokens: more than the pool holds at once
  Sequence* top = h.Add({36, 2, /*priority=*/1});
  IterationPlan plan = h.Step();
  ASSERT_EQ(plan.preempted, (std::vector<Sequence*>{compressing}));
  ASSERT_TRUE(h.RunToCompletion(10));
  EXPECT_EQ(top->num_generated, 2);
  // Its recompute would hold 45 tokens uncompressed before its policy could run.
  EXPECT_TRUE(compressing->finished());
  EXPECT_LT(compressing->num_generated, 30);
  EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks());
}

TEST(SchedulerTest, LongPromptIsNotStarvedByAStreamOfShortOnes) {
  Harness h(16, {64, 8});  // 32 tokens per sequence
  h.Add({8, 6});
  Sequence* long_prompt = h.Add({28, 2});
  int iterations = 0;
  while (!long_prompt->finished() && iterations < 200) {
    h.Add({4, 6});  // a new short request every iteration
    h.Step();
    ++iterations;
  }
  EXPECT_TRUE(long_prompt->finished()) << "after " << iterations << " iterations";
  EXPECT_LT(iterations, 20);
}

// ---------------------------------------------------------------------------------------------
// Prefix caching.

std::vector<int32_t> Tokens(int n, int first = 1) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

TEST(PrefixCachingTest, ASharedPrefixIsComputedOnce) {
  Harness h(40, {64, 8}, /*prefix_caching=*/true);
  Sequence* first = h.Add({12, 2}, Tokens(12));
  ASSERT_TRUE(h.RunToCompletion(10));
  std::vector<int32_t> longer = Tokens(15);
  Sequence* second = h.Add({15, 2}, longer);
  const IterationPlan plan = h.Step();
  // Blocks 0-2 (12 tokens) come from the cache: only the last 3 tokens are fed.
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 12);
  EXPECT_EQ(plan.chunks[0].count, 3);
  ASSERT_EQ(plan.prefix_lookups.size(), 1u);
  EXPECT_EQ(plan.prefix_lookups[0].hit_tokens, 12);
  EXPECT_EQ(plan.prefix_lookups[0].queried_tokens, 15);
  EXPECT_TRUE(first->finished());
  ASSERT_TRUE(h.RunToCompletion(10));
  EXPECT_EQ(second->num_generated, 2);
  EXPECT_EQ(h.pool().num_references(), 0);
  EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks());
}

TEST(PrefixCachingTest, TheLastPromptTokenIsAlwaysComputed) {
  Harness h(40, {64, 8}, true);
  h.Add({12, 1}, Tokens(12));
  ASSERT_TRUE(h.RunToCompletion(10));
  h.Add({12, 1}, Tokens(12));
  const IterationPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 8);  // block 2 is cached too, but its logits are needed
  EXPECT_EQ(plan.chunks[0].count, 4);
}

TEST(PrefixCachingTest, RunningSequencesShareBlocksAndPreemptionKeepsThem) {
  Harness h(12, {64, 8}, true);
  Sequence* a = h.Add({9, 6}, Tokens(9));
  h.Step();  // blocks 0 and 1 of a's prompt are published
  Sequence* b = h.Add({9, 6, /*priority=*/1}, Tokens(9));
  h.Step();
  ASSERT_TRUE(b->running());
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(b->kv.block_table(l)[0], a->kv.block_table(l)[0]);
    EXPECT_EQ(h.pool().references(a->kv.block_table(l)[0]), 2);
  }
  EXPECT_EQ(b->kv.SharedBlocks(h.pool()), 2 * kLayers);
  // Preempting `a` drops its references; b's shared blocks stay in use.
  Sequence* c = h.Add({12, 2, /*priority=*/2}, Tokens(12, 100));
  const IterationPlan plan = h.Step();
  ASSERT_EQ(plan.preempted, (std::vector<Sequence*>{a}));
  for (int32_t l = 0; l < kLayers; ++l) EXPECT_EQ(h.pool().references(b->kv.block_table(l)[0]), 1);
  ASSERT_TRUE(h.RunToCompletion(100));
  EXPECT_EQ(a->num_generated, 6);
  EXPECT_EQ(c->num_generated, 2);
  EXPECT_EQ(h.pool().num_references(), 0);
}

TEST(PrefixCachingTest, ReclaimingCachedBlocksNeverTakesOneInUse) {
  Harness h(8, {64, 8}, true);
  h.Add({8, 1}, Tokens(8));
  ASSERT_TRUE(h.RunToCompletion(5));  // 4 cached blocks, all free
  std::vector<int32_t> same_start = Tokens(8);
  same_start[6] = 500;  // shares block 0 only
  Sequence* sharer = h.Add({8, 4}, same_start);
  h.Step();
  ASSERT_TRUE(sharer->running());
  const std::vector<int32_t> held = {sharer->kv.block_table(0)[0], sharer->kv.block_table(1)[0]};
  // An unrelated prompt needs every other block: the cached-but-free ones are reclaimed.
  Sequence* other = h.Add({8, 2}, Tokens(8, 900));
  for (int i = 0; i < 100 && !h.AllFinished(); ++i) {
    h.Step();
    if (sharer->finished()) continue;
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(sharer->kv.block_table(l)[0], held[l]);
      EXPECT_TRUE(h.pool().has_key(held[l]));  // never reclaimed while in use
      EXPECT_GE(h.pool().references(held[l]), 1);
    }
  }
  ASSERT_TRUE(h.AllFinished());
  EXPECT_EQ(other->num_generated, 2);
  EXPECT_EQ(sharer->num_generated, 4);
  EXPECT_EQ(h.pool().num_references(), 0);
}

TEST(PrefixCachingTest, DifferentSaltsNeverShare) {
  Harness h(40, {64, 8}, true);
  h.Add({12, 1}, Tokens(12), "tenant-a");
  ASSERT_TRUE(h.RunToCompletion(5));
  h.Add({12, 1}, Tokens(12), "tenant-b");
  IterationPlan plan = h.Step();
  EXPECT_EQ(plan.prefix_lookups.at(0).hit_tokens, 0);
  h.Add({12, 1}, Tokens(12), "tenant-a");
  plan = h.Step();
  EXPECT_EQ(plan.prefix_lookups.at(0).hit_tokens, 8);
}

TEST(PrefixCachingTest, ACompressingSequenceCopiesTheSharedPrefixBeforeCompaction) {
  Harness h(40, {64, 8}, true);
  Sequence* plain = h.Add({16, 20}, Tokens(16));
  h.Step();  // 4 blocks per layer published; `plain` keeps decoding
  Sequence* squeezed = h.Add({20, 4, 0, "streaming_llm", 0.4}, Tokens(20));
  const IterationPlan plan = h.Step();
  ASSERT_EQ(plan.prefix_lookups.size(), 1u);
  EXPECT_EQ(plan.prefix_lookups[0].hit_tokens, 16);  // streaming_llm observes no query row
  ASSERT_TRUE(squeezed->compression->compressed());
  EXPECT_EQ(squeezed->kv.SharedBlocks(h.pool()), 0);  // its compacted blocks are its own
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t b = 0; b < 4; ++b) {
      const int32_t block = plain->kv.block_table(l)[b];
      EXPECT_EQ(h.pool().references(block), 1);
      EXPECT_TRUE(h.pool().has_key(block));  // the cached prefix is intact for others
    }
  }
  ASSERT_TRUE(h.RunToCompletion(100));
  EXPECT_EQ(h.pool().num_references(), 0);
}

// Random arrivals against a small pool: whatever the interleaving of admissions and
// preemptions, every sequence gets all its tokens and every block comes back.
TEST(SchedulerTest, RandomWorkloadConservesTokensAndBlocks) {
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    // Odd rounds with prefix caching; prompts then share random-length prefixes.
    Harness h(24, {16 + static_cast<int32_t>(rng() % 48), 1 + static_cast<int32_t>(rng() % 6)},
              /*prefix_caching=*/round % 2 == 1);
    std::vector<Sequence*> seqs;
    for (int i = 0; i < 12; ++i) {
      Arrival a{1 + static_cast<int32_t>(rng() % 30), 1 + static_cast<int32_t>(rng() % 16),
                static_cast<int32_t>(rng() % 3)};
      if (rng() % 3 == 0) {
        a.policy = "streaming_llm";
        a.budget = 0.5;
      }
      std::vector<int32_t> tokens = Tokens(a.prompt_len);
      for (int32_t j = static_cast<int32_t>(rng() % (a.prompt_len + 1)); j < a.prompt_len; ++j) {
        tokens[j] = 1000 + static_cast<int32_t>(rng() % 5);
      }
      seqs.push_back(h.Add(a, tokens));
      h.Step();
    }
    ASSERT_TRUE(h.RunToCompletion(2000)) << "round " << round;
    for (Sequence* s : seqs) {
      if (s->num_generated < s->req.max_tokens) {
        // Only a preempted compressing sequence may be refused (it outgrew the pool).
        EXPECT_NE(s->compression, nullptr) << "round " << round;
        EXPECT_GT(s->preemptions, 0) << "round " << round;
      }
    }
    EXPECT_EQ(h.pool().num_free(), h.pool().num_blocks()) << "round " << round;
    EXPECT_EQ(h.pool().num_references(), 0) << "round " << round;
  }
}

}  // namespace
}  // namespace winnow::scheduler
