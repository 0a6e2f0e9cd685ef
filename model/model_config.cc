#include "model/model_config.h"

#include <cmath>
#include <numbers>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

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

  WINNOW_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::Status ModelConfig::Validate() const {
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the attention head count (", num_heads,
                                                   ") is not a multiple of the KV head count (",
                                                   num_kv_heads, ")"));
  }
  if (rope_dim > head_dim || rope_dim % 2 != 0 || rope_dim > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("the rope dimension count ", rope_dim, " does not fit head_dim ", head_dim));
  }
  return absl::OkStatus();
}

namespace {

using nlohmann::json;

// obj[key] when it is a string (a bool), else `fallback`: json::value would throw on a field of
// the wrong type, and a malformed config must be an error, never a crash.
std::string HfString(const json& obj, const std::string& key, const std::string& fallback) {
  return obj.contains(key) && obj[key].is_string() ? obj[key].get<std::string>() : fallback;
}
bool HfBool(const json& obj, const std::string& key, bool fallback) {
  return obj.contains(key) && obj[key].is_boolean() ? obj[key].get<bool>() : fallback;
}

absl::Status HfError(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, " ", problem));
}

// `obj[key]` as a positive int32; `fallback` when absent or null (none: required).
absl::StatusOr<int32_t> HfInt(const json& obj, const std::string& key,
                              std::optional<int32_t> fallback = std::nullopt,
                              const std::string& path = "") {
  const std::string field = path + key;
  if (!obj.contains(key) || obj[key].is_null()) {
    if (fallback.has_value()) return *fallback;
    return HfError(field, "is missing");
  }
  const json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 30)) {
    return HfError(field, absl::StrCat("must be a positive integer, got ", v.dump()));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

absl::StatusOr<double> HfNumber(const json& obj, const std::string& key, double fallback,
                                const std::string& path = "") {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  if (!obj[key].is_number()) {
    return HfError(path + key, absl::StrCat("must be a number, got ", obj[key].dump()));
  }
  return obj[key].get<double>();
}

// rope_parameters (transformers 5) or rope_theta + rope_scaling (earlier) into the config.
absl::Status ReadHfRope(const json& config, ModelConfig& c) {
  const bool v5 = config.contains("rope_parameters") && config["rope_parameters"].is_object();
  const std::string path = v5 ? "rope_parameters." : "rope_scaling.";
  const json scaling = v5 ? config["rope_parameters"]
                          : config.contains("rope_scaling") ? config["rope_scaling"] : json();
  double theta;
  WINNOW_ASSIGN_OR_RETURN(theta, HfNumber(config, "rope_theta", 10000.0));
  if (v5) {
    WINNOW_ASSIGN_OR_RETURN(theta, HfNumber(scaling, "rope_theta", theta, path));
  }
  c.rope_theta = static_cast<float>(theta);
  if (scaling.is_null()) return absl::OkStatus();
  if (!scaling.is_object()) return HfError("rope_scaling", "must be an object or null");
  const std::string type =
      HfString(scaling, "rope_type", HfString(scaling, "type", "default"));
  double factor;
  WINNOW_ASSIGN_OR_RETURN(factor, HfNumber(scaling, "factor", 1.0, path));
  RopeScaling& rs = c.rope_scaling;
  rs.factor = static_cast<float>(factor);
  if (type == "default") {
    rs.factor = 1.0f;
  } else if (type == "linear") {
    rs.type = RopeScalingType::kLinear;
  } else if (type == "llama3" || type == "yarn") {
    rs.type = type == "llama3" ? RopeScalingType::kLlama3 : RopeScalingType::kYarn;
    WINNOW_ASSIGN_OR_RETURN(rs.original_context_length,
                            HfInt(scaling, "original_max_position_embeddings",
                                  c.context_length, path));
    double low, high, fast, slow;
    WINNOW_ASSIGN_OR_RETURN(low, HfNumber(scaling, "low_freq_factor", 1.0, path));
    WINNOW_ASSIGN_OR_RETURN(high, HfNumber(scaling, "high_freq_factor", 4.0, path));
    WINNOW_ASSIGN_OR_RETURN(fast, HfNumber(scaling, "beta_fast", 32.0, path));
    WINNOW_ASSIGN_OR_RETURN(slow, HfNumber(scaling, "beta_slow", 1.0, path));
    rs.low_freq_factor = static_cast<float>(low);
    rs.high_freq_factor = static_cast<float>(high);
    rs.yarn_beta_fast = static_cast<float>(fast);
    rs.yarn_beta_slow = static_cast<float>(slow);
  } else {
    return HfError(path + "rope_type",
                   absl::StrCat("'", type, "' is not supported (default, linear, llama3, yarn)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromHfConfig(const json& config) {
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const std::string type = HfString(config, "model_type", "");
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3") {
    return HfError("model_type", absl::StrCat("'", type, "' is not supported (llama, mistral, "
                                              "qwen2, qwen3)"));
  }
  if (const std::string act = HfString(config, "hidden_act", "silu"); act != "silu") {
    return HfError("hidden_act", absl::StrCat("'", act, "' is not supported (silu)"));
  }
  ModelConfig c;
  c.architecture = type == "mistral" ? "llama" : type;
  // transformers' rotate_half pairs dimension i with i + d/2 in every family.
  c.rope_halves = true;
  WINNOW_ASSIGN_OR_RETURN(c.num_layers, HfInt(config, "num_hidden_layers"));
  WINNOW_ASSIGN_OR_RETURN(c.hidden_size, HfInt(config, "hidden_size"));
  WINNOW_ASSIGN_OR_RETURN(c.ffn_size, HfInt(config, "intermediate_size"));
  WINNOW_ASSIGN_OR_RETURN(c.num_heads, HfInt(config, "num_attention_heads"));
  WINNOW_ASSIGN_OR_RETURN(c.num_kv_heads, HfInt(config, "num_key_value_heads", c.num_heads));
  WINNOW_ASSIGN_OR_RETURN(c.head_dim, HfInt(config, "head_dim", c.hidden_size / c.num_heads));
  WINNOW_ASSIGN_OR_RETURN(c.context_length, HfInt(config, "max_position_embeddings"));
  WINNOW_ASSIGN_OR_RETURN(c.vocab_size, HfInt(config, "vocab_size"));
  double eps, rotary;
  WINNOW_ASSIGN_OR_RETURN(eps, HfNumber(config, "rms_norm_eps", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  WINNOW_ASSIGN_OR_RETURN(rotary, HfNumber(config, "partial_rotary_factor", 1.0));
  c.rope_dim = static_cast<int32_t>(c.head_dim * rotary);
  WINNOW_RETURN_IF_ERROR(ReadHfRope(config, c));
  // Qwen's configs carry a sliding_window that only use_sliding_window turns on.
  const bool windowed = (type != "qwen2" && type != "qwen3") ||
                        HfBool(config, "use_sliding_window", false);
  if (windowed && config.contains("sliding_window") && config["sliding_window"].is_number() &&
      config["sliding_window"].get<int64_t>() < c.context_length) {
    return HfError("sliding_window",
                   absl::StrCat(config["sliding_window"].dump(),
                                " is shorter than max_position_embeddings ", c.context_length,
                                ": sliding-window attention is not supported"));
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", s.message()));
  }
  return c;
}

std::vector<float> RopeFrequencyFactors(const ModelConfig& c) {
  // Llama 3.1: wavelengths longer than the original context / low_freq_factor are scaled by
  // `factor`, shorter than context / high_freq_factor kept, and those between blended.
  const RopeScaling& rs = c.rope_scaling;
  const double low_wavelen = rs.original_context_length / rs.low_freq_factor;
  const double high_wavelen = rs.original_context_length / rs.high_freq_factor;
  std::vector<float> factors(c.rope_dim / 2);
  for (int32_t i = 0; i < c.rope_dim / 2; ++i) {
    const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double factor = 1.0;
    if (wavelen > low_wavelen) {
      factor = rs.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (rs.original_context_length / wavelen - rs.low_freq_factor) /
                            (rs.high_freq_factor - rs.low_freq_factor);
      factor = 1.0 / ((1.0 - smooth) / rs.factor + smooth);
    }
    factors[i] = static_cast<float>(factor);
  }
  return factors;
}

}  // namespace winnow::model
