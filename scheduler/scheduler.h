// The scheduler decides each iteration and does nothing else: from the live sequences and the
// pool's free blocks it chooses which sequences run and how many tokens each feeds, admits
// waiting sequences, preempts running ones, and reserves the KV blocks the chosen chunks will
// write. It runs no model, samples nothing and knows no tokenizer; it touches a sequence only
// through its scheduling fields (state, num_computed, kv, preemptions).
//
// One iteration, in order:
//   1. running sequences get their next decode token (one each keeps every stream moving and is
//      cheap), then partially-prefilled ones their next prefill chunk, in priority order
//      (higher priority first, then earlier arrival), within max_batched_tokens. A prefill
//      chunk shrinks to what the pool holds; a decode token cannot shrink, so when the pool
//      cannot hold it the lowest-priority, latest-arrived running sequence is preempted by
//      recompute (its blocks are freed; it waits, and later re-prefills prompt + generated
//      tokens, keeping its sampler state, so its stream continues unchanged);
//   2. if nothing was preempted, waiting sequences are admitted in strict priority order while
//      their first chunk fits (a first chunk larger than the whole pool, which only a
//      sliding-window model's long prompt has, is cut to what the pool holds), within max_seqs
//      (sequences holding blocks). Compression-aware: a
//      sequence with a policy holds its whole prompt uncompressed until its last chunk has run,
//      so it is admitted only when the free blocks, less what admitted compressing sequences
//      still need to finish their prefill, hold its whole prefill (the peak). Once compressed,
//      a sequence counts with the blocks it holds, so the blocks its compaction freed admit
//      waiting requests at the next iteration;
//      With prefix caching, an admitted sequence first attaches the cached blocks of its
//      prompt's leading full blocks (shared, refcounted) and computes only the rest; cached
//      blocks nobody references count as free (the pool reclaims them LRU on demand). A
//      sequence that compresses its context alone (CompressionSpec::context_tokens) first looks
//      for that context published compressed (cache/compressed_prefix.h): on a hit it attaches
//      it, adopts it as its compression and computes only the rest of its prompt;
//   3. a waiting sequence that does not fit may displace running sequences of strictly lower
//      priority (lowest first), but only when displacing all of those makes room, so nothing
//      is preempted for nothing. Equal priorities never preempt each other.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "cache/compressed_prefix.h"
#include "scheduler/sequence.h"

namespace winnow::scheduler {

struct SchedulerLimits {
  int32_t max_batched_tokens = 2048;  // tokens fed to one forward (prefill chunks + decodes)
  int32_t max_seqs = 64;              // sequences holding KV blocks at once
  // [layer] its sliding window (0: full attention; empty: none slides). An uncompressed
  // sequence's blocks behind a layer's window return to the pool as the window moves on.
  std::vector<int32_t> layer_windows = {};
};

// A lookup in the prefix cache by an admitted sequence.
struct PrefixLookup {
  Sequence* seq = nullptr;
  // Of the uncompressed prefix cache (the prompt's full blocks), or of a compressed context.
  bool compressed_context = false;
  int32_t queried_tokens = 0;  // the prompt's tokens, or the context's
  int32_t hit_tokens = 0;      // leading tokens whose K/V were attached, not computed
  int64_t hit_kv_bytes = 0;    // compressed context: the K/V bytes attached
};

// `count` tokens of one sequence, at positions [start, start + count), fed to this iteration's
// forward. Their KV blocks are reserved.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start = 0;
  int32_t count = 0;
  // The chunk ends at the sequence's last known token: the forward returns its logits and the
  // worker samples the next token.
  bool samples = false;
  // One generated token fed back to produce the next.
  bool is_decode() const { return samples && count == 1 && start >= seq->prompt_len; }
};

struct IterationPlan {
  struct Rejection {
    Sequence* seq = nullptr;
    absl::Status status;
  };

  std::vector<ScheduledChunk> chunks;  // the batch, in order
  std::vector<Sequence*> admitted;     // left the waiting queue this iteration
  std::vector<Sequence*> preempted;    // released their blocks; waiting to recompute
  std::vector<Rejection> rejected;     // can never run again: the engine finishes them
  // Per admitted sequence with prefix keys, one of the block cache; with a context key one of
  // the compressed contexts first (and the block cache's only on a miss).
  std::vector<PrefixLookup> prefix_lookups;

  int32_t num_tokens() const;
};

class Scheduler {
 public:
  // `contexts`: published compressed contexts, attached and published through it (null: off).
  Scheduler(const SchedulerLimits& limits, cache::BlockPool& pool,
            cache::CompressedPrefixCache* contexts = nullptr);

  // Plans the next iteration over `live`: every unfinished sequence, in any order. Admitted
  // sequences become kRunning; preempted ones release their blocks and become kWaiting with
  // nothing computed (the caller resets what else recomputation needs, e.g. compression).
  IterationPlan Schedule(std::span<Sequence* const> live);

  // After the worker ran `chunk`: its tokens' K/V are in the cache. Advances num_computed and,
  // with prefix caching, keys the full prompt blocks now computed so later prompts reuse them
  // (not a compressing sequence's: its compaction rewrites them), or publishes the compressed
  // context the chunk completed (a sequence with a context key). Then drops the blocks that
  // fell behind sliding windows.
  void OnChunkComputed(const ScheduledChunk& chunk);

  // Returns every block a sequence holds to the pool and marks it finished.
  void Release(Sequence& seq);

  const SchedulerLimits& limits() const { return limits_; }

 private:
  // Publishes the compressed context `s` has just compressed.
  void PublishContext(Sequence& s);
  // Keys the full prompt blocks `s` has computed since the last call (prefix caching).
  void PublishPrefix(Sequence& s);
  // Returns the blocks no later token of `s` reads: on each sliding-window layer, those wholly
  // before the next token's window.
  void DropBehindWindows(Sequence& s);
  // Whether a compressing sequence's policy is done reading whole layers (ReadsOnlyItsWindows
  // in scheduler.cc says when), so that DropBehindWindows may run for it too.
  static bool ReadsOnlyItsWindows(Sequence& s);

  SchedulerLimits limits_;
  cache::BlockPool& pool_;
  cache::CompressedPrefixCache* contexts_;
};

}  // namespace winnow::scheduler
