// Float32 rows into ggml's quantised block formats: the inverse of dequantize.h for the types
// the CPU kernels multiply fastest (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), so that weights stored as
// floats (a Hugging Face checkpoint's) can run as a GGUF's quantised ones would
// (--cpu-weight-type, model/weight_quantize.h).
//
// The blocks are byte for byte those of gguf-py's gguf.quants.quantize (the numpy reference,
// itself bit-exact with ggml's quantize_row_*_ref), tested by tests/python/test_weight_quantize.py,
// with two exceptions where numpy's bytes are not defined by the arithmetic, and which dequantise
// to the same values:
// - a block whose scale d is so small that 1 / d overflows float32 (|d| < 2^-128): numpy
//   multiplies by an infinite inverse and casts the NaN / inf to an integer, which C leaves
//   undefined; here such quants are zero. The fp16 scale is zero either way, so the block
//   dequantises to zeros (Q4_1 / Q5_1: to its minimum) whatever the quants.
// - Q4_1 / Q5_1's minimum when it is a zero and the block holds both +0 and -0: which sign
//   numpy's min reduction returns depends on the zeros' positions in its SIMD lanes; here it is
//   the first one's. d * q + m is the same float either way.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// True for the types QuantizeRow writes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
bool CanQuantize(GgmlType type);

// Writes `n` floats (a multiple of the type's 32-element block) at `src` as `type` at `dst`,
// RowBytes(type, n) bytes.
absl::Status QuantizeRow(GgmlType type, const float* src, int64_t n, uint8_t* dst);

// QuantizeRow's Q8_0, without its checks: `n` must be a multiple of 32. Also the KV cache's q8_0
// rows (kv_dtype.h), which are ggml's Q8_0 blocks.
void QuantizeRowQ8_0(const float* src, int64_t n, uint8_t* dst);

// Writes every row of `w` (any type DequantizeRow reads; cols a multiple of 32) as `type` at
// `dst`, rows.size() * RowBytes(type, cols) bytes, rows spread over `pool`. The returned matrix
// views `dst`.
absl::StatusOr<WeightMatrix> QuantizeMatrix(const WeightMatrix& w, GgmlType type, uint8_t* dst,
                                            ThreadPool& pool);

}  // namespace winnow::kernels
