#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/kv_dtype.h"

// gguf-py (the byte-exactness reference) computes `x * id + 8.5` and `(x - min) * id + 0.5` as
// separate numpy operations, two roundings; a fused multiply-add rounds once and would move a
// quant across a truncation boundary now and then. As in dequantize.cc, no contraction here.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace winnow::kernels {
namespace {

constexpr int kBlock = 32;  // QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0

// float32 -> IEEE binary16, round to nearest even, as numpy's astype(np.float16) (the KV cache's
// f16 encoder is that conversion).
void StoreHalf(float f, uint8_t* dst) {
  EncodeKv(KvDtype::kF16, &f, 1, reinterpret_cast<std::byte*>(dst));
}

void StoreU32(uint32_t v, uint8_t* dst) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(v >> (8 * i));  // little-endian
}

// numpy's np.trunc(v).astype(np.uint8).clip(0, top) for the v a finite block produces (0 to
// top + 1.5). NaN, whose integer cast C leaves undefined, gives 0: it only arises where the
// block's values overflow float32 arithmetic and its fp16 scale is inf anyway.
int TruncClip(float v, int top) {
  if (!(v >= 0.0f)) return 0;
  return v >= static_cast<float>(top) ? top : static_cast<int>(v);
}

// gguf-py's np_roundf (round half away from zero) then astype(np.int8), for the |v| <= 127.5 a
// finite block produces, in np_roundf's own steps (each exact in float32); NaN gives 0, as in
// TruncClip.
int8_t RoundInt8(float v) {
  const float a = std::fabs(v);
  const float floored = std::floor(a);
  const float rounded = std::min(floored + std::floor(2.0f * (a - floored)), 127.0f);
  return static_cast<int8_t>(v == v ? std::copysign(rounded, v) : 0.0f);
}

// 1 / d, or 0 for d == 0, as gguf-py's np.where(d == 0, 0, 1 / d). `defined` is false when it
// overflows (|d| < 2^-128): numpy's quants are then casts of NaN / inf, see quantize.h.
float Inverse(float d, bool* defined) {
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  *defined = std::isfinite(id);
  return id;
}

// The value of largest magnitude, the first on ties (numpy's argmax of abs).
float SignedAbsMax(const float* x) {
  int imax = 0;
  for (int j = 1; j < kBlock; ++j) {
    if (std::fabs(x[j]) > std::fabs(x[imax])) imax = j;
  }
  return x[imax];
}

void MinMax(const float* x, float* min, float* max) {
  *min = x[0];
  *max = x[0];
  for (int j = 1; j < kBlock; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

// 16 bytes: elements 0..15 in the low nibbles, 16..31 in the high ones (ggml_blocks.h Nibble).
void PackNibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < kBlock / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + kBlock / 2] & 0x0f) << 4));
  }
}

// Q5's fifth bits: bit j of the little-endian word is element j's.
uint32_t HighBits(const int* q) {
  uint32_t qh = 0;
  for (int j = 0; j < kBlock; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  return qh;
}

// Q8_0 (gguf-py Q8_0.quantize_blocks): d = max|x| / 127, q = round half away from zero of
// x * (1 / d). Layout: d (fp16) | qs[32] (int8).
void BlockQ8_0(const float* x, uint8_t* y) {
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  bool defined;
  const float id = Inverse(d, &defined);
  StoreHalf(d, y);
  int8_t q[kBlock];
  for (int j = 0; j < kBlock; ++j) q[j] = RoundInt8(x[j] * id);
  if (!defined) std::fill(q, q + kBlock, 0);
  std::memcpy(y + 2, q, kBlock);
}

// Symmetric 4- and 5-bit blocks (Q4_0: levels = 16, Q5_0: 32): d = max / -(levels / 2) with
// max the value of largest magnitude, q = trunc(x / d + levels / 2 + 0.5) clipped to the top.
void SymmetricQuants(const float* x, int levels, float* d, int* q) {
  *d = SignedAbsMax(x) / -static_cast<float>(levels / 2);
  bool defined;
  const float id = Inverse(*d, &defined);
  const float offset = static_cast<float>(levels / 2) + 0.5f;
  for (int j = 0; j < kBlock; ++j) q[j] = defined ? TruncClip(x[j] * id + offset, levels - 1) : 0;
}

// Asymmetric blocks (Q4_1: levels = 16, Q5_1: 32): d = (max - min) / (levels - 1),
// q = trunc((x - min) / d + 0.5) clipped to the top.
void AsymmetricQuants(const float* x, int levels, float* d, float* min, int* q) {
  float max;
  MinMax(x, min, &max);
  *d = (max - *min) / static_cast<float>(levels - 1);
  bool defined;
  const float id = Inverse(*d, &defined);
  for (int j = 0; j < kBlock; ++j) {
    q[j] = defined ? TruncClip((x[j] - *min) * id + 0.5f, levels - 1) : 0;
  }
}

void BlockQ4_0(const float* x, uint8_t* y) {  // d | qs[16]
  float d;
  int q[kBlock];
  SymmetricQuants(x, 16, &d, q);
  StoreHalf(d, y);
  PackNibbles(q, y + 2);
}

void BlockQ4_1(const float* x, uint8_t* y) {  // d | m | qs[16]
  float d, min;
  int q[kBlock];
  AsymmetricQuants(x, 16, &d, &min, q);
  StoreHalf(d, y);
  StoreHalf(min, y + 2);
  PackNibbles(q, y + 4);
}

void BlockQ5_0(const float* x, uint8_t* y) {  // d | qh[4] | qs[16]
  float d;
  int q[kBlock];
  SymmetricQuants(x, 32, &d, q);
  StoreHalf(d, y);
  StoreU32(HighBits(q), y + 2);
  PackNibbles(q, y + 6);
}

void BlockQ5_1(const float* x, uint8_t* y) {  // d | m | qh[4] | qs[16]
  float d, min;
  int q[kBlock];
  AsymmetricQuants(x, 32, &d, &min, q);
  StoreHalf(d, y);
  StoreHalf(min, y + 2);
  StoreU32(HighBits(q), y + 4);
  PackNibbles(q, y + 8);
}

using BlockFn = void (*)(const float*, uint8_t*);

BlockFn BlockFunction(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return BlockQ8_0;
    case GgmlType::kQ4_0: return BlockQ4_0;
    case GgmlType::kQ4_1: return BlockQ4_1;
    case GgmlType::kQ5_0: return BlockQ5_0;
    case GgmlType::kQ5_1: return BlockQ5_1;
    default: return nullptr;
  }
}

absl::Status CheckQuantizable(GgmlType type, int64_t n) {
  if (!CanQuantize(type)) {
    return absl::UnimplementedError(
        absl::StrCat("cannot quantize to ggml type ", std::string(TraitsOf(type).name), " (id ",
                     static_cast<uint32_t>(type), "); Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 can be"));
  }
  if (n < 0 || n % kBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantize ", std::string(TraitsOf(type).name), ": ", n,
                     " elements is not a multiple of the block size ", kBlock));
  }
  return absl::OkStatus();
}

}  // namespace

bool CanQuantize(GgmlType type) { return BlockFunction(type) != nullptr; }

absl::Status QuantizeRow(GgmlType type, const float* src, int64_t n, uint8_t* dst) {
  if (absl::Status s = CheckQuantizable(type, n); !s.ok()) return s;
  const BlockFn block = BlockFunction(type);
  const int64_t block_bytes = TraitsOf(type).block_bytes;
  for (int64_t b = 0; b < n / kBlock; ++b) block(src + b * kBlock, dst + b * block_bytes);
  return absl::OkStatus();
}

void QuantizeRowQ8_0(const float* src, int64_t n, uint8_t* dst) {
  const int64_t block_bytes = TraitsOf(GgmlType::kQ8_0).block_bytes;
  for (int64_t b = 0; b < n / kBlock; ++b) BlockQ8_0(src + b * kBlock, dst + b * block_bytes);
}

absl::StatusOr<WeightMatrix> QuantizeMatrix(const WeightMatrix& w, GgmlType type, uint8_t* dst,
                                            ThreadPool& pool) {
  if (absl::Status s = CheckQuantizable(type, w.cols); !s.ok()) return s;
  if (absl::Status s = ValidateWeightMatrix(w); !s.ok()) return s;
  if (!CanDequantize(w.type)) {
    return absl::UnimplementedError(absl::StrCat("cannot read ggml type ",
                                                 std::string(TraitsOf(w.type).name)));
  }
  const WeightMatrix out{type, w.rows, w.cols, RowBytes(type, w.cols), dst};
  // Chunks of at least ~64K values, so that small matrices do not pay for the pool.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, w.cols));
  pool.ParallelFor(w.rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(w.cols);
    for (int64_t r = begin; r < end; ++r) {
      // Both checked above: the type is readable and cols whole blocks of either type.
      DequantizeRow(w.type, w.data + r * w.row_bytes, w.cols, row.data()).IgnoreError();
      QuantizeRow(type, row.data(), w.cols, dst + r * out.row_bytes).IgnoreError();
    }
  });
  return out;
}

}  // namespace winnow::kernels
