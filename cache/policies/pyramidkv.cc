#include "cache/policies/pyramidkv.h"

#include <algorithm>

#include "base/status_macros.h"
#include "cache/policies/scoring_helpers.h"
#include "cache/policies/snapkv.h"

namespace winnow::cache::policies {

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePyramidKvPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  WINNOW_ASSIGN_OR_RETURN(const SnapKvOptions options, ParseSnapKvOptions(config));
  double beta = 20.0;
  WINNOW_RETURN_IF_ERROR(config.ReadDouble("beta", &beta, 1.0, 1e6));
  WINNOW_RETURN_IF_ERROR(config.CheckAllUsed("pyramidkv"));
  const int32_t n = context.layout.num_tokens;
  const int32_t window = std::clamp(options.window, 1, std::max(n, 1));
  std::vector<int32_t> budgets = PyramidBudgets(
      context.dims.num_layers, n, KeepCount(config.budget(), n), window, beta);
  return CreateSnapKvFamilyPolicy("pyramidkv", config, context, options, std::move(budgets));
}

}  // namespace winnow::cache::policies
