// Compaction on the GPU: the copy step of cache/compaction.cc (ApplyKeepPlan) for one layer of
// one sequence in the paged device pool (f16/bf16, kernels/cuda/paged_kv.h). Each KV head's kept
// slots are gathered, bit for bit, into slots 0 .. kept-1 of the destination block table: the
// source's own table (in place, front to back, as the CPU does) or fresh blocks. The host then
// shrinks the layer (SequenceKv::Truncate / ReplaceLayer), which frees the blocks at once.
// MergeLayer does the same for plans with merge groups (Elastic Cache: float means).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_kv.h"

namespace winnow::kernels::cuda {

// Device bytes of scratch CompactLayer needs for `kept` entries: every kept K and V row of every
// KV head, since in place a destination slot can be another entry's source.
int64_t CompactionScratchBytes(const DevicePagedKv& kv, int32_t kept);

// kept_slots: num_kv_heads x kept (device), head h's slots ascending and unique, each below the
// layer's slot count (KeepPlan::Validate checks this on the host before upload); entry i of head
// h moves slot kept_slots[h * kept + i] of src_table to slot i of dst_table. dst_table may equal
// src_table (in place); entries already in place (slot i kept as entry i) are then skipped.
// scratch: CompactionScratchBytes(kv, kept) bytes of device memory. Two kernels (gather into
// scratch, then scatter) ordered on `stream`.
absl::Status CompactLayer(const DevicePagedKv& kv, const int32_t* src_table,
                          const int32_t* dst_table, const int32_t* kept_slots, int32_t kept,
                          std::byte* scratch, cudaStream_t stream);

// CompactLayer with merging, in place through `table`: entry i of KV head h becomes the mean,
// in float32, of the K (and of the V) rows of slots sources[offsets[h * kept + i] ..
// offsets[h * kept + i + 1]), rounded to the pool's dtype: cache::ApplyKeepPlan's merge (the
// sources summed in order, then multiplied by 1/count). A group of one source is copied bit for
// bit. offsets: num_kv_heads * kept + 1 ascending ints from 0 (device); sources: each group's
// slots, ascending and below the layer's slot count (KeepPlan::Validate checks this on the
// host). scratch: CompactionScratchBytes(kv, kept) bytes. Every entry is rewritten.
absl::Status MergeLayer(const DevicePagedKv& kv, const int32_t* table, const int32_t* offsets,
                        const int32_t* sources, int32_t kept, std::byte* scratch,
                        cudaStream_t stream);

}  // namespace winnow::kernels::cuda
