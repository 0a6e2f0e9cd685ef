#include "kernels/cpu/dequantize.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/vec.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

// gguf-py (our bit-exactness reference) computes `d * q + m` and `dl * q - ml` as separate
// numpy operations, i.e. two roundings. A fused multiply-add rounds once and would differ in the
// last bit, so contraction is switched off for everything below.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace winnow::kernels {
namespace {

constexpr int kQK = 256;  // QK_K

using vec::BitsToFloat;
using vec::LoadU16;
using vec::LoadU32;

inline float LoadHalf(const uint8_t* p) { return vec::Fp16ToFloat(LoadU16(p)); }

void RowF16(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = LoadHalf(src + 2 * i);
}

void RowBF16(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = BitsToFloat(static_cast<uint32_t>(LoadU16(src + 2 * i)) << 16);
  }
}

// Block layouts below follow ggml's block_* structs (ggml-common.h); offsets are in bytes.

void BlockQ4_0(const uint8_t* b, float* y) {  // d | qs[16]
  const float d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void BlockQ4_1(const uint8_t* b, float* y) {  // d | m | qs[16]
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void BlockQ5_0(const uint8_t* b, float* y) {  // d | qh[4] (bit i = 5th bit of element i) | qs[16]
  const float d = LoadHalf(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void BlockQ5_1(const uint8_t* b, float* y) {  // d | m | qh[4] | qs[16]
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void BlockQ8_0(const uint8_t* b, float* y) {  // d | qs[32] (int8)
  const float d = LoadHalf(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void BlockQ8_1(const uint8_t* b, float* y) {  // d | s (sum, unused here) | qs[32]
  const float d = LoadHalf(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 4);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void BlockQ2_K(const uint8_t* b, float* y) {  // scales[16] | qs[64] | d | dmin
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadHalf(b + 80);
  const float dmin = LoadHalf(b + 82);
  for (int h = 0; h < 2; ++h) {  // two halves of 128, each reading 32 bytes of qs
    const uint8_t* q = qs + 32 * h;
    for (int j = 0; j < 4; ++j) {  // four 2-bit planes
      for (int g = 0; g < 2; ++g) {  // two sub-blocks of 16 per plane
        const uint8_t sc = scales[8 * h + 2 * j + g];
        const float dl = d * static_cast<float>(sc & 0x0f);
        const float ml = dmin * static_cast<float>(sc >> 4);
        float* out = y + 128 * h + 32 * j + 16 * g;
        for (int l = 0; l < 16; ++l) {
          out[l] = dl * static_cast<float>((q[16 * g + l] >> (2 * j)) & 3) - ml;
        }
      }
    }
  }
}

void BlockQ3_K(const uint8_t* b, float* y) {  // hmask[32] | qs[64] | scales[12] | d
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = LoadHalf(b + 108);
  int scale[16];
  for (int i = 0; i < 16; ++i) scale[i] = Q3KScale(sc, i);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = qs + 32 * h;
    for (int j = 0; j < 4; ++j) {
      const int hbit = 4 * h + j;  // hmask bit plane for this run of 32
      for (int g = 0; g < 2; ++g) {
        const float dl = d * static_cast<float>(scale[8 * h + 2 * j + g]);
        float* out = y + 128 * h + 32 * j + 16 * g;
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * g + l;
          const int low = (q[k] >> (2 * j)) & 3;
          // A set mask bit means "no offset"; a clear one subtracts 4.
          const int value = low - (((hmask[k] >> hbit) & 1) != 0 ? 0 : 4);
          out[l] = dl * static_cast<float>(value);
        }
      }
    }
  }
}


void BlockQ4_K(const uint8_t* b, float* y) {  // d | dmin | scales[12] | qs[128]
  const float d = LoadHalf(b);
  const float dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {  // 64 elements per 32 bytes: low nibbles, then high nibbles
    const uint8_t* q = qs + 32 * c;
    for (int half = 0; half < 2; ++half) {
      int sc, m;
      KScaleMin(scales, 2 * c + half, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      float* out = y + 64 * c + 32 * half;
      for (int l = 0; l < 32; ++l) {
        out[l] = dl * static_cast<float>((q[l] >> (4 * half)) & 0x0f) - ml;
      }
    }
  }
}

void BlockQ5_K(const uint8_t* b, float* y) {  // d | dmin | scales[12] | qh[32] | qs[128]
  const float d = LoadHalf(b);
  const float dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = qs + 32 * c;
    for (int half = 0; half < 2; ++half) {
      const int sub = 2 * c + half;  // also the qh bit plane
      int sc, m;
      KScaleMin(scales, sub, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      float* out = y + 32 * sub;
      for (int l = 0; l < 32; ++l) {
        const int value = ((q[l] >> (4 * half)) & 0x0f) | (((qh[l] >> sub) & 1) << 4);
        out[l] = dl * static_cast<float>(value) - ml;
      }
    }
  }
}

void BlockQ6_K(const uint8_t* b, float* y) {  // ql[128] | qh[64] | scales[16] (int8) | d
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadHalf(b + 208);
  for (int h = 0; h < 2; ++h) {  // halves of 128: 64 bytes of ql, 32 bytes of qh each
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    for (int j = 0; j < 4; ++j) {  // runs of 32; run j uses nibble j/2 of ql, bit pair j of qh
      for (int g = 0; g < 2; ++g) {
        const float dl = d * static_cast<float>(scales[8 * h + 2 * j + g]);
        float* out = y + 128 * h + 32 * j + 16 * g;
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * g + l;
          const int low = (l4[32 * (j % 2) + k] >> (4 * (j / 2))) & 0x0f;
          const int high = (h2[k] >> (2 * j)) & 0x03;
          out[l] = dl * static_cast<float>((low | (high << 4)) - 32);
        }
      }
    }
  }
}

void BlockQ8_K(const uint8_t* b, float* y) {  // d (float32) | qs[256] | bsums[16]
  float d;
  std::memcpy(&d, b, sizeof(d));
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 4);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(qs[j]);
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockFunction(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return BlockQ4_0;
    case GgmlType::kQ4_1: return BlockQ4_1;
    case GgmlType::kQ5_0: return BlockQ5_0;
    case GgmlType::kQ5_1: return BlockQ5_1;
    case GgmlType::kQ8_0: return BlockQ8_0;
    case GgmlType::kQ8_1: return BlockQ8_1;
    case GgmlType::kQ2_K: return BlockQ2_K;
    case GgmlType::kQ3_K: return BlockQ3_K;
    case GgmlType::kQ4_K: return BlockQ4_K;
    case GgmlType::kQ5_K: return BlockQ5_K;
    case GgmlType::kQ6_K: return BlockQ6_K;
    case GgmlType::kQ8_K: return BlockQ8_K;
    default: return nullptr;
  }
}

}  // namespace

bool CanDequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         BlockFunction(type) != nullptr;
}

absl::Status DequantizeRow(GgmlType type, const void* src, int64_t n, float* dst) {
  const GgmlTypeTraits traits = TraitsOf(type);
  const std::string name(traits.name);
  if (!CanDequantize(type)) {
    return absl::UnimplementedError(absl::StrCat("cannot dequantize ggml type ", name, " (id ",
                                                 static_cast<uint32_t>(type), ")"));
  }
  if (n < 0 || n % traits.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("dequantize ", name, ": ", n,
                                                   " elements is not a multiple of the block "
                                                   "size ", traits.block_elements));
  }
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("dequantize ", name, ": null buffer"));
  }
  const uint8_t* in = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, in, static_cast<size_t>(n) * sizeof(float));
      return absl::OkStatus();
    case GgmlType::kF16:
      RowF16(in, n, dst);
      return absl::OkStatus();
    case GgmlType::kBF16:
      RowBF16(in, n, dst);
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn fn = BlockFunction(type);
  const int64_t blocks = n / traits.block_elements;
  for (int64_t i = 0; i < blocks; ++i) {
    fn(in + i * traits.block_bytes, dst + i * traits.block_elements);
  }
  return absl::OkStatus();
}

int64_t RowBytes(GgmlType type, int64_t n) {
  // -1 flags a misuse (unknown type, n not whole blocks); callers validate shapes before this.
  const GgmlTypeTraits traits = TraitsOf(type);
  if (!traits.known || n < 0 || n % traits.block_elements != 0) return -1;
  return n / traits.block_elements * traits.block_bytes;
}

}  // namespace winnow::kernels
