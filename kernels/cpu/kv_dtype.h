// Element types of the paged KV cache and the conversions between them and float32.
//
// A KV row is one token's head_dim values of K (or V) for one KV head. Rows are stored
// contiguously in the block arena (cache/block_pool.h), so a row of any dtype can be moved by
// copying its bytes. Kernels convert rows to float32 as they read them and accumulate in float32.
//   f32  : head_dim floats (4 bytes a value)
//   f16  : IEEE binary16, round to nearest even (2 bytes)
//   bf16 : bfloat16, round to nearest even (2 bytes)
//   q8_0 : ggml's Q8_0: blocks of 32 values, an fp16 scale d then 32 int8 q, value = d * q
//          (34 bytes per 32 values); head_dim must be a multiple of 32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace winnow::kernels {

enum class KvDtype : uint8_t { kF32, kF16, kBF16, kQ8_0 };

inline constexpr int32_t kQ8_0BlockValues = 32;
inline constexpr int32_t kQ8_0BlockBytes = 2 + kQ8_0BlockValues;

// "f32", "f16", "bf16", "q8_0".
const char* KvDtypeName(KvDtype dtype);
// The inverse of KvDtypeName; InvalidArgument listing the accepted names otherwise.
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);
// InvalidArgument when rows of `head_dim` values cannot be stored as `dtype` (q8_0 needs whole
// 32-value blocks).
absl::Status CheckKvDtype(KvDtype dtype, int32_t head_dim);

// Bytes one row of `head_dim` values occupies.
int64_t KvRowBytes(KvDtype dtype, int32_t head_dim);

// Stores `n` floats (one or more whole rows) as `dtype` at dst.
void EncodeKv(KvDtype dtype, const float* src, int64_t n, std::byte* dst);
// Loads `n` values (one or more whole rows) stored as `dtype` at src into float32. Exact for
// every dtype (each stored value is representable in float32); f32 is a copy.
void DecodeKv(KvDtype dtype, const std::byte* src, int64_t n, float* dst);

}  // namespace winnow::kernels
