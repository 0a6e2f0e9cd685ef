#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/gguf_loader.h"
#include "model/hf_loader.h"
#include "model/weight_quantize.h"

namespace winnow::model {
namespace {

// Per-pair inverse frequencies with rope scaling folded in, so the kernel only multiplies by the
// position. Mirrors ggml's rope (and transformers' rope_init functions).
std::vector<float> RopeInverseFrequencies(const ModelConfig& c,
                                          const std::vector<float>& freq_factors,
                                          float* attn_factor) {
  const int32_t half = c.rope_dim / 2;
  std::vector<float> inv_freq(half);
  *attn_factor = 1.0f;
  const RopeScaling& rs = c.rope_scaling;
  // YaRN correction range: dims that rotate fewer than beta_fast (more than beta_slow) times
  // over the original context are extrapolated (interpolated).
  auto corr_dim = [&](float rotations) {
    return c.rope_dim *
           std::log(rs.original_context_length / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(static_cast<double>(c.rope_theta)));
  };
  double yarn_low = 0, yarn_high = 0;
  if (rs.type == RopeScalingType::kYarn) {
    yarn_low = std::max(0.0, std::floor(corr_dim(rs.yarn_beta_fast)));
    yarn_high = std::min(c.rope_dim - 1.0, std::ceil(corr_dim(rs.yarn_beta_slow)));
    *attn_factor = static_cast<float>(0.1 * std::log(rs.factor) + 1.0);
  }
  for (int32_t i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim);
    if (!freq_factors.empty()) f /= freq_factors[i];
    switch (rs.type) {
      case RopeScalingType::kNone:
      case RopeScalingType::kLlama3:
        break;
      case RopeScalingType::kLinear:
        f /= rs.factor;
        break;
      case RopeScalingType::kYarn: {
        const double ramp = (i - yarn_low) / std::max(0.001, yarn_high - yarn_low);
        const double extrapolate = 1.0 - std::clamp(ramp, 0.0, 1.0);
        f = f / rs.factor * (1.0 - extrapolate) + f * extrapolate;
        break;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

}  // namespace

Model::Model(Parts parts)
    : storage_{std::move(parts.storage)},
      config_(std::move(parts.config)),
      tokenizer_(std::move(parts.tokenizer)),
      chat_template_(std::move(parts.chat_template)),
      weights_(std::move(parts.weights)),
      generation_defaults_(parts.generation_defaults) {
  rope_inv_freq_ =
      RopeInverseFrequencies(config_, weights_.rope_freq_factors, &rope_attn_factor_);
  if (config_.rope_theta_sliding > 0.0f) {
    // Gemma 3's sliding layers: their own base, no scaling.
    ModelConfig local = config_;
    local.rope_theta = config_.rope_theta_sliding;
    local.rope_scaling = RopeScaling{};
    float unused;
    rope_inv_freq_sliding_ = RopeInverseFrequencies(local, {}, &unused);
  }
}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const std::string& chat_template_path,
                                                   const CpuWeightOptions& cpu_weights) {
  absl::StatusOr<std::unique_ptr<Model>> model =
      std::filesystem::is_directory(path) ? LoadHfModel(path, chat_template_path)
                                          : LoadGgufModel(path, chat_template_path);
  if (!model.ok() || !cpu_weights.type.has_value()) return model;
  // After the loader, whatever the format: the weights are still only views here, and no
  // forward has read them yet.
  WINNOW_ASSIGN_OR_RETURN(
      std::shared_ptr<const void> quantized,
      QuantizeWeights(*cpu_weights.type, cpu_weights.threads, &(*model)->weights_));
  (*model)->storage_.push_back(std::move(quantized));
  return model;
}

cache::KvLayout Model::KvLayoutFor(int32_t block_size, kernels::KvDtype dtype,
                                   bool logit_bias) const {
  return cache::KvLayout{config_.num_layers, config_.num_kv_heads, config_.head_dim, block_size,
                         dtype, logit_bias};
}

cache::policies::ModelDims Model::PolicyDims(int32_t block_size, bool logit_bias) const {
  const ModelConfig& c = config_;
  cache::policies::ModelDims dims{c.num_layers, c.num_heads,  c.num_kv_heads,
                                  c.head_dim,   block_size, c.AttentionScale()};
  dims.logit_bias = logit_bias;
  if (!c.sliding_layers.empty()) {
    for (int32_t l = 0; l < c.num_layers; ++l) dims.windows.push_back(c.WindowOf(l));
  }
  return dims;
}

absl::Status Model::ValidateBatch(std::span<const BatchEntry> batch,
                                  const cache::BlockPool& pool) const {
  const cache::KvLayout& layout = pool.layout();
  if (layout.num_layers != config_.num_layers || layout.num_kv_heads != config_.num_kv_heads ||
      layout.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError("KV pool layout does not match the model");
  }
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& entry = batch[e];
    const int64_t n = static_cast<int64_t>(entry.tokens.size());
    if (entry.kv == nullptr || n == 0) {
      return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, " has no KV or tokens"));
    }
    if (entry.kv->block_size() != layout.block_size ||
        entry.kv->num_layers() != config_.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", e, ": KV cache does not match the pool"));
    }
    if (entry.start_position < 0 || entry.start_position + n > config_.context_length) {
      return absl::OutOfRangeError(absl::StrCat(
          "batch entry ", e, ": positions ", entry.start_position, "..",
          entry.start_position + n - 1, " exceed the context length ", config_.context_length));
    }
    int64_t embedding_rows = 0;
    for (int32_t id : entry.tokens) {
      if (id == kEmbeddingInput) {
        ++embedding_rows;
      } else if (id < 0 || id >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary"));
      }
    }
    if (static_cast<int64_t>(entry.embeddings.size()) != embedding_rows * config_.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch entry ", e, ": ", embedding_rows, " embedding positions need ",
          embedding_rows * config_.hidden_size, " floats, got ", entry.embeddings.size()));
    }
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      if (entry.kv->num_slots(l) + n > entry.kv->capacity(l)) {
        return absl::FailedPreconditionError(
            absl::StrCat("batch entry ", e, ": KV capacity not reserved for ", n, " tokens"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace winnow::model
