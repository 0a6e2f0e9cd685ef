// Small inline SIMD helpers shared by the CPU kernels.
//
// `VecF` is the widest float vector the build targets: 16 lanes with AVX-512, 8 with AVX2+FMA,
// and a 4-lane struct elsewhere (which compilers still auto-vectorise). Kernels written against
// VecF/kLanes therefore compile everywhere and pick up the wide path from -march alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
// GCC 12's AVX-512 intrinsics build their pass-through operand from a self-initialised
// "undefined" vector, which -Wuninitialized reports at every use; the warning is spurious.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace winnow::kernels::vec {

// ---------------------------------------------------------------------------------------------
// Scalar helpers.

inline uint16_t LoadU16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline uint32_t LoadU32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE binary16 -> float32, exact for every input (subnormals, inf and NaN included). The one
// conversion the kernels and DequantizeRow share.
inline float Fp16ToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float32.
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  // Inf, or NaN made quiet, as F16C's vcvtph2ps does, so both builds agree bit for bit.
  if (exponent == 31) {
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u));
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
#endif
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// ---------------------------------------------------------------------------------------------
// VecF: the native float vector.

#if defined(__AVX512F__)

inline constexpr int kLanes = 16;
using VecF = __m512;
inline VecF Zero() { return _mm512_setzero_ps(); }
inline VecF Set1(float v) { return _mm512_set1_ps(v); }
inline VecF Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF Add(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF Mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF Fmadd(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c

#elif defined(__AVX2__) && defined(__FMA__)

inline constexpr int kLanes = 8;
using VecF = __m256;
inline VecF Zero() { return _mm256_setzero_ps(); }
inline VecF Set1(float v) { return _mm256_set1_ps(v); }
inline VecF Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF Add(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF Mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF Fmadd(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }

#else

inline constexpr int kLanes = 4;
struct VecF {
  float lane[kLanes];
};
inline VecF Zero() { return VecF{}; }
inline VecF Set1(float v) { return VecF{{v, v, v, v}}; }
inline VecF Load(const float* p) {
  VecF r;
  std::memcpy(r.lane, p, sizeof(r.lane));
  return r;
}
inline void Store(float* p, VecF v) { std::memcpy(p, v.lane, sizeof(v.lane)); }
inline VecF Add(VecF a, VecF b) {
  for (int i = 0; i < kLanes; ++i) a.lane[i] += b.lane[i];
  return a;
}
inline VecF Mul(VecF a, VecF b) {
  for (int i = 0; i < kLanes; ++i) a.lane[i] *= b.lane[i];
  return a;
}
inline VecF Fmadd(VecF a, VecF b, VecF c) {
  for (int i = 0; i < kLanes; ++i) c.lane[i] += a.lane[i] * b.lane[i];
  return c;
}
inline float ReduceAdd(VecF v) { return (v.lane[0] + v.lane[1]) + (v.lane[2] + v.lane[3]); }

#endif

// Pins a loaded vector in a register. GCC otherwise re-reads a value it loaded from memory at
// each use (as a memory operand) when that looks free; in a register-blocked kernel that turns
// one load per k-step into one per FMA and makes the kernel load-bound.
inline void KeepInRegister(VecF& v) {
#if (defined(__AVX2__) || defined(__AVX512F__)) && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// ---------------------------------------------------------------------------------------------
// Explicit 8-wide helpers, for code that works on 8-float tiles regardless of the native width.

#if defined(__AVX2__)

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Transposes the 8x8 tile held in r[0..7] (r[i] = row i) in place.
inline void Transpose8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 s[8];
  for (int i = 0; i < 8; i += 4) {
    s[i + 0] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

#endif

// A fixed pairwise tree (fold halves down to one lane), so a reduction never depends on which
// kernel or build of the same ISA calls it.
#if defined(__AVX512F__)
// GCC 12 reports a false -Wuninitialized inside its own avx512fintrin.h (the __Y of these
// casts) when ReduceAdd is inlined into some callers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline float ReduceAdd(VecF v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return HorizontalSum(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}
#pragma GCC diagnostic pop
#elif defined(__AVX2__) && defined(__FMA__)
inline float ReduceAdd(VecF v) { return HorizontalSum(v); }
#endif

// ---------------------------------------------------------------------------------------------
// exp for softmax: Cephes' single-precision polynomial (about 2 ulp over the clamped range,
// [-87.3, 88.4]; smaller inputs give ~1e-38 instead of 0). ExpScalar performs the same
// operations as ExpVec8 does in each lane, so a value's exp never depends on its position.

namespace exp_detail {
inline constexpr float kLo = -87.3365447504f, kHi = 88.3762626647f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_detail

inline float ExpScalar(float x) {
  using namespace exp_detail;
  x = std::min(std::max(x, kLo), kHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
  const float y = std::fma(p, r * r, r) + 1.0f;
  return y * BitsToFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 ExpVec8(__m256 x) {
  using namespace exp_detail;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kLo)), _mm256_set1_ps(kHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i pow2 = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}
#endif

// x[i] = exp(x[i] - shift) for i < n.
inline void ExpShifted(float* x, int64_t n, float shift) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vs = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, ExpVec8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs)));
  }
#endif
  for (; i < n; ++i) x[i] = ExpScalar(x[i] - shift);
}

// ---------------------------------------------------------------------------------------------
// Float array primitives. Several independent accumulators hide the FMA latency.

inline float Dot(const float* a, const float* b, int64_t n) {
  VecF acc[4] = {Zero(), Zero(), Zero(), Zero()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int u = 0; u < 4; ++u) {
      acc[u] = Fmadd(Load(a + i + u * kLanes), Load(b + i + u * kLanes), acc[u]);
    }
  }
  for (; i + kLanes <= n; i += kLanes) acc[0] = Fmadd(Load(a + i), Load(b + i), acc[0]);
  float sum = ReduceAdd(Add(Add(acc[0], acc[1]), Add(acc[2], acc[3])));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline float Sum(const float* a, int64_t n) {
  VecF acc[2] = {Zero(), Zero()};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc[0] = Add(acc[0], Load(a + i));
    acc[1] = Add(acc[1], Load(a + i + kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) acc[0] = Add(acc[0], Load(a + i));
  float sum = ReduceAdd(Add(acc[0], acc[1]));
  for (; i < n; ++i) sum += a[i];
  return sum;
}

// y[i] += alpha * x[i]
inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
  const VecF va = Set1(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(y + i, Fmadd(va, Load(x + i), Load(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace winnow::kernels::vec
