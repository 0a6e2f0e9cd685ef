// Attention column sums on tensor cores: kernels::AccumulateAttentionColumns for the many query
// rows of a prefill chunk (H2O's accumulated attention, winnowkv's hybrid scorer, Elastic
// Cache's importance). The direct kernel in scoring.h computes every q.k twice on CUDA cores,
// which on an H100 made 24 requests of 4,096 tokens on a Llama-3-8B shape take 6.8 times as
// long with winnowkv_docs as without compression (docs/experiments/benchmarks-history.md,
// "GPU capacity: how the compression cost came down"). Here a chunk of rows gets its logits
// from one batched cuBLAS GEMM (bf16 in, fp32 accumulation and out) into scratch, then two
// memory-bound passes read them: each (head, row)'s
// log-normaliser, then each (head, key)'s sum of exp(logit - lse) over the chunk's rows, in row
// order, one writer per column.
//
// Query rows and keys are bf16 (the CUDA worker's activation and KV dtype), so the GEMM reads
// exactly the values the direct kernel reads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_kv.h"
#include "kernels/cuda/scoring.h"

namespace winnow::kernels::cuda {

class TensorCoreColumnSums {
 public:
  // The logits of one chunk of rows: num_heads x rows x keys floats. A chunk has at least
  // kMinChunkRows rows, even where that takes more.
  static constexpr int64_t kLogitsBytes = int64_t{64} << 20;
  static constexpr int32_t kMinChunkRows = 16;

  // `max_keys`: the longest layer it will score (the model's context); its key copy is sized
  // for that on first use, so the scratch stays within ScratchBytes. `logits_bytes` bounds a
  // chunk's logits (tests make it small to get many chunks).
  explicit TensorCoreColumnSums(int32_t max_keys, int64_t logits_bytes = kLogitsBytes)
      : max_keys_(max_keys), logits_bytes_(logits_bytes) {}

  // The device bytes Run holds at most for up to `max_rows` rows a call over layers of up to
  // `max_keys` keys.
  static int64_t ScratchBytes(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                              int32_t max_keys, int64_t max_rows);

  // column_sums (device, num_heads x in.num_slots) += sum over rows r with j < visible[r] of
  // softmax_j(scale * q_r.k_j), as kernels::AccumulateAttentionColumns. `host_visible` holds
  // in.visible's values (it decides the chunks); the arena must be bf16. Work is queued on
  // `stream`, with `gemm` and small uploads through `stager`.
  absl::Status Run(const DevicePagedKv& kv, const DeviceScoreInput<__nv_bfloat16>& in,
                   std::span<const int32_t> host_visible, float* column_sums, Gemm& gemm,
                   PinnedStager& stager, cudaStream_t stream);

 private:
  // Queues one chunk: rows [first, first + rows), which see at most `keys` keys; keys_ holds
  // `key_stride` keys per KV head.
  absl::Status RunChunk(const DeviceScoreInput<__nv_bfloat16>& in, int32_t num_kv_heads,
                        int32_t head_dim, int32_t key_stride, int32_t first, int32_t rows,
                        int32_t keys, float* column_sums, Gemm& gemm, PinnedStager& stager,
                        cudaStream_t stream);

  int32_t max_keys_;
  int64_t logits_bytes_;
  DeviceBuffer<__nv_bfloat16> keys_;      // [kv_head][key][dim], the layer's keys in order
  DeviceBuffer<float> logits_;            // [head][row][key] of one chunk
  DeviceBuffer<float> lse_;               // [head][row] of one chunk
  DeviceBuffer<const void*> pointers_;    // the batched GEMM's x, w and y arrays
};

}  // namespace winnow::kernels::cuda
