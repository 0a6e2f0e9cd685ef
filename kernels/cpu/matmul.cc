// Weight matmul kernels.
//
// Two strategies, picked by the number of input rows m:
//  - Decode (small m): memory-bound. Threads split the output rows; each weight row is streamed
//    once, unpacked one 32-element block at a time into registers, and multiplied against up to
//    8 input rows while it is there (register blocking over m).
//  - Prefill (larger m): compute-bound. Threads split the weight rows; a group of rows is
//    dequantised once into a thread-local float buffer that stays in L2, and an MR x NR
//    register-tiled micro-kernel runs every input row past it.
// Activations stay float32 throughout; only the weights are decoded, so results equal the
// product with the dequantised matrix up to float rounding. Both paths sum every output in the
// same order (see "Summation order"), so results are also independent of m and of the pool.

#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels {
namespace {

using vec::kLanes;
using vec::VecF;

// Every fast format is unpacked 32 elements at a time: that is the quantisation block of
// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, a sub-block of the K-quants' 256-element super-blocks, and a whole
// number of vectors at every width.
constexpr int kBlock = 32;
constexpr int kVecsPerBlock = kBlock / kLanes;

// ---------------------------------------------------------------------------------------------
// Formats. Each knows the byte size of a 32-element block, how to decode one element (for tails
// and for builds without SIMD), and how to decode a whole block into kVecsPerBlock vectors.

template <typename Format>
inline void UnpackScalar(const uint8_t* block, VecF* out) {
  alignas(64) float tmp[kBlock];
  for (int i = 0; i < kBlock; ++i) tmp[i] = Format::Element(block, i);
  for (int v = 0; v < kVecsPerBlock; ++v) out[v] = vec::Load(tmp + v * kLanes);
}

struct F32Format {
  static constexpr bool kPlain = true;  // any cols; element k lives at k * kElementBytes
  static constexpr int64_t kElementBytes = 4;
  static constexpr int64_t kBlockBytes = kBlock * kElementBytes;
  static float Element(const uint8_t* p, int64_t i) {
    float v;
    std::memcpy(&v, p + i * kElementBytes, sizeof(v));
    return v;
  }
  static void Unpack(const uint8_t* p, VecF* out) {
    for (int v = 0; v < kVecsPerBlock; ++v) {
      out[v] = vec::Load(reinterpret_cast<const float*>(p) + v * kLanes);
    }
  }
};

struct F16Format {
  static constexpr bool kPlain = true;
  static constexpr int64_t kElementBytes = 2;
  static constexpr int64_t kBlockBytes = kBlock * kElementBytes;
  static float Element(const uint8_t* p, int64_t i) {
    return vec::Fp16ToFloat(vec::LoadU16(p + i * kElementBytes));
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__)
    for (int v = 0; v < 2; ++v) {
      out[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + v));
    }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    for (int v = 0; v < 4; ++v) {
      out[v] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + v));
    }
#else
    UnpackScalar<F16Format>(p, out);
#endif
  }
};

struct BF16Format {
  static constexpr bool kPlain = true;
  static constexpr int64_t kElementBytes = 2;
  static constexpr int64_t kBlockBytes = kBlock * kElementBytes;
  static float Element(const uint8_t* p, int64_t i) {
    return vec::Bf16ToFloat(vec::LoadU16(p + i * kElementBytes));
  }
  // bf16 is the top half of a float32: widen to 32 bits and shift into place.
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__)
    for (int v = 0; v < 2; ++v) {
      const __m512i wide =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + v));
      out[v] = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (int v = 0; v < 4; ++v) {
      const __m256i wide =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + v));
      out[v] = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
#else
    UnpackScalar<BF16Format>(p, out);
#endif
  }
};

// Q8_0: fp16 d, then 32 int8 q; value = d * q.
struct Q8_0Format {
  static constexpr bool kPlain = false;
  static constexpr int64_t kBlockBytes = 34;
  static float Element(const uint8_t* p, int64_t i) {
    return vec::Fp16ToFloat(vec::LoadU16(p)) * static_cast<float>(static_cast<int8_t>(p[2 + i]));
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__)
    const VecF d = vec::Set1(vec::Fp16ToFloat(vec::LoadU16(p)));
    for (int v = 0; v < 2; ++v) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 16 * v));
      out[v] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const VecF d = vec::Set1(vec::Fp16ToFloat(vec::LoadU16(p)));
    for (int v = 0; v < 4; ++v) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * v));
      out[v] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
#else
    UnpackScalar<Q8_0Format>(p, out);
#endif
  }
};

#if defined(__AVX512F__)
// A 4-bit block takes only 16 distinct values, so instead of converting every nibble we build
// the 16-entry table value(q) with one FMA and look all 32 elements up with two permutes
// (vpermps reads just the low 4 bits of each index lane).
inline void UnpackNibblesByTable(const uint8_t* qs, __m512 table, VecF* out) {
  const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  out[0] = _mm512_permutexvar_ps(idx, table);
  out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table);
}

inline __m512 Iota16() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
#elif defined(__AVX2__) && defined(__FMA__)
// value = scale * q + offset for the 32 nibbles; the FMA rounds once, like (q - 8) * d does.
inline void UnpackNibblesAffine(const uint8_t* qs, __m256 scale, __m256 offset, VecF* out) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int v = 0; v < 4; ++v) {
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[v]));
    out[v] = _mm256_fmadd_ps(q, scale, offset);
  }
}
#endif

// Q4_0: fp16 d, then 16 bytes of nibbles; value = (q - 8) * d.
struct Q4_0Format {
  static constexpr bool kPlain = false;
  static constexpr int64_t kBlockBytes = 18;
  static float Element(const uint8_t* p, int64_t i) {
    return static_cast<float>(Nibble(p + 2, i) - 8) * vec::Fp16ToFloat(vec::LoadU16(p));
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__)
    const float d = vec::Fp16ToFloat(vec::LoadU16(p));
    // (k - 8) * d for k in 0..15: exact integers times d, one rounding each.
    const __m512 table = _mm512_mul_ps(_mm512_sub_ps(Iota16(), _mm512_set1_ps(8.0f)),
                                       _mm512_set1_ps(d));
    UnpackNibblesByTable(p + 2, table, out);
#elif defined(__AVX2__) && defined(__FMA__)
    const float d = vec::Fp16ToFloat(vec::LoadU16(p));
    // q * d - 8d == (q - 8) * d exactly before the single rounding (8d is exact).
    UnpackNibblesAffine(p + 2, _mm256_set1_ps(d), _mm256_set1_ps(-8.0f * d), out);
#else
    UnpackScalar<Q4_0Format>(p, out);
#endif
  }
};

// Q4_1: fp16 d, fp16 m, then 16 bytes of nibbles; value = d * q + m.
struct Q4_1Format {
  static constexpr bool kPlain = false;
  static constexpr int64_t kBlockBytes = 20;
  static float Element(const uint8_t* p, int64_t i) {
    return static_cast<float>(Nibble(p + 4, i)) * vec::Fp16ToFloat(vec::LoadU16(p)) +
           vec::Fp16ToFloat(vec::LoadU16(p + 2));
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX2__) && defined(__FMA__)
    const float d = vec::Fp16ToFloat(vec::LoadU16(p));
    const float m = vec::Fp16ToFloat(vec::LoadU16(p + 2));
#endif
#if defined(__AVX512F__)
    UnpackNibblesByTable(p + 4, _mm512_fmadd_ps(_mm512_set1_ps(d), Iota16(), _mm512_set1_ps(m)),
                         out);
#elif defined(__AVX2__) && defined(__FMA__)
    UnpackNibblesAffine(p + 4, _mm256_set1_ps(d), _mm256_set1_ps(m), out);
#else
    UnpackScalar<Q4_1Format>(p, out);
#endif
  }
};

using vec::LoadU32;

// The 32 five-bit quants of a Q5 block: nibble | (bit i of qh) << 4, as int32 lanes in element
// order.
#if defined(__AVX512F__)
using VecI = __m512i;
inline VecF ToFloat(VecI q) { return _mm512_cvtepi32_ps(q); }
inline VecI SubI(VecI q, int k) { return _mm512_sub_epi32(q, _mm512_set1_epi32(k)); }

inline void Q5Quants(const uint8_t* qs, uint32_t qh, __m512i* q) {
  const __m512i bytes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i nibbles[2] = {_mm512_and_si512(bytes, _mm512_set1_epi32(0x0f)),
                              _mm512_srli_epi32(bytes, 4)};
  for (int v = 0; v < 2; ++v) {
    const __mmask16 high = static_cast<__mmask16>(qh >> (16 * v));
    q[v] = _mm512_mask_add_epi32(nibbles[v], high, nibbles[v], _mm512_set1_epi32(16));
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
using VecI = __m256i;
inline VecF ToFloat(VecI q) { return _mm256_cvtepi32_ps(q); }
inline VecI SubI(VecI q, int k) { return _mm256_sub_epi32(q, _mm256_set1_epi32(k)); }

inline void Q5Quants(const uint8_t* qs, uint32_t qh, __m256i* q) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (int v = 0; v < 4; ++v) {  // elements 8v..8v+7 take bits 8v..8v+7 of qh
    const __m256i bits = _mm256_and_si256(
        _mm256_set1_epi32(static_cast<int>((qh >> (8 * v)) & 0xffu)), lane_bit);
    const __m256i high =
        _mm256_and_si256(_mm256_cmpeq_epi32(bits, lane_bit), _mm256_set1_epi32(16));
    q[v] = _mm256_add_epi32(_mm256_cvtepu8_epi32(parts[v]), high);
  }
}
#endif

inline int Q5Quant(const uint8_t* qs, uint32_t qh, int64_t i) {
  return Nibble(qs, i) | static_cast<int>(((qh >> i) & 1u) << 4);
}

// Q5_0: fp16 d, 4 bytes qh (bit i = 5th bit of element i), 16 bytes of nibbles;
// value = (q - 16) * d.
struct Q5_0Format {
  static constexpr bool kPlain = false;
  static constexpr int64_t kBlockBytes = 22;
  static float Element(const uint8_t* p, int64_t i) {
    return vec::Fp16ToFloat(vec::LoadU16(p)) *
           static_cast<float>(Q5Quant(p + 6, LoadU32(p + 2), i) - 16);
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    const VecF d = vec::Set1(vec::Fp16ToFloat(vec::LoadU16(p)));
    VecI q[kVecsPerBlock];
    Q5Quants(p + 6, LoadU32(p + 2), q);
    for (int v = 0; v < kVecsPerBlock; ++v) {
      out[v] = vec::Mul(ToFloat(SubI(q[v], 16)), d);
    }
#else
    UnpackScalar<Q5_0Format>(p, out);
#endif
  }
};

// Q5_1: fp16 d, fp16 m, 4 bytes qh, 16 bytes of nibbles; value = d * q + m (one rounding, as
// Q4_1's).
struct Q5_1Format {
  static constexpr bool kPlain = false;
  static constexpr int64_t kBlockBytes = 24;
  static float Element(const uint8_t* p, int64_t i) {
    return std::fma(static_cast<float>(Q5Quant(p + 8, LoadU32(p + 4), i)),
                    vec::Fp16ToFloat(vec::LoadU16(p)), vec::Fp16ToFloat(vec::LoadU16(p + 2)));
  }
  static void Unpack(const uint8_t* p, VecF* out) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    const VecF d = vec::Set1(vec::Fp16ToFloat(vec::LoadU16(p)));
    const VecF m = vec::Set1(vec::Fp16ToFloat(vec::LoadU16(p + 2)));
    VecI q[kVecsPerBlock];
    Q5Quants(p + 8, LoadU32(p + 4), q);
    for (int v = 0; v < kVecsPerBlock; ++v) out[v] = vec::Fmadd(ToFloat(q[v]), d, m);
#else
    UnpackScalar<Q5_1Format>(p, out);
#endif
  }
};

// K-quants store 256 elements per super-block; the kernels take them 32 at a time, so these
// formats unpack sub-block `sub` (0..7) of a super-block, and kSubBlocks tells the callers.

// Q4_K and Q5_K share a header: fp16 d, fp16 dmin, 12 bytes of eight 6-bit (scale, min) pairs.
// Sub-block j's step is d * scale_j and its offset dmin * min_j.
inline void KStepOffset(const uint8_t* p, int sub, float* step, float* offset) {
  int sc, mn;
  KScaleMin(p + 4, sub, &sc, &mn);
  *step = vec::Fp16ToFloat(vec::LoadU16(p)) * static_cast<float>(sc);
  *offset = vec::Fp16ToFloat(vec::LoadU16(p + 2)) * static_cast<float>(mn);
}

// Sub-block `sub` of a Q4_K/Q5_K super-block: q = nibble (low for even sub, high for odd) of
// bytes qs[32 * (sub / 2) ..], plus (Q5_K) bit `sub` of qh[k] as the fifth bit; value =
// step * q - offset, one rounding.
template <bool kFifthBit>
inline void UnpackKSub(const uint8_t* qs, const uint8_t* qh, int sub, float step, float offset,
                       VecF* out) {
  const uint8_t* q = qs + 32 * (sub / 2);
  const int shift = 4 * (sub % 2);
#if defined(__AVX512F__)
  for (int v = 0; v < 2; ++v) {
    __m512i n = _mm512_and_si512(
        _mm512_srli_epi32(
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * v))),
            shift),
        _mm512_set1_epi32(15));
    if constexpr (kFifthBit) {
      const __m512i h = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * v)));
      n = _mm512_or_si512(
          n, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, sub), _mm512_set1_epi32(1)),
                               4));
    }
    out[v] = _mm512_fmsub_ps(_mm512_cvtepi32_ps(n), _mm512_set1_ps(step), _mm512_set1_ps(offset));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (int v = 0; v < 4; ++v) {
    __m256i n = _mm256_and_si256(
        _mm256_srli_epi32(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * v))),
            shift),
        _mm256_set1_epi32(15));
    if constexpr (kFifthBit) {
      const __m256i h =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + 8 * v)));
      n = _mm256_or_si256(
          n, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, sub), _mm256_set1_epi32(1)),
                               4));
    }
    out[v] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(step), _mm256_set1_ps(offset));
  }
#else
  alignas(64) float tmp[kBlock];
  for (int k = 0; k < kBlock; ++k) {
    int n = (q[k] >> shift) & 15;
    if constexpr (kFifthBit) n |= ((qh[k] >> sub) & 1) << 4;
    tmp[k] = std::fma(static_cast<float>(n), step, -offset);
  }
  for (int v = 0; v < kVecsPerBlock; ++v) out[v] = vec::Load(tmp + v * kLanes);
#endif
}

// Q4_K: the shared header, then 128 bytes of nibbles.
struct Q4_KFormat {
  static constexpr bool kPlain = false;
  static constexpr int kSubBlocks = 8;
  static constexpr int64_t kBlockBytes = 144;
  static void UnpackSub(const uint8_t* p, int sub, VecF* out) {
    float step, offset;
    KStepOffset(p, sub, &step, &offset);
    UnpackKSub<false>(p + 16, nullptr, sub, step, offset, out);
  }
};

// Q5_K: the shared header, 32 bytes of fifth bits (bit j of qh[k] for sub-block j), then 128
// bytes of nibbles.
struct Q5_KFormat {
  static constexpr bool kPlain = false;
  static constexpr int kSubBlocks = 8;
  static constexpr int64_t kBlockBytes = 176;
  static void UnpackSub(const uint8_t* p, int sub, VecF* out) {
    float step, offset;
    KStepOffset(p, sub, &step, &offset);
    UnpackKSub<true>(p + 48, p + 16, sub, step, offset, out);
  }
};

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, fp16 d. Sub-block
// j = 4h + r reads nibble r / 2 of ql[64h + 32 (r % 2) + k] and bits 2r of qh[32h + k] for
// k < 32; value = (d * scale[8h + 2r + k / 16]) * (q - 32).
struct Q6_KFormat {
  static constexpr bool kPlain = false;
  static constexpr int kSubBlocks = 8;
  static constexpr int64_t kBlockBytes = 210;
  static void UnpackSub(const uint8_t* p, int sub, VecF* out) {
    const int h = sub / 4, r = sub % 4;
    const uint8_t* ql = p + 64 * h + 32 * (r % 2);
    const uint8_t* qh = p + 128 + 32 * h;
    const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192) + 8 * h + 2 * r;
    const float d = vec::Fp16ToFloat(vec::LoadU16(p + 208));
    const float scale[2] = {d * static_cast<float>(scales[0]), d * static_cast<float>(scales[1])};
    const int low_shift = 4 * (r / 2), high_shift = 2 * r;
#if defined(__AVX512F__)
    for (int v = 0; v < 2; ++v) {  // v = k / 16, the scale's index
      const __m512i lo = _mm512_and_si512(
          _mm512_srli_epi32(_mm512_cvtepu8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * v))),
                            low_shift),
          _mm512_set1_epi32(15));
      const __m512i hi = _mm512_and_si512(
          _mm512_srli_epi32(_mm512_cvtepu8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * v))),
                            high_shift),
          _mm512_set1_epi32(3));
      const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)),
                                         _mm512_set1_epi32(32));
      out[v] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale[v]));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (int v = 0; v < 4; ++v) {  // elements 8v..8v+7; scale index v / 2
      const __m256i lo = _mm256_and_si256(
          _mm256_srli_epi32(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + 8 * v))),
              low_shift),
          _mm256_set1_epi32(15));
      const __m256i hi = _mm256_and_si256(
          _mm256_srli_epi32(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + 8 * v))),
              high_shift),
          _mm256_set1_epi32(3));
      const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                         _mm256_set1_epi32(32));
      out[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale[v / 2]));
    }
#else
    alignas(64) float tmp[kBlock];
    for (int k = 0; k < kBlock; ++k) {
      const int q = (((ql[k] >> low_shift) & 15) | (((qh[k] >> high_shift) & 3) << 4)) - 32;
      tmp[k] = scale[k / 16] * static_cast<float>(q);
    }
    for (int v = 0; v < kVecsPerBlock; ++v) out[v] = vec::Load(tmp + v * kLanes);
#endif
  }
};

// Block b (32 elements) of a row, whichever way the format stores it.
template <typename Format>
inline void UnpackAt(const uint8_t* row, int64_t b, VecF* out) {
  if constexpr (requires { Format::kSubBlocks; }) {
    Format::UnpackSub(row + b / Format::kSubBlocks * Format::kBlockBytes,
                      static_cast<int>(b % Format::kSubBlocks), out);
  } else {
    Format::Unpack(row + b * Format::kBlockBytes, out);
  }
}

// Dequantises one whole row of `cols` elements into dst.
template <typename Format>
void DequantRow(const uint8_t* row, int64_t cols, float* dst) {
  const int64_t num_blocks = cols / kBlock;
  for (int64_t b = 0; b < num_blocks; ++b) {
    VecF w[kVecsPerBlock];
    UnpackAt<Format>(row, b, w);
    for (int v = 0; v < kVecsPerBlock; ++v) vec::Store(dst + b * kBlock + v * kLanes, w[v]);
  }
  if constexpr (Format::kPlain) {
    for (int64_t k = num_blocks * kBlock; k < cols; ++k) dst[k] = Format::Element(row, k);
  }
}

// ---------------------------------------------------------------------------------------------
// Scratch memory.

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// Per-thread scratch slots, grown on demand and kept for the life of the (pool) thread. A thread
// runs either the decode or the prefill path at a time, so the two share slots.
enum ScratchSlot : int {
  kInputCopySlot = 0,    // decode: aligned copy of x
  kWeightRowSlot = 1,    // decode, generic types: one dequantised weight row
  kPackedSlot = 0,       // prefill: a group of dequantised weight rows
};

float* Scratch(ScratchSlot slot, int64_t floats) {
  struct Buffer {
    std::unique_ptr<float, AlignedFree> data;
    int64_t size = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[slot];
  if (b.size < floats) {
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    b.size = floats;
  }
  return b.data.get();
}

// A copy of x with 64-byte aligned rows: the decode loop loads x with full-width vectors, and
// loads that straddle two cache lines (x from a plain std::vector is only 16-byte aligned) cost
// about a quarter of the decode throughput at m = 8. The copy is m * cols floats per thread, tiny
// next to the rows * cols weights each thread streams.
const float* AlignedInput(const float* x, int64_t m, int64_t cols, int64_t* ldx) {
  *ldx = (cols + 15) / 16 * 16;
  float* copy = Scratch(kInputCopySlot, m * *ldx);
  for (int64_t j = 0; j < m; ++j) std::memcpy(copy + j * *ldx, x + j * cols, cols * sizeof(float));
  return copy;
}

// ---------------------------------------------------------------------------------------------
// Summation order.
//
// Every output y[i][r] is summed in one canonical order, whichever path, m, batch composition or
// thread count produces it: vector lanes run along k; within each 32-element block the
// kVecsPerBlock lane-wise products are summed left to right (w0*x0, + w1*x1, ...), and that block
// partial is added to the running lane sums; then vec::ReduceAdd folds the lanes and, for plain
// types only, elements past the last whole block are added one at a time. A sequence therefore
// gets bit-identical logits alone or batched with others (the model tests compare them exactly).
// Summing the block partial before adding it also keeps the loop-carried chain to one add per
// block, so even m = 1 is not bound by FMA latency.

// acc[j] += block b of (w . x_j) for j < M; w holds the block's unpacked weights.
template <int M>
inline void AccumulateBlock(const VecF* w, const float* x, int64_t ldx, int64_t k, VecF* acc) {
  for (int j = 0; j < M; ++j) {
    const float* xj = x + j * ldx + k;
    VecF partial = vec::Mul(w[0], vec::Load(xj));
    for (int v = 1; v < kVecsPerBlock; ++v) {
      partial = vec::Fmadd(w[v], vec::Load(xj + v * kLanes), partial);
    }
    acc[j] = vec::Add(acc[j], partial);
  }
}

// Final step of the canonical order: fold the lanes, then the n tail elements in k order.
inline float FinishDot(VecF acc, const float* w_tail, const float* x_tail, int64_t n) {
  float sum = vec::ReduceAdd(acc);
  for (int64_t t = 0; t < n; ++t) sum += w_tail[t] * x_tail[t];
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Decode path: one weight row against M (<= kDecodeMaxM) input rows.

constexpr int kDecodeMaxM = 8;

// out[j * ldy] = dot(row, x[j * ldx ..]) for j < M. M accumulators plus one block of weights fit
// the register file for M <= 8 at either vector width.
template <typename Format, int M>
void DotRowM(const uint8_t* row, int64_t cols, const float* x, int64_t ldx, float* out,
             int64_t ldy) {
  VecF acc[M];
  for (VecF& a : acc) a = vec::Zero();
  const int64_t num_blocks = cols / kBlock;
  for (int64_t b = 0; b < num_blocks; ++b) {
    VecF w[kVecsPerBlock];
    UnpackAt<Format>(row, b, w);
    for (VecF& v : w) vec::KeepInRegister(v);  // F32 rows: load once, not once per input row
    AccumulateBlock<M>(w, x, ldx, b * kBlock, acc);
  }
  const int64_t k0 = num_blocks * kBlock;
  // Only plain types have a partial block (the quantised ones are validated to whole blocks).
  const int64_t n_tail = Format::kPlain ? cols - k0 : 0;
  float w_tail[kBlock];
  if constexpr (Format::kPlain) {
    for (int64_t t = 0; t < n_tail; ++t) w_tail[t] = Format::Element(row, k0 + t);
  }
  for (int j = 0; j < M; ++j) out[j * ldy] = FinishDot(acc[j], w_tail, x + j * ldx + k0, n_tail);
}

using DotRowFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);

template <typename Format>
DotRowFn DotRowFor(int64_t m) {
  static constexpr DotRowFn kTable[kDecodeMaxM + 1] = {
      nullptr,
      DotRowM<Format, 1>,
      DotRowM<Format, 2>,
      DotRowM<Format, 3>,
      DotRowM<Format, 4>,
      DotRowM<Format, 5>,
      DotRowM<Format, 6>,
      DotRowM<Format, 7>,
      DotRowM<Format, 8>};
  return kTable[m];
}

// y[:, r] for r in [r0, r1). Each weight row is fetched from memory once and multiplied against
// a chunk of input rows while in registers. The chunk is at most kDecodeMaxM rows and at most
// kDecodeInputBytes of x: every weight row re-reads the whole chunk, which must therefore stay in
// L1 (at cols = 1536, 8 rows = 48 KiB ran 1.5x slower than 6). With more input rows than one
// chunk, a short block of weight rows (kGemvRowBlock x row_bytes, a few KiB) is replayed from L1
// for each chunk, instead of cycling all m input rows through L1 for every weight row.
constexpr int64_t kDecodeInputBytes = 36 << 10;
constexpr int64_t kGemvRowBlock = 16;

template <typename Format>
void GemvRows(const uint8_t* data, int64_t row_bytes, int64_t cols, int64_t rows, const float* x,
              int64_t ldx, int64_t m, float* y, int64_t r0, int64_t r1) {
  const int64_t fit = kDecodeInputBytes / (ldx * int64_t{sizeof(float)});
  const int64_t chunk = std::clamp<int64_t>(fit, 1, kDecodeMaxM);
  const DotRowFn full = DotRowFor<Format>(chunk);
  const DotRowFn tail = DotRowFor<Format>(m % chunk);
  for (int64_t rb = r0; rb < r1; rb += kGemvRowBlock) {
    const int64_t re = std::min(r1, rb + kGemvRowBlock);
    for (int64_t j = 0; j < m; j += chunk) {
      const DotRowFn dot = m - j >= chunk ? full : tail;
      for (int64_t r = rb; r < re; ++r) {
        dot(data + r * row_bytes, cols, x + j * ldx, ldx, y + j * rows + r, rows);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill path: weight rows dequantised once per group, then a register-tiled micro-kernel.

// The micro-kernel computes an MR x NR tile of outputs, each its own lane-wise accumulator (the
// canonical order above). Per block it holds the MR x kVecsPerBlock input vectors in registers
// and streams each weight row's block past them, so each weight load feeds MR outputs and each
// input load NR. AVX-512: 16 accumulators + 8 inputs + 2 weights fit the 32 zmm registers.
// AVX2 cannot fit a tile that large in 16 ymm; 2 x 6 (some accumulators spill, but they are
// touched once per block) measured best of 2x2 .. 3x4 on Zen 4, ~30% ahead of the spill-free 2x2.
#if defined(__AVX512F__)
constexpr int kMr = 4;
constexpr int kNr = 4;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kMr = 2;
constexpr int kNr = 6;
#else
constexpr int kMr = 2;
constexpr int kNr = 2;
#endif

// Weight rows dequantised together: as many as fit ~192 KiB of floats (at least kNr). The group
// stays in L2 while all m input rows stream past it, so each input element brought into cache
// feeds that many weight rows; each MR-row input tile (MR x cols floats) stays in L1 across the
// group's NR-row tiles.
constexpr int64_t kGroupBytes = 192 << 10;

// Below this many input rows, decoding the weights straight into registers beats dequantising
// them to memory first, which only pays off when enough input rows reuse each row. Zen 4,
// 576x1536 Q4_1, one thread (GFLOP/s, decode vs packed): m = 4: 60 vs 49, m = 8: 71 vs 75,
// m = 12: 69 vs 80. Both paths sum in the canonical order, so this choice never changes results.
constexpr int64_t kPrefillMinM = 10;

int64_t GroupRows(int64_t cols) {
  const int64_t fit = kGroupBytes / (cols * int64_t{sizeof(float)}) / kNr * kNr;
  return std::max<int64_t>(kNr, fit);
}

// y[i][r] for MR input rows x[i * ldx] and kNr dequantised weight rows w[r * ldw] (cols each).
// Only the first nr weight rows are real; the rest of the tile is skipped when storing.
template <int MR>
void MicroKernel(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t cols, float* y,
                 int64_t ldy, int nr) {
  VecF acc[MR][kNr];
  for (auto& row : acc) {
    for (VecF& a : row) a = vec::Zero();
  }
  const int64_t num_blocks = cols / kBlock;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t k = b * kBlock;
    VecF xv[MR][kVecsPerBlock];
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kVecsPerBlock; ++v) {
        xv[i][v] = vec::Load(x + i * ldx + k + v * kLanes);
        vec::KeepInRegister(xv[i][v]);
      }
    }
    for (int r = 0; r < kNr; ++r) {
      VecF wv[kVecsPerBlock];
      for (int v = 0; v < kVecsPerBlock; ++v) {
        wv[v] = vec::Load(w + r * ldw + k + v * kLanes);
        vec::KeepInRegister(wv[v]);
      }
      for (int i = 0; i < MR; ++i) {
        VecF partial = vec::Mul(wv[0], xv[i][0]);
        for (int v = 1; v < kVecsPerBlock; ++v) partial = vec::Fmadd(wv[v], xv[i][v], partial);
        acc[i][r] = vec::Add(acc[i][r], partial);
      }
    }
  }
  const int64_t k0 = num_blocks * kBlock;
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < nr; ++r) {
      y[i * ldy + r] = FinishDot(acc[i][r], w + r * ldw + k0, x + i * ldx + k0, cols - k0);
    }
  }
}

using MicroKernelFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*,
                               int64_t, int);

template <int... Is>
constexpr auto MakeMicroKernelTable(std::integer_sequence<int, Is...>) {
  return std::array<MicroKernelFn, sizeof...(Is)>{MicroKernel<Is + 1>...};
}
constexpr auto kMicroKernels = MakeMicroKernelTable(std::make_integer_sequence<int, kMr>());

struct PrefillShape {
  int64_t rows, cols, m;
  const float* x;
  float* y;
};

// One task: weight rows [r0, r1) against input rows [i0, i1).
// dequant_rows(r, n, dst, ld) writes weight rows r .. r + n - 1 as floats, row i at dst + i * ld.
template <typename DequantRowsFn>
void PrefillTask(const DequantRowsFn& dequant_rows, const PrefillShape& s, int64_t r0, int64_t r1,
                 int64_t i0, int64_t i1) {
  const int64_t group_rows = GroupRows(s.cols);
  const int64_t ldw = s.cols;
  float* packed = Scratch(kPackedSlot, group_rows * ldw);
  for (int64_t g0 = r0; g0 < r1; g0 += group_rows) {
    const int64_t g1 = std::min(r1, g0 + group_rows);
    dequant_rows(g0, g1 - g0, packed, ldw);
    // Pad to whole kNr tiles with zero rows; their outputs are never stored.
    const int64_t padded = (g1 - g0 + kNr - 1) / kNr * kNr;
    std::fill(packed + (g1 - g0) * ldw, packed + padded * ldw, 0.0f);
    for (int64_t i = i0; i < i1; i += kMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMr, i1 - i));
      const MicroKernelFn kernel = kMicroKernels[mr - 1];
      for (int64_t r = g0; r < g1; r += kNr) {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, g1 - r));
        kernel(s.x + i * s.cols, s.cols, packed + (r - g0) * ldw, ldw, s.cols,
               s.y + i * s.rows + r, s.rows, nr);
      }
    }
  }
}

// Splits the work into one task per thread: over weight rows first (each row is then dequantised
// once), and over input rows too when there are too few weight tiles to go round.
template <typename DequantRowsFn>
void Prefill(const DequantRowsFn& dequant_rows, const PrefillShape& s, ThreadPool& pool) {
  const int64_t row_tiles = (s.rows + kNr - 1) / kNr;
  const int64_t threads = pool.num_threads();
  const int64_t row_splits = std::min(row_tiles, threads);
  const int64_t m_tiles = (s.m + kMr - 1) / kMr;
  const int64_t m_splits = std::clamp<int64_t>(threads / row_splits, 1, m_tiles);
  pool.ParallelFor(row_splits * m_splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t rs = t / m_splits, ms = t % m_splits;
      const int64_t r0 = std::min(s.rows, row_tiles * rs / row_splits * kNr);
      const int64_t r1 = std::min(s.rows, row_tiles * (rs + 1) / row_splits * kNr);
      const int64_t i0 = m_tiles * ms / m_splits * kMr;
      const int64_t i1 = std::min(s.m, m_tiles * (ms + 1) / m_splits * kMr);
      PrefillTask(dequant_rows, s, r0, r1, i0, i1);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Dispatch.

// Rows per decode chunk: enough that a chunk is worth a thread hand-off.
constexpr int64_t kDecodeGrain = 16;

template <typename Format>
void MatMulFast(const WeightMatrix& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  if (m < kPrefillMinM) {
    pool.ParallelFor(w.rows, kDecodeGrain, [&](int64_t r0, int64_t r1) {
      int64_t ldx;
      const float* xa = AlignedInput(x, m, w.cols, &ldx);
      GemvRows<Format>(w.data, w.row_bytes, w.cols, w.rows, xa, ldx, m, y, r0, r1);
    });
    return;
  }
  auto dequant_rows = [&w](int64_t r, int64_t n, float* dst, int64_t ld) {
    for (int64_t i = 0; i < n; ++i) {
      DequantRow<Format>(w.data + (r + i) * w.row_bytes, w.cols, dst + i * ld);
    }
  };
  Prefill(dequant_rows, PrefillShape{w.rows, w.cols, m, x, y}, pool);
}

// Any other type DequantizeRow supports: weights go through float rows, then the F32 kernels.
absl::Status MatMulGeneric(const WeightMatrix& w, const float* x, int64_t m, float* y,
                           ThreadPool& pool) {
  std::mutex error_mu;
  absl::Status error;
  std::atomic<bool> failed{false};
  auto record = [&](absl::Status s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(error_mu);
    if (error.ok()) error = std::move(s);
    failed.store(true, std::memory_order_relaxed);
  };
  auto dequantize = [&](int64_t r, float* dst) {
    if (failed.load(std::memory_order_relaxed)) return;
    record(DequantizeRow(w.type, w.data + r * w.row_bytes, w.cols, dst));
  };
  if (m < kPrefillMinM) {
    pool.ParallelFor(w.rows, kDecodeGrain, [&](int64_t r0, int64_t r1) {
      int64_t ldx;
      const float* xa = AlignedInput(x, m, w.cols, &ldx);
      float* row = Scratch(kWeightRowSlot, w.cols);
      for (int64_t r = r0; r < r1; ++r) {
        dequantize(r, row);
        GemvRows<F32Format>(reinterpret_cast<const uint8_t*>(row), 0, w.cols, w.rows, xa, ldx, m,
                            y + r, 0, 1);
      }
    });
    return error;
  }
  auto dequant_rows = [&](int64_t r, int64_t n, float* dst, int64_t ld) {
    for (int64_t i = 0; i < n; ++i) dequantize(r + i, dst + i * ld);
  };
  Prefill(dequant_rows, PrefillShape{w.rows, w.cols, m, x, y}, pool);
  return error;
}

std::string TypeName(GgmlType type) {
  const GgmlTypeTraits traits = TraitsOf(type);
  if (traits.known && !traits.name.empty()) return std::string(traits.name);
  return absl::StrCat("type id ", static_cast<uint32_t>(type));
}

}  // namespace

absl::Status ValidateWeightMatrix(const WeightMatrix& w) {
  const GgmlTypeTraits traits = TraitsOf(w.type);
  if (!traits.known || !CanDequantize(w.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: unsupported weight type ", TypeName(w.type)));
  }
  if (w.rows < 0 || w.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: negative weight shape ", w.rows, "x", w.cols));
  }
  if (w.cols % traits.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: ", TypeName(w.type), " row of ",
                                                   w.cols, " elements is not whole blocks of ",
                                                   traits.block_elements));
  }
  const int64_t need = w.cols / traits.block_elements * traits.block_bytes;
  if (w.row_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: row_bytes ", w.row_bytes, " < ", need,
                                                   " for ", w.cols, " ", TypeName(w.type)));
  }
  if (w.data == nullptr && w.rows > 0 && w.cols > 0) {
    return absl::InvalidArgumentError("matmul: weight data is null");
  }
  return absl::OkStatus();
}

absl::Status MatMul(const WeightMatrix& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  WINNOW_RETURN_IF_ERROR(ValidateWeightMatrix(w));
  if (m < 0) return absl::InvalidArgumentError(absl::StrCat("matmul: negative m ", m));
  if (m == 0 || w.rows == 0) return absl::OkStatus();
  if (w.cols == 0) {
    std::fill(y, y + m * w.rows, 0.0f);
    return absl::OkStatus();
  }
  switch (w.type) {
    case GgmlType::kF32:
      MatMulFast<F32Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kF16:
      MatMulFast<F16Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kBF16:
      MatMulFast<BF16Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ8_0:
      MatMulFast<Q8_0Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ4_0:
      MatMulFast<Q4_0Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ4_1:
      MatMulFast<Q4_1Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ5_0:
      MatMulFast<Q5_0Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ5_1:
      MatMulFast<Q5_1Format>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ4_K:
      MatMulFast<Q4_KFormat>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ5_K:
      MatMulFast<Q5_KFormat>(w, x, m, y, pool);
      return absl::OkStatus();
    case GgmlType::kQ6_K:
      MatMulFast<Q6_KFormat>(w, x, m, y, pool);
      return absl::OkStatus();
    default:
      return MatMulGeneric(w, x, m, y, pool);
  }
}

absl::Status GetRow(const WeightMatrix& w, int64_t row, float* dst) {
  WINNOW_RETURN_IF_ERROR(ValidateWeightMatrix(w));
  if (row < 0 || row >= w.rows) {
    return absl::OutOfRangeError(
        absl::StrCat("GetRow: row ", row, " outside a matrix of ", w.rows, " rows"));
  }
  return DequantizeRow(w.type, w.data + row * w.row_bytes, w.cols, dst);
}

}  // namespace winnow::kernels
