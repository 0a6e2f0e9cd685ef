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

// The MLP's gate activation: SwiGLU (Llama, Qwen, Mistral) or GeGLU with GELU's tanh
// approximation (Gemma).
enum class FfnActivation { kSilu, kGeluTanh };

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
  // "llama", "qwen2", "qwen3" or "gemma3" (a Mistral checkpoint is "llama")
  std::string architecture;
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

  // Sliding-window attention: a layer marked in sliding_layers attends to the last
  // `sliding_window` positions only (Mistral: every layer; Gemma 3: five of every six), and
  // rotates with rope_theta_sliding when that is set (Gemma 3's local base, without scaling).
  int32_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // [layer]; empty when no layer slides
  float rope_theta_sliding = 0.0f;

  // Gemma: embeddings scaled by sqrt(hidden_size), a norm after attention and after the MLP
  // (before each residual add), GeGLU, and queries scaled by query_pre_attn_scalar^-1/2.
  float embedding_scale = 1.0f;
  bool post_norms = false;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  float attention_scale = 0.0f;  // 0: 1 / sqrt(head_dim)

  bool IsSliding(int32_t layer) const {
    return !sliding_layers.empty() && sliding_layers[layer];
  }
  // The window of `layer` (0: full attention), what the attention kernels take.
  int32_t WindowOf(int32_t layer) const { return IsSliding(layer) ? sliding_window : 0; }
  float AttentionScale() const;

  // Reads and validates the `<arch>.*` keys; errors name the key.
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& file);
  // A Hugging Face config.json (model_type llama, mistral, qwen2, qwen3 or gemma3_text; rope
  // settings as
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
