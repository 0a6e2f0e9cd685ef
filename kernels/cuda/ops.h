// Per-row and element-wise ops of the transformer forward on the GPU: the CUDA counterparts of
// kernels/cpu/ops.h and of the embedding lookup in model/cpu_forward.cc (CpuForward::Embed).
//
// Types. The GPU forward's activations (what feeds and leaves the GEMMs: normalised rows, Q/K/V,
// attention output, gate/up) are T = __nv_bfloat16 (the forward's choice: bf16 has float32's
// exponent range, so the large activations of SwiGLU MLPs cannot overflow as they can in fp16,
// and cuBLAS runs bf16 at the fp16 rate). Every op is also instantiated for T = __half. The
// residual stream stays float32 (rows x hidden floats: small next to the weights, and it keeps
// the sum of 2 x num_layers updates as exact as the CPU forward's). Norm weights, biases and the
// RoPE table are float32. All arithmetic is float32 (RoPE angles in double, as on the CPU).
//
// Conventions. Pointers are device memory; every wrapper enqueues on `stream`, returns
// InvalidArgument (naming the argument) for bad sizes and the launch error otherwise. Rows are
// `stride` elements apart where a stride is taken, so views into a fused QKV or gate|up GEMM
// output work without a copy. Index arrays (token ids, positions) are validated on the host
// before upload (Model::ValidateBatch); the kernels never read out of bounds on a bad one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/ops.h"

namespace winnow::kernels::cuda {

// The token id that takes its row from `embeddings` (model::kEmbeddingInput).
inline constexpr int32_t kEmbeddingInputId = -1;

// out[r] = float(table[token_ids[r]]) (table: vocab x hidden, row-major), or, where
// token_ids[r] == kEmbeddingInputId, out[r] = embeddings[embedding_rows[r]] (caller-provided
// float rows, as BatchEntry::embeddings; embedding_rows maps each such row to its row there and
// may be null when no row uses it). An id outside [0, vocab), or a missing embedding row, gives
// a zero row. out: rows x hidden floats (the residual stream). CPU: kernels::GetRow in
// CpuForward::Embed.
template <typename T>
absl::Status EmbeddingGather(const T* table, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, const int32_t* embedding_rows,
                             const float* embeddings, int64_t rows, float* out,
                             cudaStream_t stream);

// Per row r of `rows` (each `hidden` long):
//   if residual_delta: x[r] += float(residual_delta[r])   (the residual add, fused)
//   out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight
// x: float32 residual stream (updated in place when residual_delta is set); residual_delta, out:
// T. CPU: kernels::AddInPlace then kernels::RmsNorm.
template <typename T>
absl::Status RmsNorm(float* x, const T* residual_delta, const float* weight, int64_t rows,
                     int64_t hidden, float eps, T* out, cudaStream_t stream);

// QK-norm: each of `vectors` dim-long vectors of x (heads of Q or K rows, contiguous)
// RMS-normalised in place and scaled by weight (dim floats). CPU: kernels::RmsNorm per vector.
template <typename T>
absl::Status HeadRmsNorm(T* x, const float* weight, int64_t vectors, int32_t dim, float eps,
                         cudaStream_t stream);

// Rotates the first rope_dim dimensions of every head of row r, in place, for absolute position
// positions[r]: q rows (num_heads heads, q_stride elements apart) and k rows (num_kv_heads
// heads, k_stride apart); heads are head_dim apart within a row. inv_freq: rope_dim/2 floats
// with the scaling folded in (Model's RopeInverseFrequencies); attn_factor scales cos and sin.
// `layout` pairs dimensions as the GGUF's architecture does (kAdjacent: llama, kHalves: qwen2).
// k may be null (q only). CPU: kernels::ApplyRope, once for Q and once for K.
template <typename T>
absl::Status ApplyRope(T* q, int64_t q_stride, int32_t num_heads, T* k, int64_t k_stride,
                       int32_t num_kv_heads, int64_t rows, int32_t head_dim, int32_t rope_dim,
                       const int32_t* positions, const float* inv_freq, float attn_factor,
                       RopeLayout layout, cudaStream_t stream);

// out[r * cols + c] = silu(gate[r * in_stride + c]) * up[r * in_stride + c], with
// silu(g) = g / (1 + exp(-g)). in_stride == cols for separate gate and up buffers; 2 * cols with
// up = gate + cols for a fused [gate | up] GEMM output. out may alias gate or up only when
// in_stride == cols. CPU: kernels::SiluMul.
template <typename T>
absl::Status SiluMul(const T* gate, const T* up, int64_t rows, int64_t cols, int64_t in_stride,
                     T* out, cudaStream_t stream);

// x[r * cols + c] += bias[c] (bias: cols floats), e.g. qwen2's QKV bias on a fused QKV output
// with bias = [bq | bk | bv]. CPU: kernels::AddInPlace per row (AddBias in model/cpu_forward.cc).
template <typename T>
absl::Status AddBias(T* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// out[i] = x[i] widened to float32, for i < count.
absl::Status WidenToFloat(const __nv_bfloat16* x, int64_t count, float* out,
                          cudaStream_t stream);

// out[r] = log(sum_c exp(x[r * cols + c])), computed as max + log(sum exp(x - max)): the
// log-normaliser of each logits row, so that the host sampler need not pass over the whole
// vocabulary for a log-probability. x, out: float32. CPU: the log-normaliser in
// model::Sampler (Sampler::Finish).
absl::Status LogSumExpRows(const float* x, int64_t rows, int64_t cols, float* out,
                           cudaStream_t stream);

}  // namespace winnow::kernels::cuda
