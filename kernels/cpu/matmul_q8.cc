// Integer weight matmul kernels (see matmul_q8.h).
//
// Arithmetic. Every supported weight format is read as 32-element blocks of small integer
// quants w_k and three floats: value_k = scale_h * (w_k - bias) + offset, h being the 16-element
// half that holds k (the two scales differ only in Q6_K, whose scales cover 16 elements). Quants
// are kept unsigned, the bias taking out Q4_0's 8, Q5_0's 16 and Q6_K's 32, except Q8_0's,
// which are signed and use the sign trick (|w| times a with w's sign). One output (weight row r,
// activation row i, activation scale d, quants a) then sums, block after block:
//
//   isum = Σ_k w_k a_k - bias * Σ_k a_k               exact integers (k over the block, or
//   acc  = fma(float(isum), scale * d, acc)            over each half in turn for Q6_K)
//   acc  = fma(offset, d * Σ_k a_k, acc)               formats with an offset only
//
// Integer sums are exact however they are grouped, so every kernel below produces the same bits
// for an output: the decode kernel (vector lanes = weight rows), the prefill kernel (lanes =
// activation rows) and the portable code. A row's result therefore never depends on m, the
// path m selects, the thread count or the build's ISA.
//
// Byte products: vpmaddubsw multiplies unsigned by signed bytes into int16 pair sums; several of
// those are added as int16 before vpmaddwd widens them (kGroupsPerMadd, chosen so that no int16
// can overflow: |a| <= 127, so 4-bit quants allow 8 groups, 5-bit 4, 6-bit 2, Q8_0 one).

#include "kernels/cpu/matmul_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels {
namespace {

constexpr int kBlock = Q8Activations::kBlock;
// Vector lanes: 8 weight rows (decode) or the 8 activation rows of a tile (prefill).
constexpr int kTile = Q8Activations::kTileRows;

// value_k = (k < 16 ? scale_lo : scale_hi) * (q_k - bias) + (k < 16 ? offset : offset_hi), where
// only Q2_K has a second offset (kTwoOffsets); the others leave offset_hi 0.
struct BlockParams {
  float scale_lo;
  float scale_hi;
  float offset;
  float offset_hi = 0.0f;
};

inline float Half(const uint8_t* p) { return vec::Fp16ToFloat(vec::LoadU16(p)); }

inline int FifthBit(const uint8_t* qh, int k) {
  return static_cast<int>(((vec::LoadU32(qh) >> k) & 1u) << 4);
}

#if defined(__AVX2__) && defined(__FMA__)
#define WINNOW_Q8_AVX2 1
// The 32 nibbles of 16 packed bytes in element order.
inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
  return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

// Byte k = 16 where bit k of the 32 bits at qh is set, else 0.
inline __m256i FifthBits(const uint8_t* qh) {
  // Byte k takes byte k / 8 of the bits and tests its bit k % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(vec::LoadU32(qh))),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// (byte >> shift) & mask for 32 bytes (16-bit shifts; the mask drops the bits that crossed).
inline __m256i ShiftMask(const uint8_t* p, int shift, int mask) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}
#endif

// ---------------------------------------------------------------------------------------------
// Weight formats. Each gives block `sub` of a stored block (K-quants hold 8 sub-blocks of 32):
// Quant(p, sub, k) one element's stored quant, Params(p, sub) the scales and offset, and with
// AVX2 Quants(p, sub) all 32 quants at once.

// Format traits shared by the 32-element formats.
struct Plain {
  static constexpr int kSubBlocks = 1;
  static constexpr bool kSigned = false, kOffset = false, kTwoScales = false, kTwoOffsets = false;
  static constexpr int kBias = 0;
};

// Q8_0: fp16 d, 32 int8 q; value = d * q.
struct Q8_0 : Plain {
  static constexpr bool kSigned = true;
  static constexpr int kGroupsPerMadd = 1;
  static constexpr int64_t kBlockBytes = 34;
  static int Quant(const uint8_t* p, int, int k) { return static_cast<int8_t>(p[2 + k]); }
  static BlockParams Params(const uint8_t* p, int) { return {Half(p), Half(p), 0.0f}; }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  }
#endif
};

// Q4_0: fp16 d, 16 bytes of nibbles; value = d * (n - 8).
struct Q4_0 : Plain {
  static constexpr int kBias = 8;
  static constexpr int kGroupsPerMadd = 8;
  static constexpr int64_t kBlockBytes = 18;
  static int Quant(const uint8_t* p, int, int k) { return Nibble(p + 2, k); }
  static BlockParams Params(const uint8_t* p, int) { return {Half(p), Half(p), 0.0f}; }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int) { return Nibbles(p + 2); }
#endif
};

// Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; value = d * n + m.
struct Q4_1 : Plain {
  static constexpr bool kOffset = true;
  static constexpr int kGroupsPerMadd = 8;
  static constexpr int64_t kBlockBytes = 20;
  static int Quant(const uint8_t* p, int, int k) { return Nibble(p + 4, k); }
  static BlockParams Params(const uint8_t* p, int) { return {Half(p), Half(p), Half(p + 2)}; }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int) { return Nibbles(p + 4); }
#endif
};

// Q5_0: fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles; value = d * (q - 16).
struct Q5_0 : Plain {
  static constexpr int kBias = 16;
  static constexpr int kGroupsPerMadd = 4;
  static constexpr int64_t kBlockBytes = 22;
  static int Quant(const uint8_t* p, int, int k) { return Nibble(p + 6, k) | FifthBit(p + 2, k); }
  static BlockParams Params(const uint8_t* p, int) { return {Half(p), Half(p), 0.0f}; }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int) {
    return _mm256_or_si256(Nibbles(p + 6), FifthBits(p + 2));
  }
#endif
};

// Q5_1: fp16 d, fp16 m, 4 bytes of fifth bits, 16 bytes of nibbles; value = d * q + m.
struct Q5_1 : Plain {
  static constexpr bool kOffset = true;
  static constexpr int kGroupsPerMadd = 4;
  static constexpr int64_t kBlockBytes = 24;
  static int Quant(const uint8_t* p, int, int k) { return Nibble(p + 8, k) | FifthBit(p + 4, k); }
  static BlockParams Params(const uint8_t* p, int) { return {Half(p), Half(p), Half(p + 2)}; }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int) {
    return _mm256_or_si256(Nibbles(p + 8), FifthBits(p + 4));
  }
#endif
};

// Q4_K / Q5_K header: fp16 d, fp16 dmin, eight 6-bit (scale, min) pairs in 12 bytes; sub-block
// j's value = d * scale_j * q - dmin * min_j.
inline BlockParams KParams(const uint8_t* p, int sub) {
  int sc, mn;
  KScaleMin(p + 4, sub, &sc, &mn);
  const float step = Half(p) * static_cast<float>(sc);
  return {step, step, -(Half(p + 2) * static_cast<float>(mn))};
}

struct KQuant {
  static constexpr int kSubBlocks = 8;
  static constexpr bool kSigned = false, kTwoScales = false, kOffset = true, kTwoOffsets = false;
  static constexpr int kBias = 0;
};

// Q4_K: header, 128 bytes of nibbles; sub-block j is nibble j % 2 of bytes 32 * (j / 2) ...
struct Q4_K : KQuant {
  static constexpr int kGroupsPerMadd = 8;
  static constexpr int64_t kBlockBytes = 144;
  static int Quant(const uint8_t* p, int sub, int k) {
    return (p[16 + 32 * (sub / 2) + k] >> (4 * (sub % 2))) & 15;
  }
  static BlockParams Params(const uint8_t* p, int sub) { return KParams(p, sub); }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int sub) {
    return ShiftMask(p + 16 + 32 * (sub / 2), 4 * (sub % 2), 15);
  }
#endif
};

// Q5_K: header, 32 bytes of fifth bits (bit j of byte k for sub-block j), 128 bytes of nibbles.
struct Q5_K : KQuant {
  static constexpr int kGroupsPerMadd = 4;
  static constexpr int64_t kBlockBytes = 176;
  static int Quant(const uint8_t* p, int sub, int k) {
    return ((p[48 + 32 * (sub / 2) + k] >> (4 * (sub % 2))) & 15) | (((p[16 + k] >> sub) & 1) << 4);
  }
  static BlockParams Params(const uint8_t* p, int sub) { return KParams(p, sub); }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int sub) {
    const __m256i fifth = _mm256_slli_epi16(ShiftMask(p + 16, sub, 1), 4);
    return _mm256_or_si256(ShiftMask(p + 48 + 32 * (sub / 2), 4 * (sub % 2), 15), fifth);
  }
#endif
};

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, fp16 d. Sub-block
// j = 4h + r: q_k = nibble r / 2 of ql[64h + 32 (r % 2) + k] | bits 2r of qh[32h + k] << 4;
// value = d * scale[8h + 2r + k / 16] * (q - 32).
struct Q6_K {
  static constexpr int kSubBlocks = 8;
  static constexpr bool kSigned = false, kTwoScales = true, kOffset = false, kTwoOffsets = false;
  static constexpr int kBias = 32;
  static constexpr int kGroupsPerMadd = 2;
  static constexpr int64_t kBlockBytes = 210;
  static const uint8_t* Low(const uint8_t* p, int sub) {
    return p + 64 * (sub / 4) + 32 * (sub % 4 % 2);
  }
  static const uint8_t* High(const uint8_t* p, int sub) { return p + 128 + 32 * (sub / 4); }
  static int Quant(const uint8_t* p, int sub, int k) {
    const int r = sub % 4;
    return ((Low(p, sub)[k] >> (4 * (r / 2))) & 15) | (((High(p, sub)[k] >> (2 * r)) & 3) << 4);
  }
  static BlockParams Params(const uint8_t* p, int sub) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192) + 8 * (sub / 4) + 2 * (sub % 4);
    const float d = Half(p + 208);
    return {d * static_cast<float>(scales[0]), d * static_cast<float>(scales[1]), 0.0f};
  }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int sub) {
    const int r = sub % 4;
    const __m256i high = _mm256_slli_epi16(ShiftMask(High(p, sub), 2 * r, 3), 4);
    return _mm256_or_si256(ShiftMask(Low(p, sub), 4 * (r / 2), 15), high);
  }
#endif
};

// Q2_K: 16 bytes of (4-bit scale, 4-bit min) per 16 elements, 64 bytes of 2-bit quants, fp16 d,
// fp16 dmin. Sub-block j = 4h + p is bit plane p of qs[32h ..]; its halves take scale bytes
// 8h + 2p and 8h + 2p + 1; value = d * scale * q - dmin * min.
struct Q2_K {
  static constexpr int kSubBlocks = 8;
  static constexpr bool kSigned = false, kTwoScales = true, kOffset = true, kTwoOffsets = true;
  static constexpr int kBias = 0;
  static constexpr int kGroupsPerMadd = 4;
  static constexpr int64_t kBlockBytes = 84;
  static int Quant(const uint8_t* p, int sub, int k) {
    return (p[16 + 32 * (sub / 4) + k] >> (2 * (sub % 4))) & 3;
  }
  static BlockParams Params(const uint8_t* p, int sub) {
    const uint8_t* sc = p + 8 * (sub / 4) + 2 * (sub % 4);
    const float d = Half(p + 80), dmin = Half(p + 82);
    return {d * static_cast<float>(sc[0] & 15), d * static_cast<float>(sc[1] & 15),
            -(dmin * static_cast<float>(sc[0] >> 4)), -(dmin * static_cast<float>(sc[1] >> 4))};
  }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int sub) {
    return ShiftMask(p + 16 + 32 * (sub / 4), 2 * (sub % 4), 3);
  }
#endif
};

// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit quants, 12 bytes of sixteen 6-bit scales, fp16
// d. Sub-block j = 4h + p: low bits are plane p of qs[32h ..], the third bit is bit j of
// hmask[k]; value = d * (scale - 32) * (q - 4), scales 8h + 2p and 8h + 2p + 1 for the halves.
struct Q3_K {
  static constexpr int kSubBlocks = 8;
  static constexpr bool kSigned = false, kTwoScales = true, kOffset = false, kTwoOffsets = false;
  static constexpr int kBias = 4;
  static constexpr int kGroupsPerMadd = 4;
  static constexpr int64_t kBlockBytes = 110;
  static int Quant(const uint8_t* p, int sub, int k) {
    return ((p[32 + 32 * (sub / 4) + k] >> (2 * (sub % 4))) & 3) | (((p[k] >> sub) & 1) << 2);
  }
  static float Scale(const uint8_t* p, int i) {
    return Half(p + 108) * static_cast<float>(Q3KScale(p + 96, i));
  }
  static BlockParams Params(const uint8_t* p, int sub) {
    const int i = 8 * (sub / 4) + 2 * (sub % 4);
    return {Scale(p, i), Scale(p, i + 1), 0.0f};
  }
#if WINNOW_Q8_AVX2
  static __m256i Quants(const uint8_t* p, int sub) {
    const __m256i third = _mm256_slli_epi16(ShiftMask(p, sub, 1), 2);
    return _mm256_or_si256(ShiftMask(p + 32 + 32 * (sub / 4), 2 * (sub % 4), 3), third);
  }
#endif
};

template <typename F>
inline const uint8_t* StoredBlock(const uint8_t* row, int64_t b) {
  return row + b / F::kSubBlocks * F::kBlockBytes;
}
template <typename F>
inline int SubOf(int64_t b) {
  return static_cast<int>(b % F::kSubBlocks);
}

// Activation row i, as the row-major kernels read it.
struct ActRow {
  const int8_t* q;
  const float* scale;
  const float* scaled_sum;
  const int32_t* half_sums;
};

inline ActRow RowOf(const Q8Activations& x, int64_t i) {
  const int64_t nb = x.blocks();
  return {x.q.data() + i * x.cols, x.scale.data() + i * nb, x.scaled_sum.data() + i * nb,
          x.half_sums.data() + i * nb * 2};
}

// ---------------------------------------------------------------------------------------------
// Portable kernel: the arithmetic of the header comment, one output at a time.

template <typename F>
float DotPortable(const uint8_t* row, const ActRow& a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = StoredBlock<F>(row, b);
    const int sub = SubOf<F>(b);
    const int8_t* aq = a.q + b * kBlock;
    int32_t sums[2] = {0, 0};
    for (int k = 0; k < kBlock; ++k) sums[k / 16] += F::Quant(p, sub, k) * int32_t{aq[k]};
    for (int h = 0; h < 2; ++h) sums[h] -= F::kBias * a.half_sums[2 * b + h];
    const BlockParams bp = F::Params(p, sub);
    const float d = a.scale[b];
    if constexpr (F::kTwoScales) {
      acc = std::fma(static_cast<float>(sums[0]), bp.scale_lo * d, acc);
      acc = std::fma(static_cast<float>(sums[1]), bp.scale_hi * d, acc);
    } else {
      acc = std::fma(static_cast<float>(sums[0] + sums[1]), bp.scale_lo * d, acc);
    }
    if constexpr (F::kTwoOffsets) {
      acc = std::fma(bp.offset, static_cast<float>(a.half_sums[2 * b]) * d, acc);
      acc = std::fma(bp.offset_hi, static_cast<float>(a.half_sums[2 * b + 1]) * d, acc);
    } else if constexpr (F::kOffset) {
      acc = std::fma(bp.offset, a.scaled_sum[b], acc);
    }
  }
  return acc;
}

template <typename F>
void RunPortable(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < x.m; ++i) {
        y[i * w.rows + r] = DotPortable<F>(w.data + r * w.row_bytes, RowOf(x, i), x.blocks());
      }
    }
  });
}

// Activation rows from which the prefill kernel runs (and the quantiser builds its layout).
constexpr int64_t kPrefillMinM = 8;

#if WINNOW_Q8_AVX2
// ---------------------------------------------------------------------------------------------
// Byte products. Sums of u * s over several 32-byte pairs (u unsigned, s signed), as int32
// lanes each holding 4 consecutive products. Without VNNI, products accumulate as int16 pair
// sums and are widened by Widen (callers widen every kGroupsPerMadd additions).

struct ByteProducts {
  __m256i sum = _mm256_setzero_si256();
  void Add(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    sum = _mm256_dpbusd_avx_epi32(sum, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    sum = _mm256_dpbusd_epi32(sum, u, s);
#else
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(u, s));
#endif
  }
  __m256i Widen() const {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
    return sum;
#else
    return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
#endif
  }
};

// Signed weights use |w| and the activations with w's signs: |w| * sign(a, w) = w * a.
template <typename F>
inline __m256i Unsigned(__m256i w) {
  return F::kSigned ? _mm256_sign_epi8(w, w) : w;
}
template <typename F>
inline __m256i SignedBy(__m256i a, __m256i w) {
  return F::kSigned ? _mm256_sign_epi8(a, w) : a;
}

// One block's contribution to 8 outputs, in the order of the header comment.
struct BlockTerms {
  __m256i lo, hi;             // integer sums of the halves (kTwoScales), else lo the block's
  __m256 scale_lo, scale_hi;  // weight scale times activation scale
  __m256 offset, offset_hi;   // the weights' offsets (offset_hi: kTwoOffsets)
  __m256 sum, sum_hi;         // activation scale times the quant sum: of the block, or with
                              // kTwoOffsets of its first half (sum) and second (sum_hi)
};

template <typename F>
inline __m256 AddBlock(const BlockTerms& t, __m256 acc) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t.lo), t.scale_lo, acc);
  if constexpr (F::kTwoScales) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t.hi), t.scale_hi, acc);
  if constexpr (F::kOffset) acc = _mm256_fmadd_ps(t.offset, t.sum, acc);
  if constexpr (F::kTwoOffsets) acc = _mm256_fmadd_ps(t.offset_hi, t.sum_hi, acc);
  return acc;
}

// ---------------------------------------------------------------------------------------------
// Decode kernel: lanes are 8 weight rows. Each weight block is multiplied against the activation
// block as whole 32-byte vectors, and the 8 rows' lane sums are folded into one vector.

// Block b of 8 weight rows: quants and, lane r for row r, the parameters.
struct RowTile {
  __m256i q[kTile];
  __m256 scale_lo, scale_hi, offset, offset_hi;
};

template <typename F>
inline void UnpackRowTile(const uint8_t* const* rows, int64_t b, RowTile* t) {
  alignas(32) float lo[kTile], hi[kTile], off[kTile], off_hi[kTile];
  for (int r = 0; r < kTile; ++r) {
    const uint8_t* p = StoredBlock<F>(rows[r], b);
    t->q[r] = F::Quants(p, SubOf<F>(b));
    const BlockParams bp = F::Params(p, SubOf<F>(b));
    lo[r] = bp.scale_lo;
    hi[r] = bp.scale_hi;
    off[r] = bp.offset;
    off_hi[r] = bp.offset_hi;
  }
  t->scale_lo = _mm256_load_ps(lo);
  t->scale_hi = _mm256_load_ps(hi);
  t->offset = _mm256_load_ps(off);
  t->offset_hi = _mm256_load_ps(off_hi);
}

// Lane r of *lo (*hi): the sum of lanes 0..3 (4..7) of v[r], i.e. of its first (second) 16
// elements' products.
inline void SumPerRow(const __m256i v[kTile], __m256i* lo, __m256i* hi) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  *lo = _mm256_permute2x128_si256(a, b, 0x20);
  *hi = _mm256_permute2x128_si256(a, b, 0x31);
}

template <typename F>
inline __m256 AccumulateRowTile(const RowTile& t, const ActRow& a, int64_t b, __m256 acc) {
  const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + b * kBlock));
  __m256i sums[kTile];
  for (int r = 0; r < kTile; ++r) {
    ByteProducts p;
    p.Add(Unsigned<F>(t.q[r]), SignedBy<F>(aq, t.q[r]));
    sums[r] = p.Widen();
  }
  __m256i lo, hi;
  SumPerRow(sums, &lo, &hi);
  if constexpr (F::kBias != 0) {
    lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(F::kBias * a.half_sums[2 * b]));
    hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(F::kBias * a.half_sums[2 * b + 1]));
  }
  if constexpr (!F::kTwoScales) lo = _mm256_add_epi32(lo, hi);
  const float scale = a.scale[b];
  const __m256 d = _mm256_set1_ps(scale);
  BlockTerms terms{lo, hi, _mm256_mul_ps(t.scale_lo, d), _mm256_mul_ps(t.scale_hi, d), t.offset,
                   t.offset_hi, _mm256_set1_ps(a.scaled_sum[b]), _mm256_setzero_ps()};
  if constexpr (F::kTwoOffsets) {
    terms.sum = _mm256_set1_ps(static_cast<float>(a.half_sums[2 * b]) * scale);
    terms.sum_hi = _mm256_set1_ps(static_cast<float>(a.half_sums[2 * b + 1]) * scale);
  }
  return AddBlock<F>(terms, acc);
}

// y[i0 + j][r0 .. r0 + 7] for j < M; rows past the matrix repeat its last row and are not stored.
template <typename F, int M>
void DecodeTile(const WeightMatrix& w, const Q8Activations& x, int64_t i0, int64_t r0, float* y) {
  const uint8_t* rows[kTile];
  for (int r = 0; r < kTile; ++r) {
    rows[r] = w.data + std::min(r0 + r, w.rows - 1) * w.row_bytes;
  }
  __m256 acc[M];
  ActRow a[M];
  for (int j = 0; j < M; ++j) {
    acc[j] = _mm256_setzero_ps();
    a[j] = RowOf(x, i0 + j);
  }
  // The 8 rows are read block by block, 8 interleaved streams that the hardware prefetcher
  // follows poorly; the next tile (contiguous) is prefetched in step with this one.
  const char* next = reinterpret_cast<const char*>(w.data + (r0 + kTile) * w.row_bytes);
  const int64_t next_bytes =
      std::max<int64_t>(0, std::min<int64_t>(kTile, w.rows - r0 - kTile)) * w.row_bytes;
  const int64_t nb = x.blocks();
  const int64_t prefetch_step = (next_bytes / nb + 63) / 64 * 64;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t off = b * prefetch_step; off < std::min(next_bytes, (b + 1) * prefetch_step);
         off += 64) {
      _mm_prefetch(next + off, _MM_HINT_T0);
    }
    RowTile t;
    UnpackRowTile<F>(rows, b, &t);
    for (int j = 0; j < M; ++j) acc[j] = AccumulateRowTile<F>(t, a[j], b, acc[j]);
  }
  const int64_t n = std::min<int64_t>(kTile, w.rows - r0);
  for (int j = 0; j < M; ++j) {
    alignas(32) float out[kTile];
    _mm256_store_ps(out, acc[j]);
    std::memcpy(y + (i0 + j) * w.rows + r0, out, n * sizeof(float));
  }
}

using DecodeTileFn = void (*)(const WeightMatrix&, const Q8Activations&, int64_t, int64_t, float*);

template <typename F>
DecodeTileFn DecodeTileFor(int64_t m) {
  static constexpr DecodeTileFn kTable[kPrefillMinM] = {
      nullptr,           DecodeTile<F, 1>, DecodeTile<F, 2>, DecodeTile<F, 3>,
      DecodeTile<F, 4>, DecodeTile<F, 5>, DecodeTile<F, 6>, DecodeTile<F, 7>};
  return kTable[m];
}

template <typename F>
void Decode(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  const DecodeTileFn tile = DecodeTileFor<F>(x.m);
  const int64_t tiles = (w.rows + kTile - 1) / kTile;
  pool.ParallelFor(tiles, 2, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) tile(w, x, 0, t * kTile, y);
  });
}

// ---------------------------------------------------------------------------------------------
// Prefill kernel: lanes are 8 activation rows (Q8Activations' tiled layout). A group of weight
// rows is unpacked once into a buffer that stays in L2; then for each block, 4 weight bytes at a
// time are broadcast and multiplied against the same 4 elements of 8 activation rows.

// Weight rows unpacked: per row, nb blocks of 32 stored quants, then nb (scale_lo, scale_hi,
// offset, offset_hi).
constexpr int kParams = 4;
struct PackedRows {
  int64_t nb = 0;
  int64_t stride = 0;  // bytes per row
  int8_t* data = nullptr;

  int8_t* quants(int64_t r) const { return data + r * stride; }
  float* params(int64_t r) const { return reinterpret_cast<float*>(quants(r) + nb * kBlock); }
};

template <typename F>
void PackRow(const uint8_t* row, const PackedRows& p, int64_t r) {
  float* params = p.params(r);
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* block = StoredBlock<F>(row, b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.quants(r) + b * kBlock),
                        F::Quants(block, SubOf<F>(b)));
    const BlockParams bp = F::Params(block, SubOf<F>(b));
    params[kParams * b] = bp.scale_lo;
    params[kParams * b + 1] = bp.scale_hi;
    params[kParams * b + 2] = bp.offset;
    params[kParams * b + 3] = bp.offset_hi;
  }
}

// Per activation tile and block: what every weight row's term needs.
struct TileBlock {
  const int8_t* q;  // 8 groups of 32 bytes
  __m256 scale;
  __m256 sum, sum_hi;        // as BlockTerms' sum and sum_hi
  __m256i bias_lo, bias_hi;  // kBias * half sums (bias_lo: the whole block's unless kTwoScales)
};

template <typename F>
inline TileBlock LoadTileBlock(const Q8Activations& x, int64_t tile, int64_t b) {
  const int64_t at = tile * x.blocks() + b;
  TileBlock t;
  t.q = x.tiled_q.data() + at * kTile * kBlock;
  t.scale = _mm256_loadu_ps(x.tiled_scale.data() + at * kTile);
  t.sum = F::kOffset ? _mm256_loadu_ps(x.tiled_scaled_sum.data() + at * kTile)
                     : _mm256_setzero_ps();
  t.sum_hi = _mm256_setzero_ps();
  t.bias_lo = t.bias_hi = _mm256_setzero_si256();
  const int32_t* hs = x.tiled_half_sums.data() + at * 2 * kTile;
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + kTile));
  if constexpr (F::kTwoOffsets) {
    t.sum = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), t.scale);
    t.sum_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), t.scale);
  }
  if constexpr (F::kBias != 0) {
    const __m256i bias = _mm256_set1_epi32(F::kBias);
    t.bias_lo = _mm256_mullo_epi32(F::kTwoScales ? lo : _mm256_add_epi32(lo, hi), bias);
    t.bias_hi = _mm256_mullo_epi32(hi, bias);
  }
  return t;
}

// Integer sums of groups [g0, g1) of one weight block against MT activation tiles.
template <typename F, int MT>
inline void GroupSums(const int8_t* wq, const TileBlock* tb, int g0, int g1, __m256i* out) {
  for (int t = 0; t < MT; ++t) out[t] = _mm256_setzero_si256();
  for (int c = g0; c < g1; c += F::kGroupsPerMadd) {
    ByteProducts p[MT];
    for (int g = c; g < c + F::kGroupsPerMadd; ++g) {
      const __m256i w = _mm256_set1_epi32(static_cast<int>(vec::LoadU32(wq + 4 * g)));
      const __m256i u = Unsigned<F>(w);
      for (int t = 0; t < MT; ++t) {
        const __m256i a =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tb[t].q + g * kBlock));
        p[t].Add(u, SignedBy<F>(a, w));
      }
    }
    for (int t = 0; t < MT; ++t) out[t] = _mm256_add_epi32(out[t], p[t].Widen());
  }
}

constexpr int kPrefillRows = 4;   // weight rows per micro-kernel call (NR)
constexpr int kPrefillTiles = 2;  // activation tiles per micro-kernel call (MT)

// Outputs for packed weight rows r0 .. r0 + kPrefillRows - 1 (the first nr stored) and
// activation tiles tile0 .. tile0 + MT - 1.
template <typename F, int MT>
void PrefillKernel(const Q8Activations& x, int64_t tile0, const PackedRows& p, int64_t r0,
                   int64_t nr, float* y, int64_t ldy, int64_t first_row) {
  __m256 acc[kPrefillRows][MT];
  for (auto& row : acc) {
    for (__m256& v : row) v = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < p.nb; ++b) {
    TileBlock tb[MT];
    for (int t = 0; t < MT; ++t) tb[t] = LoadTileBlock<F>(x, tile0 + t, b);
    for (int r = 0; r < kPrefillRows; ++r) {
      const int8_t* wq = p.quants(r0 + r) + b * kBlock;
      const float* params = p.params(r0 + r) + kParams * b;
      __m256i lo[MT], hi[MT] = {};
      if constexpr (F::kTwoScales) {
        GroupSums<F, MT>(wq, tb, 0, 4, lo);
        GroupSums<F, MT>(wq, tb, 4, 8, hi);
      } else {
        GroupSums<F, MT>(wq, tb, 0, 8, lo);
      }
      const __m256 scale_lo = _mm256_set1_ps(params[0]);
      const __m256 scale_hi = _mm256_set1_ps(params[1]);
      const __m256 offset = _mm256_set1_ps(params[2]);
      const __m256 offset_hi = _mm256_set1_ps(params[3]);
      for (int t = 0; t < MT; ++t) {
        if constexpr (F::kBias != 0) {
          lo[t] = _mm256_sub_epi32(lo[t], tb[t].bias_lo);
          if constexpr (F::kTwoScales) hi[t] = _mm256_sub_epi32(hi[t], tb[t].bias_hi);
        }
        const BlockTerms terms{lo[t],     hi[t],     _mm256_mul_ps(scale_lo, tb[t].scale),
                               _mm256_mul_ps(scale_hi, tb[t].scale),
                               offset,    offset_hi, tb[t].sum,
                               tb[t].sum_hi};
        acc[r][t] = AddBlock<F>(terms, acc[r][t]);
      }
    }
  }
  for (int t = 0; t < MT; ++t) {
    for (int r = 0; r < nr; ++r) {
      alignas(32) float out[kTile];
      _mm256_store_ps(out, acc[r][t]);
      for (int l = 0; l < kTile; ++l) {
        const int64_t i = (tile0 + t) * kTile + l;
        if (i < x.m) y[i * ldy + first_row + r] = out[l];
      }
    }
  }
}

template <typename F>
using PrefillKernelFn = void (*)(const Q8Activations&, int64_t, const PackedRows&, int64_t,
                                 int64_t, float*, int64_t, int64_t);

constexpr int64_t kGroupBytes = 128 << 10;

// Weight rows [r0, r1) against activation tiles [t0, t1).
template <typename F>
void PrefillTask(const WeightMatrix& w, const Q8Activations& x, float* y, int64_t r0, int64_t r1,
                 int64_t t0, int64_t t1) {
  static_assert(kPrefillTiles == 2);
  constexpr PrefillKernelFn<F> kKernels[kPrefillTiles] = {PrefillKernel<F, 1>,
                                                          PrefillKernel<F, 2>};
  thread_local std::vector<int8_t> storage;
  PackedRows p;
  p.nb = x.blocks();
  p.stride = (p.nb * (kBlock + kParams * int64_t{sizeof(float)}) + 63) / 64 * 64;
  const int64_t group =
      std::max<int64_t>(kPrefillRows, kGroupBytes / p.stride / kPrefillRows * kPrefillRows);
  storage.resize(static_cast<size_t>(group * p.stride));
  p.data = storage.data();
  for (int64_t g0 = r0; g0 < r1; g0 += group) {
    const int64_t g1 = std::min(r1, g0 + group);
    for (int64_t r = g0; r < g1; ++r) PackRow<F>(w.data + r * w.row_bytes, p, r - g0);
    // A last partial set of rows repeats the last real one; those outputs are never stored.
    const int64_t padded = (g1 - g0 + kPrefillRows - 1) / kPrefillRows * kPrefillRows;
    for (int64_t r = g1 - g0; r < padded; ++r) {
      std::memcpy(p.quants(r), p.quants(g1 - g0 - 1), static_cast<size_t>(p.stride));
    }
    for (int64_t t = t0; t < t1; t += kPrefillTiles) {
      const PrefillKernelFn<F> kernel = kKernels[std::min<int64_t>(kPrefillTiles, t1 - t) - 1];
      for (int64_t r = g0; r < g1; r += kPrefillRows) {
        kernel(x, t, p, r - g0, std::min<int64_t>(kPrefillRows, g1 - r), y, w.rows, r);
      }
    }
  }
}

template <typename F>
void Prefill(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  const int64_t row_sets = (w.rows + kPrefillRows - 1) / kPrefillRows;
  const int64_t threads = pool.num_threads();
  const int64_t row_splits = std::min(row_sets, threads);
  const int64_t tiles = x.tiles();
  const int64_t tile_splits = std::clamp<int64_t>(threads / row_splits, 1, tiles);
  pool.ParallelFor(row_splits * tile_splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t rs = task / tile_splits, ts = task % tile_splits;
      const int64_t r0 = std::min(w.rows, row_sets * rs / row_splits * kPrefillRows);
      const int64_t r1 = std::min(w.rows, row_sets * (rs + 1) / row_splits * kPrefillRows);
      PrefillTask<F>(w, x, y, r0, r1, tiles * ts / tile_splits, tiles * (ts + 1) / tile_splits);
    }
  });
}

template <typename F>
void RunNative(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  if (x.tiled()) {
    Prefill<F>(w, x, y, pool);
  } else {
    Decode<F>(w, x, y, pool);
  }
}
#else
template <typename F>
void RunNative(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  RunPortable<F>(w, x, y, pool);
}
#endif  // WINNOW_Q8_AVX2

// Calls fn.template operator()<F>() with the format of `type`; false when it has no integer
// kernel. The one list of supported types.
template <typename Fn>
bool WithFormat(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::kQ8_0: fn.template operator()<Q8_0>(); return true;
    case GgmlType::kQ4_0: fn.template operator()<Q4_0>(); return true;
    case GgmlType::kQ4_1: fn.template operator()<Q4_1>(); return true;
    case GgmlType::kQ5_0: fn.template operator()<Q5_0>(); return true;
    case GgmlType::kQ5_1: fn.template operator()<Q5_1>(); return true;
    case GgmlType::kQ2_K: fn.template operator()<Q2_K>(); return true;
    case GgmlType::kQ3_K: fn.template operator()<Q3_K>(); return true;
    case GgmlType::kQ4_K: fn.template operator()<Q4_K>(); return true;
    case GgmlType::kQ5_K: fn.template operator()<Q5_K>(); return true;
    case GgmlType::kQ6_K: fn.template operator()<Q6_K>(); return true;
    default: return false;
  }
}

absl::Status Validate(const WeightMatrix& w, const Q8Activations& x) {
  if (!HasInt8Kernel(w.type)) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_q8: no integer kernel for weight type ",
                                                   std::string(TraitsOf(w.type).name)));
  }
  if (x.cols != w.cols) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_q8: activations have ", x.cols,
                                                   " columns, the weights ", w.cols));
  }
  return ValidateWeightMatrix(w);
}

template <bool kPortable>
absl::Status Dispatch(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  WINNOW_RETURN_IF_ERROR(Validate(w, x));
  if (x.m == 0 || w.rows == 0) return absl::OkStatus();
  if (w.cols == 0) {
    std::fill(y, y + x.m * w.rows, 0.0f);
    return absl::OkStatus();
  }
  auto run = [&]<typename F>() {
    if constexpr (kPortable) {
      RunPortable<F>(w, x, y, pool);
    } else {
      RunNative<F>(w, x, y, pool);
    }
  };
  WithFormat(w.type, run);  // Validate refused types without one
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Activation quantisation.

// One 32-element block: scale = max|x| / 127, q = round-to-nearest-even(x * (127 / max|x|)).
// The SIMD and scalar versions compute the same quotients and products, so they agree bit for
// bit; the sums are exact integers.
inline void QuantizeBlock(const float* x, int8_t* q, float* scale, float* scaled_sum,
                          int32_t* half_sums) {
#if WINNOW_Q8_AVX2
  __m256 v[4];
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float max_abs = _mm_cvtss_f32(m4);
  const float inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
  __m256i i32[4];
  for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
  // Packing interleaves the 128-bit halves; the permute puts the elements back in order.
  const __m256i i16 = _mm256_packs_epi32(i32[0], i32[1]);
  const __m256i i16b = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16, i16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), i8);
  const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]),
                                        _mm256_add_epi32(i32[2], i32[3]));
  // i32[0..1] hold elements 0..15; their lanes summed give the first half.
  const __m256i first = _mm256_add_epi32(i32[0], i32[1]);
  const __m256i second = _mm256_sub_epi32(sums, first);
  auto reduce = [](__m256i s) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(r);
  };
  half_sums[0] = reduce(first);
  half_sums[1] = reduce(second);
#else
  float max_abs = 0.0f;
  for (int k = 0; k < kBlock; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
  const float inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
  half_sums[0] = half_sums[1] = 0;
  for (int k = 0; k < kBlock; ++k) {
    q[k] = static_cast<int8_t>(std::nearbyint(x[k] * inv));
    half_sums[k / 16] += q[k];
  }
#endif
  *scale = max_abs / 127.0f;
  *scaled_sum = *scale * static_cast<float>(half_sums[0] + half_sums[1]);
}

// Copies rows of x into the tiled layout (see Q8Activations), zero rows padding the last tile.
[[maybe_unused]] void BuildTiles(Q8Activations* x, ThreadPool& pool) {
  const int64_t nb = x->blocks(), tiles = x->tiles();
  x->tiled_q.assign(static_cast<size_t>(tiles * nb * kTile * kBlock), 0);
  x->tiled_scale.assign(static_cast<size_t>(tiles * nb * kTile), 0.0f);
  x->tiled_scaled_sum.assign(static_cast<size_t>(tiles * nb * kTile), 0.0f);
  x->tiled_half_sums.assign(static_cast<size_t>(tiles * nb * 2 * kTile), 0);
  pool.ParallelFor(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t at = t * nb + b;
        int8_t* dst = x->tiled_q.data() + at * kTile * kBlock;
        for (int l = 0; l < kTile && t * kTile + l < x->m; ++l) {
          const int64_t i = t * kTile + l;
          const int8_t* src = x->q.data() + i * x->cols + b * kBlock;
          for (int g = 0; g < kBlock / 4; ++g) {
            std::memcpy(dst + g * kBlock + 4 * l, src + 4 * g, 4);
          }
          x->tiled_scale[at * kTile + l] = x->scale[i * nb + b];
          x->tiled_scaled_sum[at * kTile + l] = x->scaled_sum[i * nb + b];
          x->tiled_half_sums[at * 2 * kTile + l] = x->half_sums[2 * (i * nb + b)];
          x->tiled_half_sums[at * 2 * kTile + kTile + l] = x->half_sums[2 * (i * nb + b) + 1];
        }
      }
    }
  });
}

}  // namespace

bool HasInt8Kernel(GgmlType type) {
  return WithFormat(type, []<typename F>() {});
}

absl::Status QuantizeActivations(const float* x, int64_t m, int64_t cols, Q8Activations* out,
                                 ThreadPool& pool) {
  if (m < 0 || cols < 0 || cols % kBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize activations: ", m, "x", cols, " is not rows of whole 32-element blocks"));
  }
  out->m = m;
  out->cols = cols;
  const int64_t nb = cols / kBlock;
  out->q.resize(static_cast<size_t>(m * cols));
  out->scale.resize(static_cast<size_t>(m * nb));
  out->scaled_sum.resize(static_cast<size_t>(m * nb));
  out->half_sums.resize(static_cast<size_t>(m * nb * 2));
  pool.ParallelFor(m * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      QuantizeBlock(x + t * kBlock, out->q.data() + t * kBlock, out->scale.data() + t,
                    out->scaled_sum.data() + t, out->half_sums.data() + 2 * t);
    }
  });
  out->tiled_q.clear();
#if WINNOW_Q8_AVX2
  if (m >= kPrefillMinM) BuildTiles(out, pool);
#endif
  return absl::OkStatus();
}

absl::Status MatMulQ8(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool) {
  return Dispatch<false>(w, x, y, pool);
}

namespace internal {
absl::Status MatMulQ8Portable(const WeightMatrix& w, const Q8Activations& x, float* y,
                              ThreadPool& pool) {
  return Dispatch<true>(w, x, y, pool);
}
}  // namespace internal

}  // namespace winnow::kernels
