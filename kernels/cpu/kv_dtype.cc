#include "kernels/cpu/kv_dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/vec.h"

namespace winnow::kernels {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// float32 -> IEEE binary16, round to nearest even; overflow gives inf, NaN stays NaN.
uint16_t FloatToFp16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  // The bit manipulation of ggml's ggml_compute_fp32_to_fp16 (and FP16's fp16_ieee_from_fp32):
  // the magnitude is scaled so that float addition does the rounding.
  const float scale_to_inf = vec::BitsToFloat(0x77800000u);   // 2^112
  const float scale_to_zero = vec::BitsToFloat(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = FloatBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = vec::BitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

// float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN. As ggml's
// ggml_compute_fp32_to_bf16.
uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 64);
  return static_cast<uint16_t>((bits + (0x7fffu + ((bits >> 16) & 1u))) >> 16);
}

void StoreU16(std::byte* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

void EncodeF16(const float* src, int64_t n, std::byte* dst) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
#endif
  for (; i < n; ++i) StoreU16(dst + 2 * i, FloatToFp16(src[i]));
}

void EncodeBf16(const float* src, int64_t n, std::byte* dst) {
  for (int64_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, FloatToBf16(src[i]));
}

uint16_t LoadU16(const std::byte* p) { return vec::LoadU16(p); }

void DecodeF16(const std::byte* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = vec::Fp16ToFloat(LoadU16(src + 2 * i));
}

void DecodeBf16(const std::byte* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = vec::Bf16ToFloat(LoadU16(src + 2 * i));
}

// value = d * q, one rounding, as ggml's dequantize_row_q8_0.
void DecodeQ8_0(const std::byte* src, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / kQ8_0BlockValues; ++b) {
    const std::byte* in = src + b * kQ8_0BlockBytes;
    const float d = vec::Fp16ToFloat(LoadU16(in));
    const int8_t* q = reinterpret_cast<const int8_t*>(in + 2);
    float* out = dst + b * kQ8_0BlockValues;
    for (int32_t j = 0; j < kQ8_0BlockValues; ++j) out[j] = static_cast<float>(q[j]) * d;
  }
}

}  // namespace

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kBF16: return "bf16";
    case KvDtype::kQ8_0: return "q8_0";
  }
  return "?";
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0}) {
    if (name == KvDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype '", std::string(name),
                                                 "' (expected f32, f16, bf16 or q8_0)"));
}

absl::Status CheckKvDtype(KvDtype dtype, int32_t head_dim) {
  if (dtype == KvDtype::kQ8_0 && head_dim % kQ8_0BlockValues != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache dtype q8_0 needs a head_dim that is a multiple of ", kQ8_0BlockValues,
        "; this model's is ", head_dim));
  }
  return absl::OkStatus();
}

int64_t KvRowBytes(KvDtype dtype, int32_t head_dim) {
  switch (dtype) {
    case KvDtype::kF32: return int64_t{head_dim} * 4;
    case KvDtype::kF16:
    case KvDtype::kBF16: return int64_t{head_dim} * 2;
    case KvDtype::kQ8_0: return int64_t{head_dim} / kQ8_0BlockValues * kQ8_0BlockBytes;
  }
  return 0;
}

void EncodeKv(KvDtype dtype, const float* src, int64_t n, std::byte* dst) {
  switch (dtype) {
    case KvDtype::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case KvDtype::kF16: EncodeF16(src, n, dst); return;
    case KvDtype::kBF16: EncodeBf16(src, n, dst); return;
    // ggml's Q8_0 blocks, written as for a weight row (d = amax / 127, q = round(x / d)).
    case KvDtype::kQ8_0: QuantizeRowQ8_0(src, n, reinterpret_cast<uint8_t*>(dst)); return;
  }
}

void DecodeKv(KvDtype dtype, const std::byte* src, int64_t n, float* dst) {
  switch (dtype) {
    case KvDtype::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case KvDtype::kF16: DecodeF16(src, n, dst); return;
    case KvDtype::kBF16: DecodeBf16(src, n, dst); return;
    case KvDtype::kQ8_0: DecodeQ8_0(src, n, dst); return;
  }
}

}  // namespace winnow::kernels
