// Small float32 vector primitives shared by the CPU kernels. Each has one fixed summation order
// for a given length, so results never depend on which caller or batch they come from.
#pragma once

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
