// Attention column sums of the many query rows of a prefill chunk, on tensor cores and without
// writing a rows x keys matrix anywhere: kernels::AccumulateAttentionColumns for H2O's
// accumulated attention, winnowkv's hybrid scorer and Elastic Cache's importance.
//
// Each row's softmax normaliser comes from the prefill attention that already computed it
// (FlashInfer writes the log-sum-exp of every row and head when asked; PagedAttention::Run's
// `lse`), so one pass suffices: a block per (query head, tile of 64 keys) loads its keys once,
// walks the rows in tiles of 32, skipping tiles whose rows all see none of its keys (the causal
// half), computes the tile's logits with bf16 MMA into shared memory and adds each key's
// exp2(logit * scale * log2 e - lse) over the rows, in row order, one writer per column. The
// earlier version (a cuBLAS GEMM per chunk of 128 rows into a 64 MiB logits scratch, then two
// passes over it) cost winnowkv_docs 2.3 s of forward time in a 24-request burst of 4,096-token
// prompts on an H200 (docs/benchmarks.md, "GPU: capacity with compression").
//
// Query rows and keys are bf16 (the CUDA worker's activation and KV dtype), as the attention
// read them; head dims 64 and 128 (the attention's instantiations).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/paged_kv.h"
#include "kernels/cuda/scoring.h"

namespace winnow::kernels::cuda {

// column_sums (device, in.num_heads x in.num_slots) += sum over rows r with j < visible[r] of
// exp2(in.scale * log2(e) * q_r.k_j - lse_log2[r * in.num_heads + h]), which is
// softmax_j(scale * q_r.k_j) when lse_log2 is the rows' log2-sum-exp2 of scaled logits
// (FlashInfer's convention: log2 of sum_j 2^(scale * log2(e) * q.k_j)). All pointers are
// device memory; the arena must be bf16, head_dim 64 or 128. Queued on `stream`, no scratch.
// With in.column_max the rows fold by their maximum: column_sums = max(column_sums, max over r).
absl::Status ColumnSumsFromLse(const DevicePagedKv& kv, const DeviceScoreInput<__nv_bfloat16>& in,
                               const float* lse_log2, float* column_sums, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
