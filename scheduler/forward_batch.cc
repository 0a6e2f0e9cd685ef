#include "scheduler/forward_batch.h"

#include <algorithm>

#include "base/status_macros.h"

namespace winnow::scheduler {

std::vector<model::BatchEntry> BuildForwardBatch(std::span<const ScheduledChunk> chunks,
                                                 int64_t hidden_size) {
  std::vector<model::BatchEntry> batch;
  batch.reserve(chunks.size());
  for (const ScheduledChunk& c : chunks) {
    Sequence* s = c.seq;
    model::BatchEntry e;
    e.kv = &s->kv;
    e.tokens = std::span<const int32_t>(s->tokens).subspan(c.start, c.count);
    e.start_position = c.start;
    if (c.start < s->prompt_len) {
      const int32_t first_row = s->emb_prefix[c.start];
      const int32_t rows = s->emb_prefix[std::min(c.start + c.count, s->prompt_len)] - first_row;
      e.embeddings = std::span<const float>(s->req.embeddings)
                         .subspan(first_row * hidden_size, rows * hidden_size);
    }
    e.logits = s->ScoresPrompt(c.start) ? model::LogitsMode::kAll
               : c.samples                ? model::LogitsMode::kLast
                                          : model::LogitsMode::kNone;
    if (s->compression != nullptr) {
      if (!s->compression->compressed()) {
        e.capture = s->compression->PrefillCapture(c.start, c.count);
      } else {
        e.attention_probs = s->compression->DecodeAttentionBuffer();
        e.selector = s->compression->selector();
      }
    }
    batch.push_back(e);
  }
  return batch;
}

absl::StatusOr<model::SampledToken> SampleChunk(const ScheduledChunk& chunk, size_t index,
                                                const model::ForwardOutput& out) {
  if (index >= out.first_row.size() || out.first_row[index] < 0) {
    return absl::InternalError("forward returned no logits");
  }
  // The chunk's last row (its only one unless the prompt is being scored).
  const int32_t row = out.first_row[index] + out.num_rows[index] - 1;
  const std::optional<float> log_norm =
      row < static_cast<int32_t>(out.log_norm.size()) ? std::optional(out.log_norm[row])
                                                      : std::nullopt;
  Sequence& seq = *chunk.seq;
  if (seq.constraint == nullptr) return seq.sampler.Sample(out.Row(row), log_norm);
  const structured::TokenMask& allowed = seq.constraint->Allowed();
  if (std::all_of(allowed.begin(), allowed.end(), [](uint64_t w) { return w == 0; })) {
    return absl::FailedPreconditionError(
        "structured output: no token of the vocabulary continues the output");
  }
  model::SampledToken token = seq.sampler.Sample(out.Row(row), log_norm, allowed);
  WINNOW_RETURN_IF_ERROR(seq.constraint->Accept(token.id));
  return token;
}

namespace {

// Probe tokens per forward: each chunk's rows are folded into the context's scores and
// dropped, so a long segment never holds more than this many rows.
constexpr int32_t kProbeChunk = 512;

// Runs the probe of `s`'s context (CompressionSession::SetProbe) after it, segment by segment,
// each in chunks, each segment's K/V dropped before the next.
absl::Status RunProbe(Sequence& s, cache::BlockPool& pool, const ProbeForward& forward) {
  cache::CompressionSession& c = *s.compression;
  const int32_t n = c.num_tokens();
  for (const cache::ProbeSegment& segment : c.probe_segments()) {
    const int32_t size = static_cast<int32_t>(segment.tokens.size());
    if (!s.kv.Reserve(pool, size)) {
      return absl::ResourceExhaustedError(
          "compression.probe: no free KV block for the probe's tokens after the context");
    }
    for (int32_t done = 0; done < size; done += kProbeChunk) {
      const int32_t count = std::min(kProbeChunk, size - done);
      model::BatchEntry e;
      e.kv = &s.kv;
      e.tokens = std::span<const int32_t>(segment.tokens).subspan(done, count);
      e.start_position = n + done;
      e.logits = model::LogitsMode::kNone;
      e.capture = c.ProbeCapture(n + done, count);
      WINNOW_RETURN_IF_ERROR(forward(e));
      WINNOW_RETURN_IF_ERROR(c.AfterProbeChunk());
    }
    WINNOW_RETURN_IF_ERROR(c.EndProbeSegment(s.kv, pool));
  }
  return absl::OkStatus();
}

// A compaction's event; RunCompressions adds its times.
CompressionEvent Compaction(const Sequence& s, bool prefill, int64_t slots_before,
                            int64_t slots_after, int32_t blocks_freed) {
  CompressionEvent event;
  event.id = s.id;
  event.policy = s.compression->policy_name();
  event.prefill = prefill;
  event.slots_before = slots_before;
  event.slots_after = slots_after;
  event.blocks_freed = blocks_freed;
  return event;
}

// One chunk's compression hooks (see RunCompressions); the event when a compaction ran.
absl::StatusOr<std::optional<CompressionEvent>> RunCompression(const ScheduledChunk& chunk,
                                                               cache::BlockPool& pool,
                                                               cache::ScoringBackend& scoring,
                                                               const ProbeForward& probe) {
  Sequence& s = *chunk.seq;
  cache::CompressionSession& c = *s.compression;
  if (c.compressed() && chunk.count > 1) {
    // The rest of a prompt after its compressed context (CompressionSpec::context_tokens).
    WINNOW_RETURN_IF_ERROR(c.AfterUncompressedTokens(chunk.start, chunk.count, s.kv));
    return std::nullopt;
  }
  if (c.compressed()) {
    // A decode step, or one token after a compressed context: the token at `start` has its K/V
    // written; the policy may evict.
    const int32_t blocks_before = s.kv.num_blocks_held();
    int64_t slots_before = 0;
    for (int32_t l = 0; l < s.kv.num_layers(); ++l) slots_before += s.kv.num_slots(l);
    const bool lookahead = c.prompt_plan_pending();
    WINNOW_ASSIGN_OR_RETURN(const cache::CompactionStats st,
                            c.AfterDecodeStep(chunk.start, s.kv, pool));
    if (lookahead && !c.prompt_plan_pending()) {
      // The lookahead ended: this was the prompt's compression, reported as such.
      return Compaction(s, /*prefill=*/true, c.stats().slots_before, c.stats().slots_after,
                        st.blocks_freed);
    }
    if (st.layers_changed == 0) return std::nullopt;
    return Compaction(s, /*prefill=*/false, slots_before, slots_before - st.slots_removed,
                      blocks_before - s.kv.num_blocks_held());
  }
  WINNOW_RETURN_IF_ERROR(c.AfterPrefillChunk());
  // More of what the policy compresses to come (the scheduler ends a chunk where it ends).
  if (chunk.start + chunk.count < c.num_tokens()) return std::nullopt;
  if (c.probe_pending()) WINNOW_RETURN_IF_ERROR(RunProbe(s, pool, probe));
  // Compaction rewrites the cache in place: blocks shared through the prefix cache are copied
  // first (admission reserved room for the copies), so the others keep their prefix intact.
  WINNOW_RETURN_IF_ERROR(s.kv.MakePrivate(pool, c.FirstRewrittenSlots()));
  WINNOW_ASSIGN_OR_RETURN(const cache::CompactionStats st, c.Compress(s.kv, pool, scoring));
  if (c.prompt_plan_pending()) return std::nullopt;  // a lookahead: the plan comes later
  return Compaction(s, /*prefill=*/true, c.stats().slots_before, c.stats().slots_after,
                    st.blocks_freed);
}

}  // namespace

absl::Duration RunCompressions(std::span<const ScheduledChunk> chunks, cache::BlockPool& pool,
                               cache::ScoringBackend& scoring, const ProbeForward& probe,
                               std::span<ChunkResult> results,
                               cache::CompressionPhaseTimes& phases) {
  absl::Duration spent;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].seq->compression == nullptr) continue;
    const cache::CompressionSession& session = *chunks[i].seq->compression;
    const cache::CompressionPhaseTimes before = session.stats().time;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::optional<CompressionEvent>> event =
        RunCompression(chunks[i], pool, scoring, probe);
    const absl::Time end = absl::Now();
    spent += end - start;
    const cache::CompressionPhaseTimes split = session.stats().time - before;
    phases += split;
    if (!event.ok()) {
      results[i].status = event.status();
      continue;
    }
    if (event->has_value()) {
      (*event)->start = start;
      (*event)->end = end;
      (*event)->time = split;
    }
    results[i].compression = *event;
  }
  return spent;
}

namespace {

// prompt_logprobs: the log-probability of each prompt token after the chunk's rows, from the
// row before it; positions already scored (before a preemption) are skipped.
void ScorePrompt(const ScheduledChunk& chunk, size_t index, const model::ForwardOutput& out) {
  Sequence& s = *chunk.seq;
  for (int32_t r = 0; r < out.num_rows[index]; ++r) {
    const int32_t next = chunk.start + r + 1;  // the prompt position this row predicts
    if (next >= s.prompt_len || next <= static_cast<int32_t>(s.prompt_logprobs.size())) continue;
    const int32_t id = s.tokens[next];
    if (id == model::kEmbeddingInput) {
      s.prompt_logprobs.push_back({-1, 0.0f, {}});
      continue;
    }
    const model::SampledToken scored =
        model::ScoreToken(out.Row(out.first_row[index] + r), id, s.req.prompt_logprobs);
    s.prompt_logprobs.push_back({id, scored.logprob, scored.top_logprobs});
  }
}

}  // namespace

void SampleChunks(std::span<const ScheduledChunk> chunks, const model::ForwardOutput& out,
                  kernels::ThreadPool& threads, std::span<ChunkResult> results) {
  threads.ParallelFor(static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (results[i].status.ok() && chunks[i].seq->ScoresPrompt(chunks[i].start)) {
        ScorePrompt(chunks[i], i, out);
      }
      if (!chunks[i].samples || !results[i].status.ok()) continue;
      absl::StatusOr<model::SampledToken> token = SampleChunk(chunks[i], i, out);
      if (token.ok()) {
        results[i].token = *std::move(token);
      } else {
        results[i].status = token.status();
      }
    }
  });
}

}  // namespace winnow::scheduler
