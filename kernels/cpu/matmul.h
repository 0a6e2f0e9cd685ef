// Matrix products against GGUF weight matrices, kept in their stored (possibly quantised) type.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/ggml_types.h"
#include "kernels/cpu/thread_pool.h"

namespace winnow::kernels {

// A row-major weight matrix as stored in GGUF: `rows` rows (ggml ne1) of `cols` elements (ggml
// ne0, contiguous), each row `row_bytes` long in `type`.
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
  const uint8_t* data = nullptr;
};

// A known, dequantisable type; a non-negative shape of whole blocks; row_bytes holding a row;
// data present. Errors name the type and the numbers.
absl::Status ValidateWeightMatrix(const WeightMatrix& w);

// y[m x rows] = x[m x cols] * W^T, all float32, row-major. Weights are dequantised on the fly,
// so the result equals (to float rounding) the product with the dequantised matrix. Fast paths
// exist for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; any other type
// DequantizeRow supports (Q2_K, Q3_K, ...) works through a generic path. Returns an error for a type that cannot be dequantised.
// Every output element is summed in one fixed order whatever m, the code path or the thread
// count, so a row's result is bit-identical alone or batched (continuous batching relies on it).
absl::Status MatMul(const WeightMatrix& w, const float* x, int64_t m, float* y, ThreadPool& pool);

// Copies row `row` of W, dequantised, into dst[cols] (embedding lookup).
absl::Status GetRow(const WeightMatrix& w, int64_t row, float* dst);

}  // namespace winnow::kernels
