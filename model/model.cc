#include "model/model.h"

#include <cmath>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/ops.h"

namespace winnow::model {

using kernels::WeightMatrix;

struct LayerWeights {
  std::vector<float> attn_norm;
  WeightMatrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;  // empty unless the model has QKV biases (qwen2)
  std::vector<float> ffn_norm;
  WeightMatrix w_gate, w_up, w_down;
};

struct Model::Weights {
  WeightMatrix token_embd;
  WeightMatrix output;  // token_embd when tied
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
};

// Activations of one forward, grown to the largest batch seen and reused.
struct Model::Scratch {
  std::vector<float> x, xn, q, k, v, attn, proj, gate, up;
  std::vector<float> final_rows;
  std::vector<int32_t> positions;
  kernels::Q8Activations quantized;  // the current matmul input, with 8-bit activations
};

namespace {

// One matmul input (rows x cols floats) for the matrices that read it. With 8-bit activations
// it is quantised on first use, so the matrices sharing it (Q, K and V; gate and up) quantise
// it once; matrices without an integer kernel take the float input.
class MatMulInput {
 public:
  MatMulInput(const float* x, int64_t rows, int64_t cols, CpuActivations activations,
              kernels::Q8Activations* quantized, kernels::ThreadPool& threads)
      : x_(x),
        rows_(rows),
        cols_(cols),
        q8_(activations == CpuActivations::kQ8),
        quantized_(quantized),
        threads_(threads) {}

  // y[rows x w.rows] = x * W^T.
  absl::Status Multiply(const kernels::WeightMatrix& w, float* y) {
    if (!q8_ || !kernels::HasInt8Kernel(w.type)) {
      return kernels::MatMul(w, x_, rows_, y, threads_);
    }
    if (!ready_) {
      WINNOW_RETURN_IF_ERROR(
          kernels::QuantizeActivations(x_, rows_, cols_, quantized_, threads_));
      ready_ = true;
    }
    return kernels::MatMulQ8(w, *quantized_, y, threads_);
  }

 private:
  const float* x_;
  int64_t rows_, cols_;
  bool q8_;
  kernels::Q8Activations* quantized_;
  kernels::ThreadPool& threads_;
  bool ready_ = false;
};

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

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  WINNOW_ASSIGN_OR_RETURN(m->file_, GgufFile::Open(path));
  const GgufFile& f = *m->file_;
  WINNOW_ASSIGN_OR_RETURN(m->config_, ModelConfig::FromGguf(f));
  ModelConfig& c = m->config_;
  WINNOW_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(f));
  if (m->tokenizer_->vocab_size() != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", m->tokenizer_->vocab_size(),
                                                   " tokens but vocab_size is ", c.vocab_size));
  }
  m->chat_template_ = ChatTemplate::FromGguf(f);

  auto w = std::make_unique<Weights>();
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  WINNOW_ASSIGN_OR_RETURN(w->token_embd, Matrix(f, "token_embd.weight", hidden, c.vocab_size));
  WINNOW_ASSIGN_OR_RETURN(w->output_norm, Vector(f, "output_norm.weight", hidden));
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  if (c.tied_embeddings) {
    w->output = w->token_embd;
  } else {
    WINNOW_ASSIGN_OR_RETURN(w->output, Matrix(f, "output.weight", hidden, c.vocab_size));
  }
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  w->layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w->layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
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
    WINNOW_ASSIGN_OR_RETURN(L.ffn_norm, Vector(f, p + "ffn_norm.weight", hidden));
    WINNOW_ASSIGN_OR_RETURN(L.w_gate, Matrix(f, p + "ffn_gate.weight", hidden, c.ffn_size));
    WINNOW_ASSIGN_OR_RETURN(L.w_up, Matrix(f, p + "ffn_up.weight", hidden, c.ffn_size));
    WINNOW_ASSIGN_OR_RETURN(L.w_down, Matrix(f, p + "ffn_down.weight", c.ffn_size, hidden));
  }
  std::vector<float> freq_factors;
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    WINNOW_ASSIGN_OR_RETURN(freq_factors, Vector(f, "rope_freqs.weight", c.rope_dim / 2));
    c.rope_scaling.type = RopeScalingType::kLlama3;
  }
  m->rope_inv_freq_ = RopeInverseFrequencies(c, freq_factors, &m->rope_attn_factor_);
  m->weights_ = std::move(w);
  m->scratch_ = std::make_unique<Scratch>();
  m->pool_ = std::make_unique<kernels::ThreadPool>(options.num_threads);
  m->activations_ = options.activations;
  return m;
}

cache::KvLayout Model::KvLayoutFor(int32_t block_size, kernels::KvDtype dtype) const {
  return cache::KvLayout{config_.num_layers, config_.num_kv_heads, config_.head_dim, block_size,
                         dtype};
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
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary"));
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

void Model::CaptureQueries(std::span<const BatchEntry> batch, std::span<const int32_t> first_row,
                           int32_t layer, const float* q, int64_t q_dim,
                           const cache::BlockPool& pool) const {
  for (size_t e = 0; e < batch.size(); ++e) {
    QueryCapture* capture = batch[e].capture;
    if (capture == nullptr) continue;
    capture->per_layer.resize(config_.num_layers);
    std::vector<float>& rows = capture->per_layer[layer];
    for (size_t i = 0; i < batch[e].tokens.size(); ++i) {
      const int32_t position = batch[e].start_position + static_cast<int32_t>(i);
      if (position < capture->first_position) continue;
      const float* row = q + (first_row[e] + static_cast<int64_t>(i)) * q_dim;
      rows.insert(rows.end(), row, row + q_dim);
      if (layer == 0) capture->positions.push_back(position);
    }
    if (capture->layer_done) capture->layer_done(layer, *batch[e].kv, pool, *pool_);
  }
}

// One forward's row layout and its sequences' attention inputs for the current layer.
struct Model::Pass {
  int64_t rows = 0;                                   // new tokens in the batch
  std::vector<int32_t> first_row;                     // [entry] its first row
  std::vector<kernels::AttentionSequence> attention;  // [entry] this layer's
  std::vector<std::vector<int32_t>> selections;       // [entry] a selector's slots
};

namespace {

// m[r] += bias for every row (QKV biases, qwen2); nothing without a bias.
void AddBias(std::vector<float>& m, const std::vector<float>& bias, int64_t rows) {
  if (bias.empty()) return;
  const int64_t n = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < rows; ++r) kernels::AddInPlace(m.data() + r * n, bias.data(), n);
}

}  // namespace

absl::Status Model::Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                            ForwardOutput* out) {
  WINNOW_RETURN_IF_ERROR(ValidateBatch(batch, pool));
  Pass pass = LayOutRows(batch);
  WINNOW_RETURN_IF_ERROR(Embed(batch, pass));
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    WINNOW_RETURN_IF_ERROR(PreAttention(l, pass));
    for (size_t e = 0; e < batch.size(); ++e) {
      AppendKv(batch[e], l, pass.first_row[e], pool, &pass.attention[e]);
      WINNOW_RETURN_IF_ERROR(AttachAttentionHooks(batch[e], l, pass.first_row[e], pool,
                                                  &pass.attention[e], &pass.selections[e]));
    }
    WINNOW_RETURN_IF_ERROR(Attend(batch, l, pool, pass));
    WINNOW_RETURN_IF_ERROR(PostAttention(l, pass));
  }
  return Logits(batch, pass, out);
}

Model::Pass Model::LayOutRows(std::span<const BatchEntry> batch) {
  const ModelConfig& c = config_;
  Pass pass;
  pass.first_row.resize(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    pass.first_row[e] = static_cast<int32_t>(pass.rows);
    pass.rows += static_cast<int64_t>(batch[e].tokens.size());
  }
  pass.attention.resize(batch.size());
  pass.selections.resize(batch.size());
  const int64_t rows = pass.rows;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  Scratch& s = *scratch_;
  s.x.resize(rows * c.hidden_size);
  s.xn.resize(rows * c.hidden_size);
  s.q.resize(rows * q_dim);
  s.k.resize(rows * kv_dim);
  s.v.resize(rows * kv_dim);
  s.attn.resize(rows * q_dim);
  s.proj.resize(rows * c.hidden_size);
  s.gate.resize(rows * c.ffn_size);
  s.up.resize(rows * c.ffn_size);
  s.positions.resize(rows);
  return pass;
}

// Token embeddings (or the caller's embedding rows) and absolute positions.
absl::Status Model::Embed(std::span<const BatchEntry> batch, const Pass& pass) {
  const int64_t hidden = config_.hidden_size;
  Scratch& s = *scratch_;
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& entry = batch[e];
    int64_t next_embedding = 0;
    for (size_t i = 0; i < entry.tokens.size(); ++i) {
      const int64_t row = pass.first_row[e] + static_cast<int64_t>(i);
      float* dst = s.x.data() + row * hidden;
      if (entry.tokens[i] == kEmbeddingInput) {
        std::memcpy(dst, entry.embeddings.data() + next_embedding++ * hidden,
                    hidden * sizeof(float));
      } else {
        WINNOW_RETURN_IF_ERROR(kernels::GetRow(weights_->token_embd, entry.tokens[i], dst));
      }
      s.positions[row] = entry.start_position + static_cast<int32_t>(i);
    }
  }
  return absl::OkStatus();
}

void Model::NormRows(const std::vector<float>& weight, int64_t rows) {
  const int64_t hidden = config_.hidden_size;
  Scratch& s = *scratch_;
  pool_->ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::RmsNorm(s.x.data() + r * hidden, weight.data(), hidden, config_.rms_norm_eps,
                       s.xn.data() + r * hidden);
    }
  });
}

// The attention norm, Q/K/V (with their biases) and RoPE of every row.
absl::Status Model::PreAttention(int32_t layer, const Pass& pass) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[layer];
  Scratch& s = *scratch_;
  const int64_t rows = pass.rows;
  NormRows(L.attn_norm, rows);
  {
    MatMulInput xn(s.xn.data(), rows, c.hidden_size, activations_, &s.quantized, *pool_);
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wq, s.q.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wk, s.k.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wv, s.v.data()));
  }
  AddBias(s.q, L.bq, rows);
  AddBias(s.k, L.bk, rows);
  AddBias(s.v, L.bv, rows);
  const kernels::RopeLayout rope_layout = c.architecture == "qwen2"
                                              ? kernels::RopeLayout::kHalves
                                              : kernels::RopeLayout::kAdjacent;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  pool_->ParallelFor(rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::ApplyRope(s.q.data() + r * q_dim, c.num_heads, c.head_dim, c.rope_dim,
                         s.positions[r], rope_inv_freq_.data(), rope_attn_factor_, rope_layout);
      kernels::ApplyRope(s.k.data() + r * kv_dim, c.num_kv_heads, c.head_dim, c.rope_dim,
                         s.positions[r], rope_inv_freq_.data(), rope_attn_factor_, rope_layout);
    }
  });
  return absl::OkStatus();
}

// Stores one sequence's new K/V after its existing slots in `layer` and describes its
// attention over them.
void Model::AppendKv(const BatchEntry& entry, int32_t layer, int32_t first_row,
                     cache::BlockPool& pool, kernels::AttentionSequence* attention) {
  const ModelConfig& c = config_;
  const int32_t block_size = pool.layout().block_size;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const Scratch& s = *scratch_;
  const int32_t n = static_cast<int32_t>(entry.tokens.size());
  const int32_t past = entry.kv->num_slots(layer);
  std::span<const int32_t> table = entry.kv->block_table(layer);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t slot = past + i;
    const int32_t block = table[slot / block_size];
    const int32_t in_block = slot % block_size;
    const int64_t row = first_row + i;
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      pool.WriteRow(block, h, in_block, false, s.k.data() + row * kv_dim + h * c.head_dim);
      pool.WriteRow(block, h, in_block, true, s.v.data() + row * kv_dim + h * c.head_dim);
    }
  }
  entry.kv->AppendSlots(layer, n);
  *attention = {table.data(), entry.kv->num_slots(layer), n, first_row};
}

// The compression hooks on one sequence's attention in `layer`: its selector's slots (the new
// tokens attend to those past slots only) and the buffer its attention probabilities go to.
absl::Status Model::AttachAttentionHooks(const BatchEntry& entry, int32_t layer,
                                         int32_t first_row, const cache::BlockPool& pool,
                                         kernels::AttentionSequence* attention,
                                         std::vector<int32_t>* selected) {
  const ModelConfig& c = config_;
  const int32_t n = static_cast<int32_t>(entry.tokens.size());
  if (entry.selector != nullptr) {
    const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
    const int32_t past = entry.kv->num_slots(layer) - n;
    selected->clear();
    const std::span<const float> rows_q(scratch_->q.data() + first_row * q_dim, n * q_dim);
    const bool sparse = entry.selector->Select(layer, rows_q, n, past, *entry.kv, pool, selected);
    WINNOW_RETURN_IF_ERROR(entry.selector->error());
    if (sparse) {
      WINNOW_RETURN_IF_ERROR(cache::CheckSelection(*selected, past, layer));
      attention->selected = selected->data();
      attention->num_selected = static_cast<int32_t>(selected->size());
    }
  }
  if (entry.attention_probs != nullptr) {
    entry.attention_probs->resize(c.num_layers);
    std::vector<float>& probs = (*entry.attention_probs)[layer];
    probs.assign(int64_t{n} * c.num_heads * entry.kv->num_slots(layer), 0.0f);
    attention->probs = probs.data();
  }
  return absl::OkStatus();
}

// Query capture, the paged attention and the output projection, added to the residual.
absl::Status Model::Attend(std::span<const BatchEntry> batch, int32_t layer,
                           const cache::BlockPool& pool, const Pass& pass) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  CaptureQueries(batch, pass.first_row, layer, s.q.data(), q_dim, pool);
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  kernels::PagedAttention(pool.View(), pass.attention, s.q.data(), c.num_heads, attn_scale,
                          s.attn.data(), *pool_);
  MatMulInput attn(s.attn.data(), pass.rows, q_dim, activations_, &s.quantized, *pool_);
  WINNOW_RETURN_IF_ERROR(attn.Multiply(weights_->layers[layer].wo, s.proj.data()));
  kernels::AddInPlace(s.x.data(), s.proj.data(), pass.rows * c.hidden_size);
  return absl::OkStatus();
}

// The feed-forward block (SwiGLU), added to the residual.
absl::Status Model::PostAttention(int32_t layer, const Pass& pass) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[layer];
  Scratch& s = *scratch_;
  const int64_t rows = pass.rows;
  NormRows(L.ffn_norm, rows);
  {
    MatMulInput xn(s.xn.data(), rows, c.hidden_size, activations_, &s.quantized, *pool_);
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.w_gate, s.gate.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.w_up, s.up.data()));
  }
  kernels::SiluMul(s.gate.data(), s.up.data(), rows * c.ffn_size, s.gate.data());
  MatMulInput gate(s.gate.data(), rows, c.ffn_size, activations_, &s.quantized, *pool_);
  WINNOW_RETURN_IF_ERROR(gate.Multiply(L.w_down, s.proj.data()));
  kernels::AddInPlace(s.x.data(), s.proj.data(), rows * c.hidden_size);
  return absl::OkStatus();
}

// Final norm and the output head, only for the rows whose logits were asked for.
absl::Status Model::Logits(std::span<const BatchEntry> batch, const Pass& pass,
                           ForwardOutput* out) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  Scratch& s = *scratch_;
  out->vocab_size = c.vocab_size;
  out->first_row.assign(batch.size(), -1);
  out->num_rows.assign(batch.size(), 0);
  out->log_norm.clear();
  std::vector<int64_t> source_rows;
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t n = static_cast<int64_t>(batch[e].tokens.size());
    if (batch[e].logits == LogitsMode::kNone) continue;
    out->first_row[e] = static_cast<int32_t>(source_rows.size());
    const int64_t from = batch[e].logits == LogitsMode::kAll ? 0 : n - 1;
    for (int64_t i = from; i < n; ++i) source_rows.push_back(pass.first_row[e] + i);
    out->num_rows[e] = static_cast<int32_t>(n - from);
  }
  const int64_t out_rows = static_cast<int64_t>(source_rows.size());
  s.final_rows.resize(out_rows * hidden);
  for (int64_t r = 0; r < out_rows; ++r) {
    kernels::RmsNorm(s.x.data() + source_rows[r] * hidden, weights_->output_norm.data(), hidden,
                     c.rms_norm_eps, s.final_rows.data() + r * hidden);
  }
  out->storage.resize(out_rows * c.vocab_size);
  out->logits = out->storage;
  if (out_rows > 0) {
    MatMulInput final_rows(s.final_rows.data(), out_rows, hidden, activations_, &s.quantized,
                           *pool_);
    WINNOW_RETURN_IF_ERROR(final_rows.Multiply(weights_->output, out->storage.data()));
  }
  return absl::OkStatus();
}

}  // namespace winnow::model
