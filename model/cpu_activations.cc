#include "model/cpu_activations.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace winnow::model {

absl::StatusOr<CpuActivations> ParseCpuActivations(std::string_view name) {
  if (name == "f32") return CpuActivations::kF32;
  if (name == "q8") return CpuActivations::kQ8;
  return absl::InvalidArgumentError(
      absl::StrCat("cpu activations must be f32 or q8, got '", std::string(name), "'"));
}

std::string_view CpuActivationsName(CpuActivations a) {
  return a == CpuActivations::kQ8 ? "q8" : "f32";
}

}  // namespace winnow::model
