#include "kernels/cpu/dequantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/ggml_types.h"

namespace winnow::kernels {
namespace {

// Reference conversion written from the IEEE 754 definition rather than bit surgery, so it checks
// the implementation instead of repeating it.
double HalfRef(uint16_t h) {
  const int sign = (h & 0x8000) != 0 ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::quiet_NaN();
  }
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -24);
  return sign * std::ldexp(static_cast<double>(1024 + mant), exp - 25);
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

uint16_t ReadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void WriteU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Every product in these formats (half scale x small integer, or half x 6-bit scale x 6-bit
// quant) is exact in double, and so is the following add; one final rounding to float therefore
// gives exactly what ggml/gguf-py produce with float arithmetic.
using ElementRef = std::function<double(const uint8_t* block, int i)>;

struct Case {
  GgmlType type;
  std::vector<int> half_offsets;  // fp16 scale fields, overwritten with finite values
  ElementRef ref;
};

double Nibble(const uint8_t* qs, int i, int half_block) {
  const uint8_t byte = qs[i % half_block];
  return i < half_block ? (byte & 0x0f) : (byte >> 4);
}

int Scale6K3(const uint8_t* sc, int i) {
  const int low = i < 8 ? (sc[i] & 0x0f) : (sc[i - 8] >> 4);
  const int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Q4_K/Q5_K packing, read as three groups of four bytes: d, m and the shared high parts.
void ScaleMinK4Ref(const uint8_t* s, int j, int* sc, int* mn) {
  const uint8_t* d = s;
  const uint8_t* m = s + 4;
  const uint8_t* md = s + 8;
  if (j < 4) {
    *sc = d[j] & 0x3f;
    *mn = m[j] & 0x3f;
  } else {
    *sc = (md[j - 4] & 0x0f) | ((d[j - 4] >> 6) << 4);
    *mn = (md[j - 4] >> 4) | ((m[j - 4] >> 6) << 4);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({GgmlType::kQ4_0, {0}, [](const uint8_t* b, int i) {
                     return HalfRef(ReadU16(b)) * (Nibble(b + 2, i, 16) - 8);
                   }});
  cases.push_back({GgmlType::kQ4_1, {0, 2}, [](const uint8_t* b, int i) {
                     return HalfRef(ReadU16(b)) * Nibble(b + 4, i, 16) + HalfRef(ReadU16(b + 2));
                   }});
  cases.push_back({GgmlType::kQ5_0, {0}, [](const uint8_t* b, int i) {
                     const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) |
                                         (static_cast<uint32_t>(b[5]) << 24);
                     const double q = Nibble(b + 6, i, 16) + 16 * ((qh >> i) & 1);
                     return HalfRef(ReadU16(b)) * (q - 16);
                   }});
  cases.push_back({GgmlType::kQ5_1, {0, 2}, [](const uint8_t* b, int i) {
                     const int byte = i / 8;
                     const double q = Nibble(b + 8, i, 16) + 16 * ((b[4 + byte] >> (i % 8)) & 1);
                     return HalfRef(ReadU16(b)) * q + HalfRef(ReadU16(b + 2));
                   }});
  cases.push_back({GgmlType::kQ8_0, {0}, [](const uint8_t* b, int i) {
                     return HalfRef(ReadU16(b)) * static_cast<int8_t>(b[2 + i]);
                   }});
  cases.push_back({GgmlType::kQ8_1, {0, 2}, [](const uint8_t* b, int i) {
                     return HalfRef(ReadU16(b)) * static_cast<int8_t>(b[4 + i]);
                   }});
  cases.push_back({GgmlType::kQ2_K, {80, 82}, [](const uint8_t* b, int i) {
                     const int h = i / 128, j = (i % 128) / 32, l = i % 32;
                     const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
                     const uint8_t sc = b[i / 16];
                     return HalfRef(ReadU16(b + 80)) * (sc & 0x0f) * q -
                            HalfRef(ReadU16(b + 82)) * (sc >> 4);
                   }});
  cases.push_back({GgmlType::kQ3_K, {108}, [](const uint8_t* b, int i) {
                     const int h = i / 128, j = (i % 128) / 32, l = i % 32;
                     const int low = (b[32 + 32 * h + l] >> (2 * j)) & 3;
                     const int high_set = (b[l] >> (i / 32)) & 1;
                     const int q = low - (high_set ? 0 : 4);
                     return HalfRef(ReadU16(b + 108)) * Scale6K3(b + 96, i / 16) * q;
                   }});
  cases.push_back({GgmlType::kQ4_K, {0, 2}, [](const uint8_t* b, int i) {
                     const int c = i / 64, half = (i % 64) / 32, l = i % 32;
                     const int q = (b[16 + 32 * c + l] >> (4 * half)) & 0x0f;
                     int sc, mn;
                     ScaleMinK4Ref(b + 4, i / 32, &sc, &mn);
                     return HalfRef(ReadU16(b)) * sc * q - HalfRef(ReadU16(b + 2)) * mn;
                   }});
  cases.push_back({GgmlType::kQ5_K, {0, 2}, [](const uint8_t* b, int i) {
                     const int c = i / 64, half = (i % 64) / 32, l = i % 32;
                     const int q = ((b[48 + 32 * c + l] >> (4 * half)) & 0x0f) |
                                   (((b[16 + l] >> (i / 32)) & 1) << 4);
                     int sc, mn;
                     ScaleMinK4Ref(b + 4, i / 32, &sc, &mn);
                     return HalfRef(ReadU16(b)) * sc * q - HalfRef(ReadU16(b + 2)) * mn;
                   }});
  cases.push_back({GgmlType::kQ6_K, {208}, [](const uint8_t* b, int i) {
                     const int h = i / 128, r = i % 128;
                     const int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
                     const int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
                     const int scale = static_cast<int8_t>(b[192 + i / 16]);
                     return HalfRef(ReadU16(b + 208)) * scale * ((low | (high << 4)) - 32);
                   }});
  cases.push_back({GgmlType::kQ8_K, {}, [](const uint8_t* b, int i) {
                     float d;
                     std::memcpy(&d, b, 4);
                     return static_cast<double>(d) * static_cast<int8_t>(b[4 + i]);
                   }});
  return cases;
}

TEST(DequantizeTest, QuantisedTypesMatchFormula) {
  std::mt19937 rng(1234);
  for (const Case& c : Cases()) {
    SCOPED_TRACE(std::string(TraitsOf(c.type).name));
    ASSERT_TRUE(CanDequantize(c.type));
    const GgmlTypeTraits t = TraitsOf(c.type);
    const int blocks = 5;
    std::vector<uint8_t> raw(blocks * t.block_bytes);
    for (uint8_t& b : raw) b = static_cast<uint8_t>(rng());
    for (int k = 0; k < blocks; ++k) {
      uint8_t* block = raw.data() + k * t.block_bytes;
      for (int off : c.half_offsets) {
        // Random sign and mantissa, exponent kept below 16 so scales stay finite and small;
        // block 0 gets a subnormal scale to cover that range.
        uint16_t h = static_cast<uint16_t>(rng()) & 0xbfff;
        if (k == 0) h &= 0x83ff;
        WriteU16(block + off, h);
      }
      if (c.type == GgmlType::kQ8_K) {
        const float d = (k == 0) ? 1e-40f : std::ldexp(static_cast<float>(rng() % 1000), -12);
        std::memcpy(block, &d, 4);
      }
    }
    const int64_t n = blocks * t.block_elements;
    ASSERT_EQ(RowBytes(c.type, n), static_cast<int64_t>(raw.size()));
    std::vector<float> out(n);
    ASSERT_TRUE(DequantizeRow(c.type, raw.data(), n, out.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* block = raw.data() + (i / t.block_elements) * t.block_bytes;
      const float want = static_cast<float>(c.ref(block, static_cast<int>(i % t.block_elements)));
      ASSERT_EQ(Bits(out[i]), Bits(want)) << "element " << i << ": " << out[i] << " vs " << want;
    }
  }
}

TEST(DequantizeTest, KnownQ4_0Block) {
  // d = 0.5, quants 0..15 then 15..0: values (q - 8) / 2.
  uint8_t block[18];
  WriteU16(block, 0x3800);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_0, block, 32, out).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 0.5f);
    EXPECT_EQ(out[16 + j], (7 - j) * 0.5f);
  }
}

TEST(DequantizeTest, KnownQ8_0AndQ4_1Blocks) {
  uint8_t q8[34];
  WriteU16(q8, 0x4000);  // d = 2
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  float out[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_0, q8, 32, out).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2.0f * (j - 16));

  uint8_t q41[20];
  WriteU16(q41, 0x3400);      // d = 0.25
  WriteU16(q41 + 2, 0xbc00);  // m = -1
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | (j << 4));
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_1, q41, 32, out).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.25f * j - 1.0f);
    EXPECT_EQ(out[16 + j], 0.25f * j - 1.0f);
  }
}

TEST(DequantizeTest, F16EveryValue) {
  // All 65536 halves, through the vector path (long row) and the scalar path (n = 1).
  std::vector<uint16_t> halves(65536);
  for (int i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> vec(65536);
  ASSERT_TRUE(DequantizeRow(GgmlType::kF16, halves.data(), 65536, vec.data()).ok());
  for (int i = 0; i < 65536; ++i) {
    float one;
    ASSERT_TRUE(DequantizeRow(GgmlType::kF16, &halves[i], 1, &one).ok());
    const double want = HalfRef(halves[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(vec[i])) << i;
      ASSERT_TRUE(std::isnan(one)) << i;
      ASSERT_EQ(Bits(vec[i]), Bits(one)) << "NaN payload differs between paths for " << i;
      ASSERT_EQ(Bits(one) & 0x80000000u, (i & 0x8000) != 0 ? 0x80000000u : 0u);
    } else {
      ASSERT_EQ(Bits(vec[i]), Bits(static_cast<float>(want))) << i;
      ASSERT_EQ(Bits(one), Bits(static_cast<float>(want))) << i;
    }
  }
}

TEST(DequantizeTest, F16SpecialValues) {
  const uint16_t in[] = {0x0000, 0x8000, 0x3c00, 0x0001, 0x03ff, 0x0400,
                         0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xc000};
  float out[12];
  ASSERT_TRUE(DequantizeRow(GgmlType::kF16, in, 12, out).ok());
  EXPECT_EQ(Bits(out[0]), 0u);
  EXPECT_EQ(Bits(out[1]), 0x80000000u);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[4], std::ldexp(1023.0f, -24));
  EXPECT_EQ(out[5], std::ldexp(1.0f, -14));
  EXPECT_EQ(out[6], 65504.0f);
  EXPECT_EQ(out[7], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[8], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(out[9]));
  EXPECT_TRUE(std::isnan(out[10]));
  EXPECT_EQ(out[11], -2.0f);
}

TEST(DequantizeTest, Bf16AndF32) {
  const uint16_t bf[] = {0x3f80, 0xc000, 0x7f80, 0x0001, 0x8000};
  float out[5];
  ASSERT_TRUE(DequantizeRow(GgmlType::kBF16, bf, 5, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(out[3]), 0x00010000u);
  EXPECT_EQ(Bits(out[4]), 0x80000000u);

  const float f[] = {1.5f, -0.0f, 3e-40f};
  ASSERT_TRUE(DequantizeRow(GgmlType::kF32, f, 3, out).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Bits(out[i]), Bits(f[i]));
}

TEST(DequantizeTest, RejectsBadArguments) {
  uint8_t block[34] = {};
  float out[64];
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_0, block, 31, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kI32, block, 4, out).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(DequantizeRow(static_cast<GgmlType>(16), block, 256, out).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ8_0, nullptr, 0, nullptr).ok());
  EXPECT_FALSE(CanDequantize(GgmlType::kI8));
  EXPECT_FALSE(CanDequantize(GgmlType::kF64));
}

TEST(DequantizeTest, RowBytes) {
  EXPECT_EQ(RowBytes(GgmlType::kF32, 10), 40);
  EXPECT_EQ(RowBytes(GgmlType::kF16, 10), 20);
  EXPECT_EQ(RowBytes(GgmlType::kBF16, 10), 20);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_0, 32), 22);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_1, 32), 24);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 576), 18 * 34);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_1, 32), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ2_K, 256), 84);
  EXPECT_EQ(RowBytes(GgmlType::kQ3_K, 256), 110);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_K, 512), 288);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_K, 256), 176);
  EXPECT_EQ(RowBytes(GgmlType::kQ6_K, 256), 210);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_K, 256), 292);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 33), -1);
  EXPECT_EQ(RowBytes(static_cast<GgmlType>(4), 32), -1);
}

TEST(DequantizeTest, TraitsOfEveryEnumId) {
  const GgmlType all[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1,
                          GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ8_1,
                          GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                          GgmlType::kQ6_K, GgmlType::kQ8_K, GgmlType::kI8,   GgmlType::kI16,
                          GgmlType::kI32,  GgmlType::kI64,  GgmlType::kF64,  GgmlType::kBF16};
  for (GgmlType t : all) {
    const GgmlTypeTraits traits = TraitsOf(t);
    EXPECT_TRUE(traits.known) << static_cast<uint32_t>(t);
    EXPECT_GT(traits.block_elements, 0);
    EXPECT_GT(traits.block_bytes, 0);
  }
  EXPECT_EQ(TraitsOf(GgmlType::kQ4_K).name, "Q4_K");
  EXPECT_EQ(TraitsOf(GgmlType::kBF16).name, "BF16");
  EXPECT_FALSE(TraitsOf(4).known);
  EXPECT_FALSE(TraitsOf(31).known);
  EXPECT_FALSE(TraitsOf(1000).known);
  EXPECT_FALSE(TraitsOf(0xffffffffu).known);
}

}  // namespace
}  // namespace winnow::kernels
