// The policy registry: an explicit table (static self-registration would be dropped by the
// linker from a static library). Every policy is part of the build; each header
// cache/policies/<name>.h declares Create<Name>Policy(const PolicyConfig&, const PolicyContext&).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/policies/aircache.h"
#include "cache/policies/composite.h"
#include "cache/policies/elastic_cache.h"
#include "cache/policies/h2o.h"
#include "cache/policies/kvzip.h"
#include "cache/policies/policy.h"
#include "cache/policies/pyramidkv.h"
#include "cache/policies/snapkv.h"
#include "cache/policies/streaming_llm.h"
#include "cache/policies/tokenselect.h"
#include "cache/policies/vl_cache.h"
#include "cache/policies/xkv.h"

namespace winnow::cache::policies {
namespace {

struct Entry {
  const char* name;
  PolicyFactory factory;
};

const std::vector<Entry>& Table() {
  static const std::vector<Entry>* table = new std::vector<Entry>{
      {"streaming_llm", CreateStreamingLlmPolicy},
      {"h2o", CreateH2oPolicy},
      {"snapkv", CreateSnapKvPolicy},
      {"pyramidkv", CreatePyramidKvPolicy},
      {"kvzip", CreateKvzipPolicy},
      {"vl_cache", CreateVlCachePolicy},
      {"aircache", CreateAirCachePolicy},
      {"xkv", CreateXkvPolicy},
      {"elastic_cache", CreateElasticCachePolicy},
      {"tokenselect", CreateTokenSelectPolicy},
      {"composite", CreateCompositePolicy},
      {"winnowkv", CreateWinnowKvPolicy},
      {"winnowkv_docs", CreateWinnowKvDocsPolicy},
  };
  return *table;
}

}  // namespace

std::vector<std::string> KnownPolicies() {
  std::vector<std::string> names = {"none"};
  for (const Entry& e : Table()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::unique_ptr<CompressionPolicy>> CreatePolicy(const std::string& name,
                                                                 const PolicyConfig& config,
                                                                 const PolicyContext& context) {
  if (name.empty() || name == "none") {
    if (!config.params().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compression.params: policy \"", name.empty() ? std::string("none") : name,
          "\" takes no parameters"));
    }
    return std::unique_ptr<CompressionPolicy>();
  }
  const Entry* entry = nullptr;
  for (const Entry& e : Table()) {
    if (name == e.name) entry = &e;
  }
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("compression.policy: unknown policy \"", name,
                                                   "\" (known: ",
                                                   absl::StrJoin(KnownPolicies(), ", "), ")"));
  }
  // NaN fails both comparisons, so it is rejected too.
  if (!(config.budget() > 0.0 && config.budget() <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression.budget: ", config.budget(),
        " is outside (0, 1]; it is the fraction of the prompt's KV kept"));
  }
  const ModelDims& dims = context.dims;
  if (dims.num_layers <= 0 || dims.num_kv_heads <= 0 || dims.num_heads % dims.num_kv_heads != 0 ||
      dims.head_dim <= 0 || dims.block_size <= 0) {
    return absl::InvalidArgumentError("compression: invalid model dimensions");
  }
  if (absl::Status s = context.layout.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("segments: ", s.message()));
  }
  return entry->factory(config, context);
}

}  // namespace winnow::cache::policies
