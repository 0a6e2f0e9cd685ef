// Small float32 vector primitives shared by the CPU kernels. Each has one fixed summation order
// for a given length, so results never depend on which caller or batch they come from.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace winnow::kernels {

#if defined(__AVX2__) && defined(__FMA__)
inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
#endif

// Σ a[i] * b[i].
inline float Dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// scale * (q . keys[i]) into out[i] for i < 8, d a multiple of 8. Lane l of each dot sums
// q[l + 8m] * k[l + 8m] over m in order, one fused multiply-add a term; the lanes are then added
// as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The 8 dots are reduced together (the
// horizontal sums cost as much as the products when done one dot at a time), and every dot has
// that one arithmetic whatever its position among the 8 or the keys beside it.
inline void ScaledDots8(const float* q, const float* const keys[8], int64_t d, float scale,
                        float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(keys[k] + c), acc[k]);
  }
  // hadd pairs neighbouring lanes within each 128-bit half; two rounds give, per key, the sums of
  // lanes 0-3 (low half) and 4-7 (high half), which the last add combines.
  const __m256 q0123 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
                                      _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 q4567 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
                                      _mm256_hadd_ps(acc[6], acc[7]));
  const __m256 low = _mm256_permute2f128_ps(q0123, q4567, 0x20);
  const __m256 high = _mm256_permute2f128_ps(q0123, q4567, 0x31);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_add_ps(low, high), _mm256_set1_ps(scale)));
#else
  for (int k = 0; k < 8; ++k) {
    float lane[8] = {};
    for (int64_t c = 0; c < d; c += 8) {
      for (int l = 0; l < 8; ++l) lane[l] = std::fma(q[c + l], keys[k][c + l], lane[l]);
    }
    out[k] = (((lane[0] + lane[1]) + (lane[2] + lane[3])) +
              ((lane[4] + lane[5]) + (lane[6] + lane[7]))) * scale;
  }
#endif
}

// scale * (q . keys[i]) into out[i] for i < n <= 8: ScaledDots8's arithmetic when d is a
// multiple of 8, Dot's otherwise, so a dot never depends on n or on the keys beside it.
inline void ScaledDotsUpTo8(const float* q, const float* const* keys, int n, int64_t d,
                            float scale, float* out) {
  if (d % 8 != 0) {
    for (int k = 0; k < n; ++k) out[k] = Dot(q, keys[k], d) * scale;
    return;
  }
  const float* rows[8];
  // Past the last key the row is repeated; its results are dropped.
  for (int k = 0; k < 8; ++k) rows[k] = keys[std::min(k, n - 1)];
  float dots[8];
  ScaledDots8(q, rows, d, scale, dots);
  std::copy(dots, dots + n, out);
}

// scale * (q . k_j) into out[j] for the n rows k_j of `keys` (row-major, d floats apart).
inline void ScaledDots(const float* q, const float* keys, int64_t n, int64_t d, float scale,
                       float* out) {
  for (int64_t j = 0; j < n; j += 8) {
    const int m = static_cast<int>(std::min<int64_t>(8, n - j));
    const float* rows[8];
    for (int k = 0; k < m; ++k) rows[k] = keys + (j + k) * d;
    ScaledDotsUpTo8(q, rows, m, d, scale, out + j);
  }
}

// y[i] += alpha * x[i].
inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 va = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace winnow::kernels
