// A loaded Llama-family model: its config, its weights as the file holds them, its tokenizer
// and chat template, read-only once loaded. A loader per format builds it (model/gguf_loader.h,
// model/hf_loader.h); the forwards beside it read it: the CPU forward (model/cpu_forward.h)
// and the CUDA forward (model/cuda_model.h). Neither the model nor its loader holds threads,
// activations or K/V: those belong to a forward and to the worker that runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/keep_plan.h"
#include "kernels/cpu/matmul.h"
#include "model/batch.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::model {

// One transformer block's weights: views into the loaded file (any quantisation the CPU
// kernels read), the norms and biases as floats.
struct LayerWeights {
  std::vector<float> attn_norm;
  kernels::WeightMatrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;  // empty unless the model has QKV biases (qwen2)
  std::vector<float> q_norm, k_norm;  // head_dim each; empty unless the model has QK-norm
  std::vector<float> ffn_norm;
  kernels::WeightMatrix w_gate, w_up, w_down;
  // Gemma: the norms of the attention's and the MLP's outputs; empty unless config.post_norms.
  std::vector<float> post_attn_norm, post_ffn_norm;
};

// Sampling defaults the model ships (a Hugging Face directory's generation_config.json): what a
// request that leaves a parameter unset gets, as vLLM and transformers' generate apply them.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
};

struct ModelWeights {
  kernels::WeightMatrix token_embd;
  kernels::WeightMatrix output;  // token_embd when tied
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
  std::vector<float> rope_freq_factors;  // per rotated pair; empty unless the file has them
};

// --cpu-weight-type: the float weight matrices quantised at load for the CPU forward
// (model/weight_quantize.h). The CUDA forward uploads the weights to bf16 as they are stored:
// callers leave `type` unset for it.
struct CpuWeightOptions {
  std::optional<kernels::GgmlType> type;  // unset ("none"): the weights run as stored
  int32_t threads = 0;                    // threads quantising; 0: one per hardware thread
};

class Model {
 public:
  // What a loader hands over. `storage` owns what the weight views point into (the GGUF file's
  // mapping, a safetensors checkpoint's); the model adds the bytes of the weights it
  // quantises at load (CpuWeightOptions).
  struct Parts {
    std::shared_ptr<const void> storage;
    ModelConfig config;
    std::unique_ptr<Tokenizer> tokenizer;
    absl::StatusOr<ChatTemplate> chat_template = absl::UnknownError("not loaded");
    ModelWeights weights;
    GenerationDefaults generation_defaults;
  };

  // Loads and validates a model with the loader for its format: a GGUF file
  // (model/gguf_loader.h) or a Hugging Face directory (model/hf_loader.h). Errors name the key
  // or tensor at fault.
  // `chat_template_path`, when not empty, names a Jinja file that replaces the model's template.
  // `cpu_weights.type`, when set, rewrites the float weight matrices of either format in that
  // type (QuantizeWeights); matrices a GGUF stores quantised stay as they are.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const std::string& chat_template_path = "",
                                                     const CpuWeightOptions& cpu_weights = {});
  explicit Model(Parts parts);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Not every model has a chat template, or one that compiles.
  const absl::StatusOr<ChatTemplate>& chat_template() const { return chat_template_; }
  // How the template writes tool calls (Hermes without a usable template, where no chat with
  // tools renders anyway): what the reply parser and the tool-call grammar must agree on.
  ToolCallSyntax tool_call_syntax() const {
    return chat_template_.ok() ? chat_template_->tool_call_syntax() : ToolCallSyntax::kHermes;
  }
  const ModelWeights& weights() const { return weights_; }
  const GenerationDefaults& generation_defaults() const { return generation_defaults_; }
  // The KV pool geometry this model needs, with rows stored as `dtype`, and with a per-slot
  // logit bias when `logit_bias` (the CPU attention reads one; cache/block_pool.h).
  cache::KvLayout KvLayoutFor(int32_t block_size,
                              kernels::KvDtype dtype = kernels::KvDtype::kF32,
                              bool logit_bias = false) const;
  // The shape the compression policies score in (cache/keep_plan.h), the attention's softmax
  // scale included; `logit_bias` as the pool's.
  cache::policies::ModelDims PolicyDims(int32_t block_size, bool logit_bias = false) const;

  // What every forward (model/cpu_forward.h, model/cuda_model.h) requires of a batch: a pool
  // of this model's geometry, token ids in the vocabulary, embedding rows that match,
  // positions within the context, and reserved KV capacity. Errors name the entry.
  absl::Status ValidateBatch(std::span<const BatchEntry> batch,
                             const cache::BlockPool& pool) const;
  // RoPE's per-pair inverse frequencies (rope_dim / 2, scaling folded in) and attention factor
  // of the global layers, and of `layer` (a sliding layer may rotate with its own base).
  std::span<const float> rope_inv_freq() const { return rope_inv_freq_; }
  float rope_attn_factor() const { return rope_attn_factor_; }
  std::span<const float> rope_inv_freq(int32_t layer) const {
    return config_.IsSliding(layer) && !rope_inv_freq_sliding_.empty() ? rope_inv_freq_sliding_
                                                                       : rope_inv_freq_;
  }
  float rope_attn_factor(int32_t layer) const {
    return config_.IsSliding(layer) && !rope_inv_freq_sliding_.empty() ? 1.0f
                                                                       : rope_attn_factor_;
  }

 private:
  // Parts::storage, then the buffer of the weights quantised at load, if any.
  std::vector<std::shared_ptr<const void>> storage_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  ModelWeights weights_;
  GenerationDefaults generation_defaults_;
  std::vector<float> rope_inv_freq_;
  std::vector<float> rope_inv_freq_sliding_;  // empty unless config.rope_theta_sliding is set
  float rope_attn_factor_ = 1.0f;
};

}  // namespace winnow::model
