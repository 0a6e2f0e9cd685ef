#include "model/cpu_forward.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/ops.h"

namespace winnow::model {

// Activations of one forward, grown to the largest batch seen and reused.
struct CpuForward::Scratch {
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

}  // namespace

CpuForward::CpuForward(const Model& model, kernels::ThreadPool& threads,
                       CpuActivations activations)
    : model_(model),
      threads_(threads),
      activations_(activations),
      scratch_(std::make_unique<Scratch>()) {}

CpuForward::~CpuForward() = default;

cache::ScoringBackend& CpuForward::Scoring(const cache::BlockPool& pool) {
  if (scoring_ == nullptr || &scoring_->pool() != &pool) {
    scoring_ = std::make_unique<cache::HostScoring>(pool, threads_);
  }
  return *scoring_;
}

void CpuForward::CaptureQueries(std::span<const BatchEntry> batch,
                                std::span<const int32_t> first_row, int32_t layer,
                                const float* q, int64_t q_dim, const cache::BlockPool& pool) {
  for (size_t e = 0; e < batch.size(); ++e) {
    QueryCapture* capture = batch[e].capture;
    if (capture == nullptr) continue;
    capture->per_layer.resize(model_.config().num_layers);
    std::vector<float>& rows = capture->per_layer[layer];
    for (size_t i = 0; i < batch[e].tokens.size(); ++i) {
      const int32_t position = batch[e].start_position + static_cast<int32_t>(i);
      if (position < capture->first_position) continue;
      const float* row = q + (first_row[e] + static_cast<int64_t>(i)) * q_dim;
      rows.insert(rows.end(), row, row + q_dim);
      if (layer == 0) capture->positions.push_back(position);
    }
    if (capture->layer_done) capture->layer_done(layer, *batch[e].kv, Scoring(pool));
  }
}

// One forward's row layout and its sequences' attention inputs for the current layer.
struct CpuForward::Pass {
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

absl::Status CpuForward::Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                                 ForwardOutput* out) {
  WINNOW_RETURN_IF_ERROR(model_.ValidateBatch(batch, pool));
  Pass pass = LayOutRows(batch);
  WINNOW_RETURN_IF_ERROR(Embed(batch, pass));
  for (int32_t l = 0; l < model_.config().num_layers; ++l) {
    WINNOW_RETURN_IF_ERROR(PreAttention(l, pass));
    for (size_t e = 0; e < batch.size(); ++e) {
      AppendKv(batch[e], l, pass.first_row[e], pool, &pass.attention[e]);
      WINNOW_RETURN_IF_ERROR(AttachAttentionHooks(batch[e], l, pass.first_row[e],
                                                  &pass.attention[e], &pass.selections[e]));
    }
    WINNOW_RETURN_IF_ERROR(Attend(batch, l, pool, pass));
    WINNOW_RETURN_IF_ERROR(PostAttention(l, pass));
  }
  return Logits(batch, pass, out);
}

CpuForward::Pass CpuForward::LayOutRows(std::span<const BatchEntry> batch) {
  const ModelConfig& c = model_.config();
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
absl::Status CpuForward::Embed(std::span<const BatchEntry> batch, const Pass& pass) {
  const int64_t hidden = model_.config().hidden_size;
  const float scale = model_.config().embedding_scale;
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
        WINNOW_RETURN_IF_ERROR(kernels::GetRow(model_.weights().token_embd, entry.tokens[i], dst));
        // Gemma scales token embeddings (a caller's rows are already in the residual's scale).
        if (scale != 1.0f) {
          for (int64_t j = 0; j < hidden; ++j) dst[j] *= scale;
        }
      }
      s.positions[row] = entry.start_position + static_cast<int32_t>(i);
    }
  }
  return absl::OkStatus();
}

void CpuForward::NormRows(const std::vector<float>& weight, int64_t rows) {
  NormRows(weight, scratch_->x.data(), rows, scratch_->xn.data());
}

void CpuForward::NormRows(const std::vector<float>& weight, const float* x, int64_t rows,
                          float* out) {
  const int64_t hidden = model_.config().hidden_size;
  threads_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::RmsNorm(x + r * hidden, weight.data(), hidden, model_.config().rms_norm_eps,
                       out + r * hidden);
    }
  });
}

// QK-norm: each of `heads` head_dim-long vectors of `x` RMS-normalised in place.
void CpuForward::NormHeads(const std::vector<float>& weight, float* x, int64_t heads) {
  const ModelConfig& c = model_.config();
  threads_.ParallelFor(heads, 64, [&](int64_t b, int64_t e) {
    for (int64_t h = b; h < e; ++h) {
      float* head = x + h * c.head_dim;
      kernels::RmsNorm(head, weight.data(), c.head_dim, c.rms_norm_eps, head);
    }
  });
}

// The attention norm, Q/K/V (with their biases and QK-norm) and RoPE of every row.
absl::Status CpuForward::PreAttention(int32_t layer, const Pass& pass) {
  const ModelConfig& c = model_.config();
  const LayerWeights& L = model_.weights().layers[layer];
  Scratch& s = *scratch_;
  const int64_t rows = pass.rows;
  NormRows(L.attn_norm, rows);
  {
    MatMulInput xn(s.xn.data(), rows, c.hidden_size, activations_, &s.quantized, threads_);
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wq, s.q.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wk, s.k.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.wv, s.v.data()));
  }
  AddBias(s.q, L.bq, rows);
  AddBias(s.k, L.bk, rows);
  AddBias(s.v, L.bv, rows);
  const kernels::RopeLayout rope_layout =
      c.rope_halves ? kernels::RopeLayout::kHalves : kernels::RopeLayout::kAdjacent;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  if (c.qk_norm) {
    NormHeads(L.q_norm, s.q.data(), rows * c.num_heads);
    NormHeads(L.k_norm, s.k.data(), rows * c.num_kv_heads);
  }
  const float* inv_freq = model_.rope_inv_freq(layer).data();
  const float attn_factor = model_.rope_attn_factor(layer);
  threads_.ParallelFor(rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::ApplyRope(s.q.data() + r * q_dim, c.num_heads, c.head_dim, c.rope_dim,
                         s.positions[r], inv_freq, attn_factor, rope_layout);
      kernels::ApplyRope(s.k.data() + r * kv_dim, c.num_kv_heads, c.head_dim, c.rope_dim,
                         s.positions[r], inv_freq, attn_factor, rope_layout);
    }
  });
  return absl::OkStatus();
}

// Stores one sequence's new K/V after its existing slots in `layer` and describes its
// attention over them.
void CpuForward::AppendKv(const BatchEntry& entry, int32_t layer, int32_t first_row,
                          cache::BlockPool& pool, kernels::AttentionSequence* attention) {
  const ModelConfig& c = model_.config();
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
  attention->window = c.WindowOf(layer);
}

// The compression hooks on one sequence's attention in `layer`: its selector's slots (the new
// tokens attend to those past slots only) and the buffer its attention probabilities go to.
absl::Status CpuForward::AttachAttentionHooks(const BatchEntry& entry, int32_t layer,
                                              int32_t first_row,
                                              kernels::AttentionSequence* attention,
                                              std::vector<int32_t>* selected) {
  const ModelConfig& c = model_.config();
  const int32_t n = static_cast<int32_t>(entry.tokens.size());
  if (entry.selector != nullptr) {
    const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
    const int32_t past = entry.kv->num_slots(layer) - n;
    selected->clear();
    const std::span<const float> rows_q(scratch_->q.data() + first_row * q_dim, n * q_dim);
    const bool sparse = entry.selector->Select(layer, rows_q, n, past, *entry.kv, selected);
    WINNOW_RETURN_IF_ERROR(entry.selector->error());
    if (sparse) {
      WINNOW_RETURN_IF_ERROR(cache::CheckSelection(*selected, past, layer));
      attention->selected = selected->data();
      attention->num_selected = static_cast<int32_t>(selected->size());
    }
  }
  FoldCapturedRows(entry, layer, attention);
  if (entry.attention_probs != nullptr) {
    entry.attention_probs->resize(c.num_layers);
    std::vector<float>& probs = (*entry.attention_probs)[layer];
    probs.assign(int64_t{n} * c.num_heads * entry.kv->num_slots(layer), 0.0f);
    attention->probs = probs.data();
  }
  return absl::OkStatus();
}

// Where the sequence's capture wants its rows' probabilities folded (QueryCapture::fold) and
// this attention sees every slot before each row, the attention folds them into the capture's
// `folded` for its layer_done; otherwise that hook asks the scoring backend.
void CpuForward::FoldCapturedRows(const BatchEntry& entry, int32_t layer,
                                  kernels::AttentionSequence* attention) {
  cache::QueryCapture* capture = entry.capture;
  if (capture == nullptr) return;
  capture->folded_layer = -1;
  const bool window_cuts = attention->window > 0 && attention->window < attention->num_slots;
  const bool sees_every_slot = attention->selected == nullptr && !window_cuts;
  if (!capture->fold || !capture->layer_done || !sees_every_slot) return;
  const int32_t n = static_cast<int32_t>(entry.tokens.size());
  capture->folded.resize(int64_t{model_.config().num_heads} * attention->num_slots);
  attention->column_fold = capture->folded.data();
  attention->fold_from = std::clamp(capture->first_position - entry.start_position, 0, n);
  attention->fold_reduce = *capture->fold;
  capture->folded_layer = layer;
}

// The paged attention, query capture (after it, so that a capture's layer_done finds the
// attention's folded rows) and the output projection (Gemma: normalised), added to the
// residual.
absl::Status CpuForward::Attend(std::span<const BatchEntry> batch, int32_t layer,
                                const cache::BlockPool& pool, const Pass& pass) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  kernels::PagedAttention(pool.View(), pass.attention, s.q.data(), c.num_heads,
                          c.AttentionScale(), s.attn.data(), threads_);
  CaptureQueries(batch, pass.first_row, layer, s.q.data(), q_dim, pool);
  const LayerWeights& L = model_.weights().layers[layer];
  MatMulInput attn(s.attn.data(), pass.rows, q_dim, activations_, &s.quantized, threads_);
  WINNOW_RETURN_IF_ERROR(attn.Multiply(L.wo, s.proj.data()));
  if (c.post_norms) NormRows(L.post_attn_norm, s.proj.data(), pass.rows, s.proj.data());
  kernels::AddInPlace(s.x.data(), s.proj.data(), pass.rows * c.hidden_size);
  return absl::OkStatus();
}

// The feed-forward block (SwiGLU, or Gemma's GeGLU and output norm), added to the residual.
absl::Status CpuForward::PostAttention(int32_t layer, const Pass& pass) {
  const ModelConfig& c = model_.config();
  const LayerWeights& L = model_.weights().layers[layer];
  Scratch& s = *scratch_;
  const int64_t rows = pass.rows;
  NormRows(L.ffn_norm, rows);
  {
    MatMulInput xn(s.xn.data(), rows, c.hidden_size, activations_, &s.quantized, threads_);
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.w_gate, s.gate.data()));
    WINNOW_RETURN_IF_ERROR(xn.Multiply(L.w_up, s.up.data()));
  }
  if (c.ffn_activation == FfnActivation::kGeluTanh) {
    kernels::GeluTanhMul(s.gate.data(), s.up.data(), rows * c.ffn_size, s.gate.data());
  } else {
    kernels::SiluMul(s.gate.data(), s.up.data(), rows * c.ffn_size, s.gate.data());
  }
  MatMulInput gate(s.gate.data(), rows, c.ffn_size, activations_, &s.quantized, threads_);
  WINNOW_RETURN_IF_ERROR(gate.Multiply(L.w_down, s.proj.data()));
  if (c.post_norms) NormRows(L.post_ffn_norm, s.proj.data(), rows, s.proj.data());
  kernels::AddInPlace(s.x.data(), s.proj.data(), rows * c.hidden_size);
  return absl::OkStatus();
}

// Final norm and the output head, only for the rows whose logits were asked for.
absl::Status CpuForward::Logits(std::span<const BatchEntry> batch, const Pass& pass,
                                ForwardOutput* out) {
  const ModelConfig& c = model_.config();
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
    kernels::RmsNorm(s.x.data() + source_rows[r] * hidden, model_.weights().output_norm.data(),
                     hidden, c.rms_norm_eps, s.final_rows.data() + r * hidden);
  }
  out->storage.resize(out_rows * c.vocab_size);
  out->logits = out->storage;
  if (out_rows > 0) {
    MatMulInput final_rows(s.final_rows.data(), out_rows, hidden, activations_, &s.quantized,
                           threads_);
    WINNOW_RETURN_IF_ERROR(final_rows.Multiply(model_.weights().output, out->storage.data()));
  }
  return absl::OkStatus();
}

}  // namespace winnow::model
