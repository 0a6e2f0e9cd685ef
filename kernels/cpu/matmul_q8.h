// Weight matmuls with 8-bit activations and integer dot products (llama.cpp's approach on CPU).
//
// The float path (matmul.h) multiplies float32 activations against weights decoded to floats.
// This path quantises each activation row once, per 32-element block (scale = max|x| / 127,
// round to nearest), and multiplies the weights' integer quants against those int8 quants with
// byte dot products (AVX2 vpmaddubsw, or vpdpbusd with AVX-VNNI / AVX-512 VNNI), applying the
// two scales once per block. It trades a small, stated error for about twice the prefill rate
// (docs/cpu.md: the arithmetic, the measured error, the kernels).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// m rows of `cols` activations, quantised in blocks of 32: element k of row i is approximately
// scale[i * blocks + k / 32] * q[i * cols + k].
struct Q8Activations {
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kTileRows = 8;  // rows interleaved per tile in the prefill layout
  int64_t m = 0;
  int64_t cols = 0;
  // Row-major: quants, and per block its scale, scale * sum(q) (for weight formats with an
  // additive offset) and the integer sums of its two 16-element halves (for biased quants).
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> scaled_sum;
  std::vector<int32_t> half_sums;  // 2 per block: elements 0..15, 16..31
  // Prefill layout, built when m is large enough for the tiled kernel: rows in tiles of 8 (the
  // last padded with zeros); per tile and block, 8 groups of 4 consecutive elements, each group
  // holding those 4 quants of the 8 rows in turn (32 bytes), then the same per-row fields as
  // above, 8 of each (lane = row).
  std::vector<int8_t> tiled_q;
  std::vector<float> tiled_scale;
  std::vector<float> tiled_scaled_sum;
  std::vector<int32_t> tiled_half_sums;  // per tile and block: 8 low-half sums, 8 high-half

  int64_t blocks() const { return cols / kBlock; }
  int64_t tiles() const { return (m + kTileRows - 1) / kTileRows; }
  bool tiled() const { return !tiled_q.empty(); }
};

// Quantises x[m x cols] into *out (reusing its storage). cols must be a multiple of 32. The
// result of each row depends only on that row, so batching never changes it.
absl::Status QuantizeActivations(const float* x, int64_t m, int64_t cols, Q8Activations* out,
                                 ThreadPool& pool);

// Whether MatMulQ8 has an integer kernel for this weight type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Float weights (F32, F16, BF16) take the float path.
bool HasInt8Kernel(GgmlType type);

// y[m x rows] = x * W^T with x quantised. As MatMul, every output is summed in one fixed order
// whatever m or the thread count, so a row's result is bit-identical alone or batched.
absl::Status MatMulQ8(const WeightMatrix& w, const Q8Activations& x, float* y, ThreadPool& pool);

namespace internal {
// The same product through the portable (non-SIMD) code, which follows the SIMD kernels'
// arithmetic operation for operation: tests compare the two bit for bit.
absl::Status MatMulQ8Portable(const WeightMatrix& w, const Q8Activations& x, float* y,
                              ThreadPool& pool);
}  // namespace internal

}  // namespace winnow::kernels
