#include "model/model_config.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace winnow::model {
namespace {

// Reads `<arch>.<suffix>` as a positive int32, naming the key in errors.
absl::StatusOr<int32_t> PositiveInt(const GgufFile& file, const std::string& key,
                                    std::optional<int32_t> fallback = std::nullopt) {
  absl::StatusOr<int64_t> value = file.GetInt(key);
  if (absl::IsNotFound(value.status()) && fallback.has_value()) return *fallback;
  if (!value.ok()) return value.status();
  if (*value <= 0 || *value > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", key, " = ", *value,
                                                   " is out of range"));
  }
  return static_cast<int32_t>(*value);
}

absl::StatusOr<double> FloatOr(const GgufFile& file, const std::string& key, double fallback) {
  absl::StatusOr<double> value = file.GetFloat(key);
  if (absl::IsNotFound(value.status())) return fallback;
  return value;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& file) {
  ModelConfig c;
  WINNOW_ASSIGN_OR_RETURN(const std::string arch, file.GetString("general.architecture"));
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported architecture '", arch, "' (general.architecture); winnow runs llama, "
        "qwen2 and qwen3 models"));
  }
  c.architecture = arch;
  c.rope_halves = arch == "qwen2" || arch == "qwen3";
  c.name = file.GetString("general.name").value_or("");
  const std::string p = c.architecture + ".";

  WINNOW_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(file, p + "block_count"));
  WINNOW_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(file, p + "embedding_length"));
  WINNOW_ASSIGN_OR_RETURN(c.ffn_size, PositiveInt(file, p + "feed_forward_length"));
  WINNOW_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(file, p + "attention.head_count"));
  WINNOW_ASSIGN_OR_RETURN(c.num_kv_heads,
                          PositiveInt(file, p + "attention.head_count_kv", c.num_heads));
  WINNOW_ASSIGN_OR_RETURN(c.context_length, PositiveInt(file, p + "context_length"));
  WINNOW_ASSIGN_OR_RETURN(c.head_dim, PositiveInt(file, p + "attention.key_length",
                                                  c.hidden_size / c.num_heads));
  WINNOW_ASSIGN_OR_RETURN(c.rope_dim, PositiveInt(file, p + "rope.dimension_count", c.head_dim));
  double eps, theta;
  WINNOW_ASSIGN_OR_RETURN(eps, FloatOr(file, p + "attention.layer_norm_rms_epsilon", 1e-5));
  WINNOW_ASSIGN_OR_RETURN(theta, FloatOr(file, p + "rope.freq_base", 10000.0));
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);

  WINNOW_ASSIGN_OR_RETURN(const std::vector<std::string> tokens,
                          file.GetStringArray("tokenizer.ggml.tokens"));
  WINNOW_ASSIGN_OR_RETURN(c.vocab_size,
                          PositiveInt(file, p + "vocab_size", static_cast<int32_t>(tokens.size())));

  // Rope scaling: "linear" divides positions by the factor; "yarn" blends interpolated and
  // extrapolated frequencies. Llama-3.1-style scaling arrives as a rope_freqs tensor instead
  // (handled where weights load).
  std::string scaling = file.GetString(p + "rope.scaling.type").value_or("none");
  double factor;
  WINNOW_ASSIGN_OR_RETURN(factor, FloatOr(file, p + "rope.scaling.factor", 0.0));
  if (factor == 0.0) {
    // Older files store only a linear scale.
    WINNOW_ASSIGN_OR_RETURN(factor, FloatOr(file, p + "rope.scale_linear", 0.0));
    if (factor > 0.0 && scaling == "none") scaling = "linear";
  }
  if (scaling == "linear" && factor > 0.0 && factor != 1.0) {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = static_cast<float>(factor);
  } else if (scaling == "yarn" && factor > 1.0) {
    c.rope_scaling.type = RopeScalingType::kYarn;
    c.rope_scaling.factor = static_cast<float>(factor);
    WINNOW_ASSIGN_OR_RETURN(c.rope_scaling.original_context_length,
                            PositiveInt(file, p + "rope.scaling.original_context_length",
                                        c.context_length));
    double beta_fast, beta_slow;
    WINNOW_ASSIGN_OR_RETURN(beta_fast, FloatOr(file, p + "rope.scaling.yarn_beta_fast", 32.0));
    WINNOW_ASSIGN_OR_RETURN(beta_slow, FloatOr(file, p + "rope.scaling.yarn_beta_slow", 1.0));
    c.rope_scaling.yarn_beta_fast = static_cast<float>(beta_fast);
    c.rope_scaling.yarn_beta_slow = static_cast<float>(beta_slow);
  } else if (scaling != "none" && scaling != "linear" && scaling != "yarn") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported rope scaling type '", scaling, "' (", p, "rope.scaling.type)"));
  }

  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention.head_count (", c.num_heads, ") is not a multiple of attention.head_count_kv (",
        c.num_kv_heads, ")"));
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0 || c.rope_dim > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("rope.dimension_count ", c.rope_dim,
                                                   " does not fit head_dim ", c.head_dim));
  }
  return c;
}

}  // namespace winnow::model
