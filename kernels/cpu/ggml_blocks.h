// Field decoders of the ggml quantisation blocks that dequantize.cc, matmul.cc (float path) and
// matmul_q8.cc (integer path) all read. One definition each, so the three cannot disagree.
#pragma once

#include <cstdint>

namespace winnow::kernels {

// Nibble k (0..31) of a 16-byte run: low nibbles are elements 0..15, high nibbles 16..31
// (Q4_0, Q4_1, and the low four bits of Q5_0 / Q5_1).
inline int Nibble(const uint8_t* qs, int64_t k) {
  return k < 16 ? (qs[k] & 0x0f) : (qs[k - 16] >> 4);
}

// Q4_K / Q5_K: sub-block j's (6-bit scale, 6-bit min), eight pairs packed into 12 bytes.
inline void KScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K: 16-element group i's signed scale, sixteen 6-bit values packed into 12 bytes (low
// nibbles in bytes 0-7, high 2-bit pairs in bytes 8-11), stored with a bias of 32.
inline int Q3KScale(const uint8_t* s, int i) {
  const int lo = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 0x03;
  return (lo | (hi << 4)) - 32;
}

}  // namespace winnow::kernels
