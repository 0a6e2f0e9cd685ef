// Random GGUF weight matrices and activations for the matmul tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/matmul.h"

namespace winnow::kernels {

// A finite, normal fp16 with magnitude in [2^(lo-15), 2^(hi-14)), built from bits so the test
// needs no float->half conversion.
inline uint16_t RandomHalf(std::mt19937& rng, int lo_exponent, int hi_exponent) {
  std::uniform_int_distribution<int> exponent(lo_exponent, hi_exponent);
  std::uniform_int_distribution<int> mantissa(0, 1023);
  std::uniform_int_distribution<int> sign(0, 1);
  return static_cast<uint16_t>((sign(rng) << 15) | (exponent(rng) << 10) | mantissa(rng));
}

inline void PutHalf(uint8_t* p, uint16_t h) { std::memcpy(p, &h, sizeof(h)); }

// Byte offsets of the fp16 scale fields inside one block; every other byte may be random.
inline std::vector<int> HalfOffsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

struct Weights {
  std::vector<uint8_t> bytes;
  WeightMatrix matrix;
};

inline Weights RandomWeights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t row_bytes = RowBytes(type, cols);
  Weights w;
  w.bytes.resize(static_cast<size_t>(rows * row_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  if (type == GgmlType::kF32) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = uniform(rng);
      std::memcpy(w.bytes.data() + 4 * i, &v, 4);
    }
  } else if (type == GgmlType::kF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      PutHalf(w.bytes.data() + 2 * i, RandomHalf(rng, 8, 15));
    }
  } else if (type == GgmlType::kBF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = uniform(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      PutHalf(w.bytes.data() + 2 * i, static_cast<uint16_t>(bits >> 16));
    }
  } else {
    for (uint8_t& b : w.bytes) b = static_cast<uint8_t>(byte(rng));
    const GgmlTypeTraits traits = TraitsOf(type);
    const std::vector<int> offsets = HalfOffsets(type);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / traits.block_elements; ++b) {
        uint8_t* block = w.bytes.data() + r * row_bytes + b * traits.block_bytes;
        for (int off : offsets) PutHalf(block + off, RandomHalf(rng, 8, 13));
      }
    }
  }
  w.matrix = WeightMatrix{type, rows, cols, row_bytes, w.bytes.data()};
  return w;
}

inline std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

// cols rounded up to whole blocks of the type (256 for K-quants).
inline int64_t WholeBlocks(GgmlType type, int64_t cols) {
  const int64_t block = TraitsOf(type).block_elements;
  return (cols + block - 1) / block * block;
}

}  // namespace winnow::kernels
