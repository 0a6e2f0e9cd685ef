// The tensor element types of the GGUF/ggml format, with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace winnow::kernels {

// Values are the on-disk ids of ggml_type; they must never change.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  std::string_view name;
  int64_t block_elements;  // elements per quantisation block (1 for plain types)
  int64_t block_bytes;     // bytes per block
  bool known;              // false for ids this build does not know at all
};

// Geometry for any id found in a file; unknown ids report known = false.
GgmlTypeTraits TraitsOf(uint32_t type_id);
inline GgmlTypeTraits TraitsOf(GgmlType type) { return TraitsOf(static_cast<uint32_t>(type)); }

}  // namespace winnow::kernels
