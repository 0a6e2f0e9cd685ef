// --cpu-weight-type: a model's float weight matrices quantised at load, so that the CPU forward
// runs a Hugging Face directory's F32 / F16 / BF16 weights (or a GGUF's float tensors) as a
// quantised GGUF's: fewer bytes to stream per token, and the integer kernels of
// --cpu-activations q8. The blocks are ggml's (kernels/cpu/quantize.h), so MatMul, MatMulQ8 and
// GetRow read them as they read a GGUF's. Accuracy per type: README, "Quantising a directory
// at load".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/cpu/ggml_types.h"
#include "model/model.h"

namespace winnow::model {

// "none" (nullopt: the weights run as stored), "q8_0", "q4_0", "q4_1", "q5_0" or "q5_1";
// anything else is InvalidArgument listing those.
absl::StatusOr<std::optional<kernels::GgmlType>> ParseCpuWeightType(std::string_view name);
// The inverse of ParseCpuWeightType.
std::string CpuWeightTypeName(std::optional<kernels::GgmlType> type);
// The names ParseCpuWeightType accepts, for help texts: "none, q8_0, q4_0, q4_1, q5_0, q5_1".
std::string CpuWeightTypeNames();

// Rewrites as `type` every F32, F16 or BF16 matrix of `weights` (the token embeddings, the
// attention and MLP projections, the output head) whose rows are whole 32-value blocks; a
// matrix already quantised (a GGUF's) or of another width stays as it is, and norms and biases
// are vectors and stay float. Rows are spread over `threads` threads (0: one per hardware
// thread). A tied output head keeps sharing the embeddings' matrix. Returns the owner of the new
// bytes, which the rewritten matrices view (null when none was rewritten).
absl::StatusOr<std::shared_ptr<const void>> QuantizeWeights(kernels::GgmlType type,
                                                            int32_t threads,
                                                            ModelWeights* weights);

}  // namespace winnow::model
