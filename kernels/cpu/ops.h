// Element-wise and per-row ops of the transformer forward (float32, CPU).
#pragma once

#include <cstdint>

namespace winnow::kernels {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]. `out` may alias `x`.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// out[i] = silu(gate[i]) * up[i]. `out` may alias either input.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// out[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation (PyTorch's
// gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh). `out` may alias either input.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i].
void AddInPlace(float* x, const float* y, int64_t n);

// How the rotated dimensions of a head are paired.
enum class RopeLayout {
  kAdjacent,  // (0,1), (2,3), ...  ggml "normal" rope: GGUF llama (Q/K rows permuted on export)
  kHalves,    // (i, i + rope_dim/2)  ggml "neox" rope: qwen2 and others exported unpermuted
};

// Rotates the first rope_dim dimensions of each of `num_heads` heads (head_dim apart) in place
// for a token at absolute `position`. inv_freq has rope_dim/2 entries (scaling applied).
// attn_factor scales cos/sin (YaRN magnitude correction; 1 otherwise).
void ApplyRope(float* heads, int32_t num_heads, int32_t head_dim, int32_t rope_dim,
               int32_t position, const float* inv_freq, float attn_factor, RopeLayout layout);

}  // namespace winnow::kernels
