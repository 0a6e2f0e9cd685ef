// Hyper-parameters of a Llama-family model, read from GGUF metadata or a Hugging Face
// config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "nlohmann/json_fwd.hpp"

namespace winnow::model {

enum class RopeScalingType { kNone, kLinear, kYarn, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  int32_t original_context_length = 0;
  // Llama-3.1 style frequency-dependent scaling.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // YaRN.
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float yarn_attn_factor = 1.0f;
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2" or "qwen3" (a Mistral checkpoint is "llama")
  std::string name;
  int32_t num_layers = 0;
  int32_t hidden_size = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t ffn_size = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int32_t rope_dim = 0;  // leading dims of each head that RoPE rotates
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;      // Q and K RMS-normalised per head before RoPE (qwen3)
  // RoPE pairs dimension i with i + rope_dim/2 (GGUF qwen2 and qwen3, every Hugging Face
  // checkpoint); else adjacent dimensions (GGUF llama, whose converter permutes Q and K).
  bool rope_halves = false;

  // Reads and validates the `<arch>.*` keys; errors name the key.
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& file);
  // A Hugging Face config.json (model_type llama, mistral, qwen2 or qwen3; rope settings as
  // rope_parameters or the older rope_theta + rope_scaling). Errors say "config.json: <field>".
  // What only the weights say (tied embeddings, QKV biases, QK-norm) the loader completes;
  // Llama-3 rope scaling leaves its frequency factors to RopeFrequencyFactors.
  static absl::StatusOr<ModelConfig> FromHfConfig(const nlohmann::json& config);

  // The checks every source's values must pass (head counts, rope dimensions).
  absl::Status Validate() const;
};

// Llama 3.1's per-pair rope frequency divisors (what a GGUF stores as rope_freqs.weight), from
// the config's rope_scaling; rope_dim / 2 of them.
std::vector<float> RopeFrequencyFactors(const ModelConfig& c);

}  // namespace winnow::model
