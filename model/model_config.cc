#include "model/model_config.h"

#include <algorithm>
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

// Every `pattern`-th layer attends globally, the others through the window (Gemma 3: 6).
std::vector<bool> SlidingEveryLayerBut(int32_t num_layers, int32_t pattern) {
  std::vector<bool> sliding(num_layers);
  for (int32_t l = 0; l < num_layers; ++l) sliding[l] = (l + 1) % pattern != 0;
  return sliding;
}

// What llama.cpp's gemma3 loader fixes rather than reads: the 5-in-6 sliding pattern, the
// sliding layers' rope base 10000 without scaling, and the query scale (1/sqrt(head_dim), but
// 1/sqrt(hidden/heads) for the 62-layer 27B model, whose query_pre_attn_scalar is that).
absl::Status ReadGemma3Gguf(const GgufFile& file, ModelConfig& c) {
  absl::StatusOr<int64_t> window = file.GetInt("gemma3.attention.sliding_window");
  if (window.ok() && *window > 0) {
    c.sliding_window = static_cast<int32_t>(std::min<int64_t>(*window, int64_t{1} << 30));
    c.sliding_layers = SlidingEveryLayerBut(c.num_layers, 6);
    c.rope_theta_sliding = 10000.0f;
  } else if (!window.ok() && !absl::IsNotFound(window.status())) {
    return window.status();
  }
  c.embedding_scale = std::sqrt(static_cast<float>(c.hidden_size));
  c.post_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;
  const float query_scalar = c.num_layers == 62 ? static_cast<float>(c.hidden_size / c.num_heads)
                                                : static_cast<float>(c.head_dim);
  c.attention_scale = 1.0f / std::sqrt(query_scalar);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& file) {
  ModelConfig c;
  WINNOW_ASSIGN_OR_RETURN(const std::string arch, file.GetString("general.architecture"));
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "gemma3") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported architecture '", arch, "' (general.architecture); winnow runs llama, "
        "qwen2, qwen3 and gemma3 models"));
  }
  c.architecture = arch;
  c.rope_halves = arch != "llama";
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

  if (arch == "gemma3") WINNOW_RETURN_IF_ERROR(ReadGemma3Gguf(file, c));
  WINNOW_RETURN_IF_ERROR(c.Validate());
  return c;
}

float ModelConfig::AttentionScale() const {
  return attention_scale > 0.0f ? attention_scale
                                : 1.0f / std::sqrt(static_cast<float>(head_dim));
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
  if (!sliding_layers.empty() &&
      (static_cast<int32_t>(sliding_layers.size()) != num_layers || sliding_window <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sliding-window layers need a positive window (", sliding_window, ") and one entry per "
        "layer (", sliding_layers.size(), " for ", num_layers, ")"));
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
// `v5_parameters`, when given, replaces config.rope_parameters (Gemma 3's per-layer-type entry),
// named `v5_path` in errors.
absl::Status ReadHfRope(const json& config, ModelConfig& c, const json* v5_parameters = nullptr,
                        const std::string& v5_path = "rope_parameters.") {
  const bool v5 = v5_parameters != nullptr ||
                  (config.contains("rope_parameters") && config["rope_parameters"].is_object());
  const std::string path = v5 ? v5_path : "rope_scaling.";
  const json scaling = v5_parameters != nullptr ? *v5_parameters
                       : v5                     ? config["rope_parameters"]
                       : config.contains("rope_scaling") ? config["rope_scaling"]
                                                         : json();
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

// Gemma 3's text model: GeGLU, post norms, scaled embeddings and queries, no soft-capping, and
// rope per layer type (transformers 5: rope_parameters.{full,sliding}_attention; earlier:
// rope_theta + rope_scaling for the global layers, rope_local_base_freq for the sliding ones).
absl::Status ReadGemma3Hf(const json& config, ModelConfig& c) {
  const std::string act = HfString(config, "hidden_activation",
                                   HfString(config, "hidden_act", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    return HfError("hidden_activation",
                   absl::StrCat("'", act, "' is not supported (gelu_pytorch_tanh)"));
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (config.contains(key) && !config[key].is_null()) {
      return HfError(key, "is not supported (Gemma 3 sets it to null)");
    }
  }
  if (HfBool(config, "use_bidirectional_attention", false)) {
    return HfError("use_bidirectional_attention", "is not supported (causal attention only)");
  }
  double query_scalar;
  WINNOW_ASSIGN_OR_RETURN(query_scalar, HfNumber(config, "query_pre_attn_scalar", 256.0));
  if (query_scalar <= 0) return HfError("query_pre_attn_scalar", "must be positive");
  c.attention_scale = static_cast<float>(1.0 / std::sqrt(query_scalar));
  c.embedding_scale = std::sqrt(static_cast<float>(c.hidden_size));
  c.post_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;

  const json* per_type = config.contains("rope_parameters") ? &config["rope_parameters"] : nullptr;
  if (per_type == nullptr || !per_type->is_object() || !per_type->contains("full_attention")) {
    double local;
    WINNOW_ASSIGN_OR_RETURN(local, HfNumber(config, "rope_local_base_freq", 10000.0));
    c.rope_theta_sliding = static_cast<float>(local);
    return ReadHfRope(config, c);
  }
  const json& global = (*per_type)["full_attention"];
  WINNOW_RETURN_IF_ERROR(ReadHfRope(config, c, &global, "rope_parameters.full_attention."));
  const json sliding = per_type->value("sliding_attention", json::object());
  if (!sliding.is_object() || HfString(sliding, "rope_type", "default") != "default") {
    return HfError("rope_parameters.sliding_attention", "must be a default rope (no scaling)");
  }
  double local;
  WINNOW_ASSIGN_OR_RETURN(local, HfNumber(sliding, "rope_theta", 10000.0,
                                          "rope_parameters.sliding_attention."));
  c.rope_theta_sliding = static_cast<float>(local);
  return absl::OkStatus();
}

// Which layers slide: layer_types where the config lists them (transformers 5 writes it for most
// families); else Gemma 3's sliding_window_pattern, Qwen's use_sliding_window from
// max_window_layers on, and every layer for the others (Mistral). No window, or (but for
// Gemma 3's rope bases) one as long as the context, leaves every layer global.
absl::Status ReadHfSlidingWindow(const json& config, const std::string& type, ModelConfig& c) {
  if (!config.contains("sliding_window") || config["sliding_window"].is_null()) {
    return absl::OkStatus();
  }
  int32_t window;
  WINNOW_ASSIGN_OR_RETURN(window, HfInt(config, "sliding_window"));
  std::vector<bool> sliding(c.num_layers, false);
  const bool qwen = type == "qwen2" || type == "qwen3";
  if (config.contains("layer_types") && config["layer_types"].is_array()) {
    const json& types = config["layer_types"];
    if (static_cast<int32_t>(types.size()) != c.num_layers) {
      return HfError("layer_types", absl::StrCat("has ", types.size(), " entries for ",
                                                 c.num_layers, " layers"));
    }
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string t = types[l].is_string() ? types[l].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention") {
        return HfError(absl::StrCat("layer_types[", l, "]"),
                       absl::StrCat(types[l].dump(),
                                    " is not sliding_attention or full_attention"));
      }
      sliding[l] = t == "sliding_attention";
    }
  } else if (type == "gemma3_text") {
    int32_t pattern;
    WINNOW_ASSIGN_OR_RETURN(pattern, HfInt(config, "sliding_window_pattern", 6));
    sliding = SlidingEveryLayerBut(c.num_layers, pattern);
  } else if (qwen) {
    if (!HfBool(config, "use_sliding_window", false)) return absl::OkStatus();
    int32_t first;
    WINNOW_ASSIGN_OR_RETURN(first, HfInt(config, "max_window_layers", c.num_layers));
    for (int32_t l = first; l < c.num_layers; ++l) sliding[l] = true;
  } else {
    sliding.assign(c.num_layers, true);
  }
  // A window as long as the context changes nothing, unless the sliding layers also rotate
  // with their own base (Gemma 3).
  const bool any = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  if (!any || (window >= c.context_length && c.rope_theta_sliding == 0.0f)) {
    return absl::OkStatus();
  }
  c.sliding_window = window;
  c.sliding_layers = std::move(sliding);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromHfConfig(const json& config) {
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const std::string type = HfString(config, "model_type", "");
  if (type == "gemma3") {
    return HfError("model_type", "'gemma3' is Gemma 3's vision-language checkpoint; winnow serves "
                                 "its text model (model_type gemma3_text)");
  }
  const bool gemma = type == "gemma3_text";
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3" && !gemma) {
    return HfError("model_type", absl::StrCat("'", type, "' is not supported (llama, mistral, "
                                              "qwen2, qwen3, gemma3_text)"));
  }
  if (const std::string act = HfString(config, "hidden_act", "silu"); act != "silu" && !gemma) {
    return HfError("hidden_act", absl::StrCat("'", act, "' is not supported (silu)"));
  }
  ModelConfig c;
  c.architecture = type == "mistral" ? "llama" : gemma ? "gemma3" : type;
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
  WINNOW_RETURN_IF_ERROR(gemma ? ReadGemma3Hf(config, c) : ReadHfRope(config, c));
  WINNOW_RETURN_IF_ERROR(ReadHfSlidingWindow(config, type, c));
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
