// Conversion of one row of a GGUF tensor to float32.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/ggml_types.h"

namespace winnow::kernels {

// True when DequantizeRow can convert this type.
bool CanDequantize(GgmlType type);

// Converts `n` elements starting at `src` (which must begin on a block boundary; n a multiple of
// the type's block size) into `dst`. Results are bit-identical to ggml's dequantize_row_* (and
// therefore to gguf-py's dequantize, which transformers uses).
absl::Status DequantizeRow(GgmlType type, const void* src, int64_t n, float* dst);

// Bytes occupied by `n` elements of `type` (n a multiple of the block size).
int64_t RowBytes(GgmlType type, int64_t n);

}  // namespace winnow::kernels
