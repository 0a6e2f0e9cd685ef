#include "kernels/cpu/ops.h"

#include <cmath>

#include "kernels/cpu/vec.h"

namespace winnow::kernels {

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  // Accumulate in double: the reference computes the mean in float32, and a double sum is at
  // least as accurate while staying independent of vector width.
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += double{x[i]} * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / n + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

// The exp is vec's polynomial (ExpVec8 and its bit-identical ExpScalar for the tail): libm's
// scalar expf made this 7% of a prefill. Its clamp keeps exp(-g) finite, so g / (1 + exp(-g))
// still goes to 0 and g at the ends.
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = vec::ExpVec8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + vec::ExpScalar(-g)) * up[i];
  }
}

// 0.5 g (1 + tanh(u)) = g sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3): SiluMul's form with
// 2u in the exponent.
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;  // 2 sqrt(2 / pi)
  constexpr float kCubic = 0.044715f;
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_scale = _mm256_set1_ps(-kTwoSqrt2OverPi);
  const __m256 cubic = _mm256_set1_ps(kCubic);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(cubic, g), _mm256_mul_ps(g, g), g);
    const __m256 e = vec::ExpVec8(_mm256_mul_ps(minus_scale, inner));
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    const float inner = std::fma(kCubic * g, g * g, g);
    out[i] = g / (1.0f + vec::ExpScalar(-kTwoSqrt2OverPi * inner)) * up[i];
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void ApplyRope(float* heads, int32_t num_heads, int32_t head_dim, int32_t rope_dim,
               int32_t position, const float* inv_freq, float attn_factor, RopeLayout layout) {
  const int32_t half = rope_dim / 2;
  // cos/sin once per token, shared by all heads. rope_dim is at most a few hundred.
  float cos_table[512];
  float sin_table[512];
  for (int32_t i = 0; i < half; ++i) {
    // Angles in double: positions reach 10^5+, where float angles lose the low bits.
    const double angle = static_cast<double>(position) * inv_freq[i];
    cos_table[i] = static_cast<float>(std::cos(angle)) * attn_factor;
    sin_table[i] = static_cast<float>(std::sin(angle)) * attn_factor;
  }
  for (int32_t h = 0; h < num_heads; ++h) {
    float* v = heads + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const int32_t a = layout == RopeLayout::kAdjacent ? 2 * i : i;
      const int32_t b = layout == RopeLayout::kAdjacent ? 2 * i + 1 : i + half;
      const float x0 = v[a];
      const float x1 = v[b];
      v[a] = x0 * cos_table[i] - x1 * sin_table[i];
      v[b] = x0 * sin_table[i] + x1 * cos_table[i];
    }
  }
}

}  // namespace winnow::kernels
