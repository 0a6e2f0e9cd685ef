#include "model/gguf_loader.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"

namespace winnow::model {

using kernels::WeightMatrix;

namespace {

// Looks a tensor up and checks its shape, naming it in errors.
absl::StatusOr<const GgufTensor*> Tensor(const GgufFile& file, const std::string& name,
                                         std::vector<int64_t> dims) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
  if (t->dims != dims) {
    auto fmt = [](const std::vector<int64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? ", " : "", d[i]);
      return s + "]";
    };
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ", fmt(t->dims),
                                                   ", expected ", fmt(dims)));
  }
  if (!kernels::CanDequantize(t->type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has unsupported type ",
        std::string(kernels::TraitsOf(t->type).name)));
  }
  return t;
}

absl::StatusOr<std::vector<float>> Vector(const GgufFile& file, const std::string& name,
                                          int64_t n) {
  WINNOW_ASSIGN_OR_RETURN(const GgufTensor* t, Tensor(file, name, {n}));
  std::vector<float> out(n);
  if (absl::Status s = kernels::DequantizeRow(t->type, t->data, n, out.data()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", s.message()));
  }
  return out;
}

absl::StatusOr<WeightMatrix> Matrix(const GgufFile& file, const std::string& name, int64_t cols,
                                    int64_t rows) {
  WINNOW_ASSIGN_OR_RETURN(const GgufTensor* t, Tensor(file, name, {cols, rows}));
  if (cols % kernels::TraitsOf(t->type).block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": row length ", cols, " is not a multiple of the ",
                     std::string(kernels::TraitsOf(t->type).name), " block size"));
  }
  return t->AsMatrix();
}

// One transformer block's tensors, named and shaped as llama.cpp writes them.
absl::StatusOr<LayerWeights> LoadLayer(const GgufFile& f, const ModelConfig& c, int32_t layer) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const std::string p = absl::StrCat("blk.", layer, ".");
  LayerWeights L;
  WINNOW_ASSIGN_OR_RETURN(L.attn_norm, Vector(f, p + "attn_norm.weight", hidden));
  WINNOW_ASSIGN_OR_RETURN(L.wq, Matrix(f, p + "attn_q.weight", hidden, q_dim));
  WINNOW_ASSIGN_OR_RETURN(L.wk, Matrix(f, p + "attn_k.weight", hidden, kv_dim));
  WINNOW_ASSIGN_OR_RETURN(L.wv, Matrix(f, p + "attn_v.weight", hidden, kv_dim));
  WINNOW_ASSIGN_OR_RETURN(L.wo, Matrix(f, p + "attn_output.weight", q_dim, hidden));
  if (c.qkv_bias) {
    WINNOW_ASSIGN_OR_RETURN(L.bq, Vector(f, p + "attn_q.bias", q_dim));
    WINNOW_ASSIGN_OR_RETURN(L.bk, Vector(f, p + "attn_k.bias", kv_dim));
    WINNOW_ASSIGN_OR_RETURN(L.bv, Vector(f, p + "attn_v.bias", kv_dim));
  }
  if (c.qk_norm) {
    WINNOW_ASSIGN_OR_RETURN(L.q_norm, Vector(f, p + "attn_q_norm.weight", c.head_dim));
    WINNOW_ASSIGN_OR_RETURN(L.k_norm, Vector(f, p + "attn_k_norm.weight", c.head_dim));
  }
  WINNOW_ASSIGN_OR_RETURN(L.ffn_norm, Vector(f, p + "ffn_norm.weight", hidden));
  if (c.post_norms) {  // Gemma; llama.cpp's converter stores its norms' (1 + weight)
    WINNOW_ASSIGN_OR_RETURN(L.post_attn_norm, Vector(f, p + "post_attention_norm.weight", hidden));
    WINNOW_ASSIGN_OR_RETURN(L.post_ffn_norm, Vector(f, p + "post_ffw_norm.weight", hidden));
  }
  WINNOW_ASSIGN_OR_RETURN(L.w_gate, Matrix(f, p + "ffn_gate.weight", hidden, c.ffn_size));
  WINNOW_ASSIGN_OR_RETURN(L.w_up, Matrix(f, p + "ffn_up.weight", hidden, c.ffn_size));
  WINNOW_ASSIGN_OR_RETURN(L.w_down, Matrix(f, p + "ffn_down.weight", c.ffn_size, hidden));
  return L;
}

// Every weight; completes the config with what only the tensors say (tied embeddings, QKV
// biases, QK-norm, Llama-3 rope frequency factors).
absl::StatusOr<ModelWeights> LoadWeights(const GgufFile& f, ModelConfig& c) {
  ModelWeights w;
  const int64_t hidden = c.hidden_size;
  WINNOW_ASSIGN_OR_RETURN(w.token_embd, Matrix(f, "token_embd.weight", hidden, c.vocab_size));
  WINNOW_ASSIGN_OR_RETURN(w.output_norm, Vector(f, "output_norm.weight", hidden));
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  if (c.tied_embeddings) {
    w.output = w.token_embd;
  } else {
    WINNOW_ASSIGN_OR_RETURN(w.output, Matrix(f, "output.weight", hidden, c.vocab_size));
  }
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  w.layers.reserve(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    WINNOW_ASSIGN_OR_RETURN(LayerWeights layer, LoadLayer(f, c, l));
    w.layers.push_back(std::move(layer));
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    WINNOW_ASSIGN_OR_RETURN(w.rope_freq_factors,
                            Vector(f, "rope_freqs.weight", c.rope_dim / 2));
    c.rope_scaling.type = RopeScalingType::kLlama3;
  }
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadGgufModel(const std::string& path,
                                                     const std::string& chat_template_path) {
  Model::Parts parts;
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  const GgufFile& f = *file;
  WINNOW_ASSIGN_OR_RETURN(parts.config, ModelConfig::FromGguf(f));
  WINNOW_ASSIGN_OR_RETURN(parts.tokenizer, Tokenizer::FromGguf(f));
  if (parts.tokenizer->vocab_size() != parts.config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", parts.tokenizer->vocab_size(),
                     " tokens but vocab_size is ", parts.config.vocab_size));
  }
  parts.chat_template = ChatTemplate::FromGguf(f, chat_template_path);
  // The operator's own template must work; a model's may fail (chat is then refused, saying why).
  if (!chat_template_path.empty() && !parts.chat_template.ok()) return parts.chat_template.status();
  WINNOW_ASSIGN_OR_RETURN(parts.weights, LoadWeights(f, parts.config));
  parts.storage = std::shared_ptr<const void>(std::move(file));
  return std::make_unique<Model>(std::move(parts));
}

}  // namespace winnow::model
