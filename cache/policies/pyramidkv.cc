#include "cache/policies/pyramidkv.h"

#include <algorithm>

#include "cache/policies/scoring_helpers.h"
#include "cache/policies/snapkv.h"

namespace winnow::cache::policies {

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePyramidKvPolicy(
    const PolicyConfig& config, const PolicyContext& context) {
  absl::StatusOr<SnapKvOptions> options = ParseSnapKvOptions(config);
  if (!options.ok()) return options.status();
  absl::StatusOr<double> beta = config.GetDouble("beta", 20.0, 1.0, 1e6);
  if (!beta.ok()) return beta.status();
  if (absl::Status s = config.CheckAllUsed("pyramidkv"); !s.ok()) return s;
  const int32_t n = context.layout.num_tokens;
  const int32_t window = std::clamp(options->window, 1, std::max(n, 1));
  std::vector<int32_t> budgets = PyramidBudgets(
      context.dims.num_layers, n, KeepCount(config.budget(), n), window, *beta);
  return CreateSnapKvFamilyPolicy("pyramidkv", config, context, *options, std::move(budgets));
}

}  // namespace winnow::cache::policies
