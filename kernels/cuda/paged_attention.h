// Causal attention over the device's paged KV arena, one layer per call, through FlashInfer's
// batch decode and batch prefill kernels (docs/gpu.md, "Paged attention"). The semantics are
// kernels/cpu/attention.h's: a varlen batch of prefill chunks and decode tokens whose new K/V
// are already in the cache, new token i of a sequence seeing its slots
// [0, num_slots - num_new + i], query head h reading KV head h / (num_heads / num_kv_heads).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cuda/device_buffer.h"

namespace winnow::kernels::cuda {

struct PagedAttentionConfig {
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // divides num_heads
  int32_t head_dim = 0;      // 64 or 128 (the instantiated kernels)
  int32_t block_size = 0;    // token slots per block
  KvDtype dtype = KvDtype::kF16;  // of the arena, q and out: kF16 or kBF16
  int32_t num_blocks = 0;    // blocks in the arena (block ids are checked against it)
  // FlashInfer's scratch: split-KV partial outputs (FlashInfer's default), and its schedules
  // (FlashInfer's default for one, twice: decode and prefill each keep theirs).
  int64_t float_workspace_bytes = int64_t{128} << 20;
  int64_t int_workspace_bytes = int64_t{16} << 20;
};

// InvalidArgument naming the field when no instantiated kernel serves `config`.
absl::Status ValidatePagedAttentionConfig(const PagedAttentionConfig& config);

// Owns FlashInfer's workspaces and the device copy of each call's page tables. Calls are
// stream-ordered: they may be issued back to back on one stream without synchronising, but two
// calls on different streams must not overlap (they share the buffers).
//
// Nothing in a call waits for the stream, so the host can queue a whole forward's layers ahead
// of the GPU: page tables are staged in pinned memory (an upload from pageable memory waits for
// the stream), and FlashInfer's schedule, which depends only on the sequences' lengths, is
// planned and uploaded once and reused by the next calls with the same lengths (every layer of
// a forward, unless compression left layers of different lengths).
class PagedAttention {
 public:
  static absl::StatusOr<std::unique_ptr<PagedAttention>> Create(
      const PagedAttentionConfig& config);

  // Enqueues one layer's attention on `stream`. `arena`: the device arena, laid out as
  // cache::KvLayout says (per block: K[kv_head][slot][dim], then V likewise), `dtype` values.
  // `sequences`: host structs whose block tables are this layer's, in row order (the first
  // starts at row 0, each next one where the previous ends); selection and probs are not
  // supported here. q and out: device, rows x num_heads x head_dim, `dtype`. `lse` (optional,
  // device, rows x num_heads): each row's log-sum-exp in FlashInfer's base-2 convention
  // (FlashInferCall::lse), for kernels/cuda/column_sums.h.
  absl::Status Run(const void* arena, std::span<const AttentionSequence> sequences,
                   const void* q, float scale, void* out, cudaStream_t stream,
                   float* lse = nullptr);

  const PagedAttentionConfig& config() const { return config_; }

 private:
  PagedAttention(const PagedAttentionConfig& config, DeviceBuffer<std::byte> float_workspace,
                 DeviceBuffer<std::byte> int_workspace)
      : config_(config),
        float_workspace_(std::move(float_workspace)),
        int_workspace_(std::move(int_workspace)),
        host_int_workspace_(config.int_workspace_bytes) {}
  absl::Status ValidateSequences(std::span<const AttentionSequence> sequences) const;
  // The number of leading sequences that go to the decode kernel (one new token each).
  int32_t DecodePrefix(std::span<const AttentionSequence> sequences) const;
  // Uploads host_tables_ to tables_ through the pinned staging buffer, on `stream`.
  absl::Status UploadTables(cudaStream_t stream);

  PagedAttentionConfig config_;
  DeviceBuffer<std::byte> float_workspace_;
  // FlashInfer's schedules: the decode kernel's in the first half, the prefill kernel's in the
  // second, so that each stays valid while the other is replanned.
  DeviceBuffer<std::byte> int_workspace_;
  // FlashInfer's planner writes its schedule here and copies it to int_workspace_. Pageable on
  // purpose: an asynchronous copy from pageable memory returns once the source is read, so the
  // next plan may overwrite it at once (planning is rare: see plans_).
  std::vector<std::byte> host_int_workspace_;
  // Per kernel (0: decode, 1: prefill): the lengths (page indptr, last page lengths, query
  // indptr) the stored schedule was planned for, and the schedule.
  std::vector<int32_t> plan_lengths_[2];
  std::vector<int64_t> plans_[2];
  std::vector<int32_t> host_tables_;
  // Staged page tables of the calls whose uploads may still be pending, back to back; when full,
  // the stream is drained and staging starts over.
  PinnedBuffer<int32_t> staging_;
  int64_t staged_ = 0;
  DeviceBuffer<int32_t> tables_;
};

}  // namespace winnow::kernels::cuda
