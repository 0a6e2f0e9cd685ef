// The precision of the CPU forward's matmul inputs (--cpu-activations).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace winnow::model {

// How the CPU forward feeds activations to quantised weight matrices (--cpu-activations).
enum class CpuActivations {
  // float32 activations: every product equals the dequantised weights' to float rounding.
  kF32,
  // Each matmul input quantised to 8 bits per 32-element block, integer dot products
  // (kernels/cpu/matmul_q8.h; llama.cpp's approach). About 2x the prefill rate; logits move by
  // the activations' rounding (docs/cpu.md). Float weights stay float.
  kQ8,
};
absl::StatusOr<CpuActivations> ParseCpuActivations(std::string_view name);  // "f32" | "q8"
std::string_view CpuActivationsName(CpuActivations a);

// The default of the daemon and the CLI (WorkerOptions' own stays f32, the exact path).
inline constexpr CpuActivations kDefaultCpuActivations = CpuActivations::kQ8;

}  // namespace winnow::model
