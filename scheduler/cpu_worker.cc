#include "scheduler/cpu_worker.h"

#include "scheduler/forward_batch.h"

namespace winnow::scheduler {

WorkerOutput CpuWorker::Execute(std::span<const ScheduledChunk> chunks) {
  WorkerOutput result;
  const std::vector<model::BatchEntry> batch =
      BuildForwardBatch(chunks, model_.config().hidden_size);
  const absl::Time t0 = absl::Now();
  result.status = model_.Forward(batch, pool_, &out_);
  result.forward_time = absl::Now() - t0;
  if (!result.status.ok()) return result;

  result.chunks.resize(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledChunk& c = chunks[i];
    ChunkResult& r = result.chunks[i];
    if (c.seq->compression != nullptr) {
      // Before sampling: the first token comes from the full cache's logits (computed), and a
      // sequence that finishes on it must not be compressed after its blocks are gone.
      absl::StatusOr<std::optional<CompressionEvent>> event = RunCompression(c);
      if (!event.ok()) {
        r.status = event.status();
        continue;
      }
      r.compression = *event;
    }
  }
  SampleChunks(chunks, out_, model_.threads(), result.chunks);
  return result;
}

absl::StatusOr<std::optional<CompressionEvent>> CpuWorker::RunCompression(
    const ScheduledChunk& chunk) {
  Sequence& s = *chunk.seq;
  cache::CompressionSession& c = *s.compression;
  if (c.compressed()) {
    // A decode step: the token at `start` has its K/V written; the policy may evict.
    const int32_t blocks_before = s.kv.num_blocks_held();
    int64_t slots_before = 0;
    for (int32_t l = 0; l < s.kv.num_layers(); ++l) slots_before += s.kv.num_slots(l);
    absl::StatusOr<cache::CompactionStats> st = c.AfterDecodeStep(chunk.start, s.kv, pool_);
    if (!st.ok()) return st.status();
    if (st->layers_changed == 0) return std::nullopt;
    return CompressionEvent{s.id, c.policy_name(), /*prefill=*/false, slots_before,
                            slots_before - st->slots_removed,
                            blocks_before - s.kv.num_blocks_held()};
  }
  if (absl::Status st = c.AfterPrefillChunk(s.kv, pool_, model_.threads()); !st.ok()) return st;
  if (!chunk.samples) return std::nullopt;  // more of the prompt to come
  // Compaction rewrites the cache in place: blocks shared through the prefix cache are copied
  // first (admission reserved room for the copies), so the others keep their prefix intact.
  if (!s.kv.MakePrivate(pool_)) {
    return absl::ResourceExhaustedError(
        "no free KV block to copy the shared prompt prefix before compression");
  }
  absl::StatusOr<cache::CompactionStats> st = c.Compress(s.kv, pool_, model_.threads());
  if (!st.ok()) return st.status();
  return CompressionEvent{s.id, c.policy_name(), /*prefill=*/true, c.stats().slots_before,
                          c.stats().slots_after, st->blocks_freed};
}

}  // namespace winnow::scheduler
