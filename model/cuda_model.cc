#include "model/cuda_model.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cache/query_capture.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/graph_cache.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_kv.h"
#include "kernels/cuda/scoring.h"
#include "kernels/cuda/sparse_attention.h"
#include "spdlog/spdlog.h"

namespace winnow::model {

namespace kc = kernels::cuda;
using Bf16 = __nv_bfloat16;
template <typename T>
using Buf = kc::DeviceBuffer<T>;

namespace {

// Dequantises a loaded weight's rows (the loader has checked its type and shape) and appends
// them to `out` rounded to bf16, to nearest even as the KV path rounds. BF16 weights (a Hugging
// Face checkpoint's) are copied as they are.
absl::Status AppendBf16(const kernels::WeightMatrix& m, std::vector<Bf16>* out) {
  std::vector<float> row(m.cols);
  const size_t base = out->size();
  out->resize(base + m.rows * m.cols);
  if (m.type == kernels::GgmlType::kBF16 && m.row_bytes == m.cols * int64_t{sizeof(Bf16)}) {
    std::memcpy(out->data() + base, m.data, m.rows * m.row_bytes);
    return absl::OkStatus();
  }
  for (int64_t r = 0; r < m.rows; ++r) {
    WINNOW_RETURN_IF_ERROR(kernels::DequantizeRow(m.type, m.data + r * m.row_bytes, m.cols,
                                                  row.data()));
    kernels::EncodeKv(kernels::KvDtype::kBF16, row.data(), m.cols,
                      reinterpret_cast<std::byte*>(out->data() + base + r * m.cols));
  }
  return absl::OkStatus();
}

// The weights, stacked row-wise (gate | up become one GEMM), as one bf16 device buffer.
absl::StatusOr<Buf<Bf16>> UploadBf16(
    std::initializer_list<std::reference_wrapper<const kernels::WeightMatrix>> weights) {
  std::vector<Bf16> host;
  for (const kernels::WeightMatrix& m : weights) WINNOW_RETURN_IF_ERROR(AppendBf16(m, &host));
  return Buf<Bf16>::FromHost(host);
}

absl::Status CheckOnDeviceSupported(std::span<const BatchEntry> batch) {
  for (size_t e = 0; e < batch.size(); ++e) {
    if (batch[e].selector != nullptr && batch[e].tokens.size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "batch entry ", e, ": attention selection (TokenSelect) runs on the CUDA forward for "
          "one new token (a decode step), not ", batch[e].tokens.size()));
    }
  }
  return absl::OkStatus();
}


}  // namespace

struct DeviceLayer {
  Buf<float> attn_norm, ffn_norm;
  Buf<float> bq, bk, bv;  // empty unless the model has QKV biases (qwen2)
  Buf<float> q_norm, k_norm;  // empty unless the model has QK-norm (qwen3)
  Buf<Bf16> wq, wk, wv, wo;
  Buf<Bf16> w_gate_up;  // [gate | up] rows: one GEMM, then SiluMul reads both halves
  Buf<Bf16> w_down;
};

struct CudaModel::Weights {
  Buf<Bf16> token_embd;
  Buf<Bf16> output;  // empty when tied: the head reads token_embd
  Buf<float> output_norm;
  Buf<float> rope_inv_freq;
  std::vector<DeviceLayer> layers;
  Buf<std::byte> arena;  // the KV pool's data
  kc::DevicePagedKv kv;
  std::unique_ptr<kc::Gemm> gemm;
  std::unique_ptr<kc::PagedAttention> attention;

  const Bf16* head() const { return output.size() > 0 ? output.data() : token_embd.data(); }
};

// Activations and per-iteration inputs, grown to the largest batch seen and reused.
struct CudaModel::Scratch {
  Buf<float> x;  // residual stream, rows x hidden
  Buf<Bf16> xn, q, k, v, attn, proj, gate_up, act, final_rows;
  Buf<int32_t> tokens, embedding_rows, positions, logits_rows;
  Buf<int64_t> slots;  // num_layers x rows slot mappings
  Buf<float> embeddings, logits, log_norm;
  kc::PinnedBuffer<float> logits_host;  // ForwardOutput::logits points here
  // The selected slots of the sequences that attend sparsely (TokenSelect), their rows and
  // page tables (kernels/cuda/sparse_attention.h), packed into one upload.
  Buf<int32_t> sparse_ints;
  // A decode token's attention probabilities (compression policies that evict while decoding):
  // the page tables and lengths, one layer's probabilities, and every layer's host copy, which
  // FinishProbabilities hands out after the forward's last wait.
  Buf<int32_t> probs_ints;
  Buf<float> probs;
  kc::PinnedBuffer<float> probs_host;
  int64_t probs_host_used = 0;
  struct PendingProbs {
    int32_t layer;
    size_t entry;
    int32_t n, slots;
    int64_t host_at;
  };
  std::vector<PendingProbs> pending_probs;
  kc::PinnedStager stager;
  Buf<float> capture_rows;  // captured query rows widened for the host, one entry at a time
  // rows x num_heads: the attention's log-sum-exps (FlashInfer's, base 2), written when a
  // compression hook reads the layer's rows (cache::DeviceRows::lse_log2).
  Buf<float> lse;
};

// What the host works out from the batch before anything runs on the device.
struct CudaModel::HostInputs {
  int64_t rows = 0;
  std::vector<int32_t> first_row;       // per entry
  std::vector<int32_t> tokens;          // per row
  std::vector<int32_t> embedding_rows;  // per row: its row in `embeddings`, or -1
  std::vector<float> embeddings;
  std::vector<int32_t> positions;
  // Per layer and row: block * block_size + slot where the row's K/V goes, computed from the
  // block tables before any slot is appended (as the CPU forward writes them).
  std::vector<int64_t> slots;
  std::vector<int32_t> logits_rows;  // the rows whose logits were asked for, in output order
  // Per entry: its capture's device_plan runs (QueryCapture): it has one and the sequence
  // shares no block, so compacting in place touches no one else's cache.
  std::vector<char> plans_on_device;
};

CudaModel::CudaModel(const Model& model, kernels::ThreadPool& threads, int32_t device)
    : model_(model), threads_(threads), device_(device) {}

CudaModel::~CudaModel() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

namespace {

// Bytes per row of each activation buffer in Scratch, and per logits row.
struct ActivationBytes {
  int64_t per_row = 0;
  int64_t per_logits_row = 0;
};

ActivationBytes ActivationBytesOf(const ModelConfig& c) {
  const int64_t q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  ActivationBytes b;
  b.per_row = 4 * c.hidden_size                                              // x, float32
              + 2 * (2 * c.hidden_size + 2 * q + 2 * kv + 3 * int64_t{c.ffn_size})  // bf16
              + 8 * c.num_layers                                             // slot mappings
              + 4 * 4 + 4 * c.hidden_size   // ids, positions, embedding rows and their floats
              + 4 * int64_t{c.num_heads};   // the attention's log-sum-exps
  // The gathered row (bf16), float32 logits, the row index and the log-normaliser.
  b.per_logits_row = 2 * c.hidden_size + 4 * int64_t{c.vocab_size} + 4 + 4;
  return b;
}

}  // namespace

int64_t CudaModel::DeviceBytesBesidesKv(const Model& model, const ForwardLimits& limits) {
  const ModelConfig& c = model.config();
  const int64_t q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t layer_params =
      c.hidden_size * (2 * q + 2 * kv) + 3 * int64_t{c.hidden_size} * c.ffn_size;
  const int64_t embedding = int64_t{c.vocab_size} * c.hidden_size;
  // bf16 matrices (the head shares the embedding when tied), float32 norms and biases.
  const int64_t matrices = c.num_layers * layer_params + embedding * (c.tied_embeddings ? 1 : 2);
  const int64_t vectors = (2 * int64_t{c.num_layers} + 1) * c.hidden_size +
                          (c.qkv_bias ? c.num_layers * (q + 2 * kv) : 0) +
                          (c.qk_norm ? 2 * int64_t{c.num_layers} * c.head_dim : 0);
  const int64_t weights = 2 * matrices + 4 * vectors;
  const ActivationBytes a = ActivationBytesOf(c);
  const kc::PagedAttentionConfig attention;
  const int64_t workspaces = kc::Gemm::kWorkspaceBytes + attention.float_workspace_bytes +
                             attention.int_workspace_bytes;
  // The driver hands out memory in 2 MiB pages, so each small buffer (a norm's weights, an
  // index array) can cost a page: measured on an H100, a 7-layer model took 81 MiB more than
  // its bytes for its ~80 buffers. Count a page per buffer: weights (8 per layer, 3 more with
  // biases, 2 with QK-norm, 4 besides), the activations (19) and the workspaces (4).
  constexpr int64_t kPage = int64_t{2} << 20;
  const int64_t buffers =
      c.num_layers * (8 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0)) + 4 + 19 + 4;
  return weights + limits.max_rows * a.per_row + limits.max_logits_rows * a.per_logits_row +
         workspaces + buffers * kPage;
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const Model& model,
                                                             const cache::BlockPool& pool,
                                                             kernels::ThreadPool& threads,
                                                             int32_t device,
                                                             const ForwardLimits& limits) {
  const ModelConfig& c = model.config();
  if (c.architecture == "gemma3" || !c.sliding_layers.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA worker does not run ",
        c.architecture == "gemma3" ? "gemma3" : "sliding-window attention",
        " models yet (the CPU worker does: --device cpu)"));
  }
  const cache::KvLayout& layout = pool.layout();
  if (layout.dtype != kernels::KvDtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_dtype ", kernels::KvDtypeName(layout.dtype),
        " is not supported on the CUDA worker: it keeps K/V as bf16, its activation type"));
  }
  int count = 0;
  WINNOW_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device cuda:", device, " is not visible (", count, " CUDA devices)"));
  }
  std::unique_ptr<CudaModel> m(new CudaModel(model, threads, device));
  WINNOW_RETURN_IF_ERROR(m->Init(pool));
  WINNOW_RETURN_IF_ERROR(m->ReserveActivations(limits.max_rows, limits.max_logits_rows));
  return m;
}

absl::Status CudaModel::Init(const cache::BlockPool& pool) {
  WINNOW_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  WINNOW_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream_));
  const ModelConfig& c = model_.config();
  // From the loaded weights, whatever file format they came from.
  const ModelWeights& mw = model_.weights();
  auto w = std::make_unique<Weights>();
  WINNOW_ASSIGN_OR_RETURN(w->token_embd, UploadBf16({mw.token_embd}));
  if (!c.tied_embeddings) {
    WINNOW_ASSIGN_OR_RETURN(w->output, UploadBf16({mw.output}));
  }
  WINNOW_ASSIGN_OR_RETURN(w->output_norm, Buf<float>::FromHost(mw.output_norm));
  WINNOW_ASSIGN_OR_RETURN(w->rope_inv_freq, Buf<float>::FromHost(model_.rope_inv_freq()));
  w->layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    DeviceLayer& L = w->layers[l];
    const LayerWeights& src = mw.layers[l];
    WINNOW_ASSIGN_OR_RETURN(L.attn_norm, Buf<float>::FromHost(src.attn_norm));
    WINNOW_ASSIGN_OR_RETURN(L.ffn_norm, Buf<float>::FromHost(src.ffn_norm));
    WINNOW_ASSIGN_OR_RETURN(L.wq, UploadBf16({src.wq}));
    WINNOW_ASSIGN_OR_RETURN(L.wk, UploadBf16({src.wk}));
    WINNOW_ASSIGN_OR_RETURN(L.wv, UploadBf16({src.wv}));
    WINNOW_ASSIGN_OR_RETURN(L.wo, UploadBf16({src.wo}));
    WINNOW_ASSIGN_OR_RETURN(L.w_gate_up, UploadBf16({src.w_gate, src.w_up}));
    WINNOW_ASSIGN_OR_RETURN(L.w_down, UploadBf16({src.w_down}));
    if (c.qk_norm) {
      WINNOW_ASSIGN_OR_RETURN(L.q_norm, Buf<float>::FromHost(src.q_norm));
      WINNOW_ASSIGN_OR_RETURN(L.k_norm, Buf<float>::FromHost(src.k_norm));
    }
    if (c.qkv_bias) {
      WINNOW_ASSIGN_OR_RETURN(L.bq, Buf<float>::FromHost(src.bq));
      WINNOW_ASSIGN_OR_RETURN(L.bk, Buf<float>::FromHost(src.bk));
      WINNOW_ASSIGN_OR_RETURN(L.bv, Buf<float>::FromHost(src.bv));
    }
    weight_bytes_ += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() +
                     L.w_gate_up.bytes() + L.w_down.bytes();
  }
  weight_bytes_ += w->token_embd.bytes() + w->output.bytes();

  const cache::KvLayout& layout = pool.layout();
  pool_block_size_ = layout.block_size;
  arena_bytes_ = layout.bytes_per_block() * pool.num_blocks();
  WINNOW_ASSIGN_OR_RETURN(w->arena, Buf<std::byte>::Allocate(arena_bytes_));
  WINNOW_CUDA_RETURN_IF_ERROR(cudaMemset(w->arena.data(), 0, arena_bytes_));
  w->kv = kc::DevicePagedKvFor(layout.View(nullptr), w->arena.data());
  WINNOW_RETURN_IF_ERROR(kc::CheckDevicePagedKv(w->kv));
  WINNOW_ASSIGN_OR_RETURN(w->gemm, kc::Gemm::Create());
  kc::PagedAttentionConfig attention;
  attention.num_heads = c.num_heads;
  attention.num_kv_heads = c.num_kv_heads;
  attention.head_dim = c.head_dim;
  attention.block_size = layout.block_size;
  attention.dtype = layout.dtype;
  attention.num_blocks = pool.num_blocks();
  WINNOW_ASSIGN_OR_RETURN(w->attention, kc::PagedAttention::Create(attention));
  kv_device_ = std::make_unique<CudaKvDevice>(w->kv, stream_, threads_);
  weights_ = std::move(w);
  scratch_ = std::make_unique<Scratch>();
  graphs_ = std::make_unique<kc::GraphCache>();
  return absl::OkStatus();
}

namespace {

// Token ids, embedding rows and positions of every row, in batch order.
void GatherTokens(std::span<const BatchEntry> batch, int64_t hidden,
                  std::vector<int32_t>* tokens, std::vector<int32_t>* embedding_rows,
                  std::vector<float>* embeddings, std::vector<int32_t>* positions) {
  for (const BatchEntry& entry : batch) {
    int32_t next_embedding = 0;
    for (size_t i = 0; i < entry.tokens.size(); ++i) {
      tokens->push_back(entry.tokens[i]);
      positions->push_back(entry.start_position + static_cast<int32_t>(i));
      if (entry.tokens[i] != kEmbeddingInput) {
        embedding_rows->push_back(-1);
        continue;
      }
      embedding_rows->push_back(static_cast<int32_t>(embeddings->size() / hidden));
      const float* row = entry.embeddings.data() + int64_t{next_embedding++} * hidden;
      embeddings->insert(embeddings->end(), row, row + hidden);
    }
  }
}

// A decode-only batch: one token per entry, nothing captured, no embedding rows.
bool DecodeOnly(std::span<const BatchEntry> batch) {
  for (const BatchEntry& entry : batch) {
    if (entry.tokens.size() != 1 || entry.capture != nullptr ||
        entry.tokens[0] == kEmbeddingInput) {
      return false;
    }
  }
  return !batch.empty();
}

// Pads per-row inputs of `real` rows to `rows`: token 0 at position 0, and a negative slot so
// that the padding rows' K/V are not written (kernels/cuda/kv_append.h).
void PadRows(int64_t real, int64_t rows, int32_t num_layers, std::vector<int32_t>* tokens,
             std::vector<int32_t>* embedding_rows, std::vector<int32_t>* positions,
             std::vector<int64_t>* slots) {
  tokens->resize(rows, 0);
  embedding_rows->resize(rows, -1);
  positions->resize(rows, 0);
  std::vector<int64_t> padded(rows * num_layers, -1);
  for (int32_t l = 0; l < num_layers; ++l) {
    std::copy_n(slots->begin() + l * real, real, padded.begin() + l * rows);
  }
  *slots = std::move(padded);
}

}  // namespace

absl::Status CudaModel::graph_capture_error() const { return graphs_->capture_error(); }
int64_t CudaModel::cuda_graph_count() const { return graphs_->size(); }

int64_t CudaModel::GraphRows(std::span<const BatchEntry> batch, int64_t rows) const {
  if (!graphs_on_ || rows > kMaxGraphRows || !DecodeOnly(batch)) return 0;
  int64_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  return bucket;
}

namespace {

// HostInputs::plans_on_device.
std::vector<char> PlansOnDevice(std::span<const BatchEntry> batch, const cache::BlockPool& pool) {
  std::vector<char> plans(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    const cache::QueryCapture* capture = batch[e].capture;
    plans[e] = capture != nullptr && capture->device_plan && batch[e].kv->SharedBlocks(pool) == 0;
  }
  return plans;
}

}  // namespace

absl::Status CudaModel::Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                                ForwardOutput* out) {
  WINNOW_RETURN_IF_ERROR(model_.ValidateBatch(batch, pool));
  WINNOW_RETURN_IF_ERROR(CheckOnDeviceSupported(batch));
  if (pool.num_blocks() * pool.layout().bytes_per_block() != arena_bytes_) {
    return absl::InvalidArgumentError("KV pool does not match the CUDA model's device arena");
  }
  const ModelConfig& c = model_.config();
  WINNOW_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));

  HostInputs in;
  in.first_row.resize(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    in.first_row[e] = static_cast<int32_t>(in.rows);
    in.rows += static_cast<int64_t>(batch[e].tokens.size());
  }
  GatherTokens(batch, c.hidden_size, &in.tokens, &in.embedding_rows, &in.embeddings,
               &in.positions);
  in.plans_on_device = PlansOnDevice(batch, pool);
  const int32_t block_size = pool.layout().block_size;
  in.slots.reserve(in.rows * c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (const BatchEntry& entry : batch) {
      std::span<const int32_t> table = entry.kv->block_table(l);
      const int32_t past = entry.kv->num_slots(l);
      for (int32_t i = 0; i < static_cast<int32_t>(entry.tokens.size()); ++i) {
        const int32_t slot = past + i;
        in.slots.push_back(int64_t{table[slot / block_size]} * block_size + slot % block_size);
      }
    }
  }
  out->vocab_size = c.vocab_size;
  out->first_row.assign(batch.size(), -1);
  out->num_rows.assign(batch.size(), 0);
  for (size_t e = 0; e < batch.size(); ++e) {
    const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
    if (batch[e].logits == LogitsMode::kNone) continue;
    out->first_row[e] = static_cast<int32_t>(in.logits_rows.size());
    const int32_t from = batch[e].logits == LogitsMode::kAll ? 0 : n - 1;
    for (int32_t i = from; i < n; ++i) in.logits_rows.push_back(in.first_row[e] + i);
    out->num_rows[e] = n - from;
  }
  out->logits = {};
  out->log_norm.clear();
  if (in.rows == 0) return absl::OkStatus();

  const int64_t graph_rows = GraphRows(batch, in.rows);
  if (graph_rows > 0) {
    PadRows(in.rows, graph_rows, c.num_layers, &in.tokens, &in.embedding_rows, &in.positions,
            &in.slots);
    in.rows = graph_rows;
  }
  absl::Status status = RunAll(batch, in, graph_rows > 0, pool, out);
  // The device plans' kept slots (QueryCapture::device_plan) reach their sessions before the
  // forward returns, whatever happened, so that none is written after its session is gone.
  status.Update(kv_device_->Flush());
  return status;
}

absl::Status CudaModel::RunAll(std::span<const BatchEntry> batch, const HostInputs& in,
                               bool graphs, const cache::BlockPool& pool, ForwardOutput* out) {
  WINNOW_RETURN_IF_ERROR(ReserveProbabilities(batch));
  WINNOW_RETURN_IF_ERROR(Upload(in));
  if (graphs) {
    WINNOW_RETURN_IF_ERROR(RunLayersWithGraphs(batch, in, pool));
  } else {
    WINNOW_RETURN_IF_ERROR(Embed(in.rows));
    for (int32_t l = 0; l < model_.config().num_layers; ++l) {
      WINNOW_RETURN_IF_ERROR(RunLayer(l, batch, in, pool));
    }
  }
  WINNOW_RETURN_IF_ERROR(Logits(in, out));  // waits for the stream
  FinishProbabilities(batch);
  return absl::OkStatus();
}

absl::Status CudaModel::Embed(int64_t rows) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  return kc::EmbeddingGather(weights_->token_embd.data(), c.vocab_size, c.hidden_size,
                             s.tokens.data(), s.embedding_rows.data(), s.embeddings.data(), rows,
                             s.x.data(), stream_);
}

absl::Status CudaModel::RunLayersWithGraphs(std::span<const BatchEntry> batch,
                                            const HostInputs& in, const cache::BlockPool& pool) {
  Scratch& s = *scratch_;
  // The graphs hold these buffers' addresses: when one has grown (a bigger batch), recapture.
  const std::vector<const void*> buffers = {
      s.x.data(),       s.xn.data(),         s.q.data(),    s.k.data(),
      s.v.data(),       s.attn.data(),       s.proj.data(), s.gate_up.data(),
      s.act.data(),     s.tokens.data(),     s.embedding_rows.data(),
      s.embeddings.data(), s.positions.data(), s.slots.data()};
  if (buffers != graph_buffers_) {
    graphs_->Clear();
    graph_buffers_ = buffers;
  }
  const int32_t layers = model_.config().num_layers;
  const bool captured_before = graphs_->capture_error().ok();
  // Segment k is the work between layer k-1's attention and layer k's.
  for (int32_t k = 0; k <= layers; ++k) {
    const int64_t key = in.rows * (layers + 1) + k;
    WINNOW_RETURN_IF_ERROR(graphs_->Run(key, stream_, [&]() -> absl::Status {
      if (k == 0) WINNOW_RETURN_IF_ERROR(Embed(in.rows));
      if (k > 0) WINNOW_RETURN_IF_ERROR(PostAttention(k - 1, in.rows));
      if (k < layers) WINNOW_RETURN_IF_ERROR(PreAttention(k, in.rows));
      return absl::OkStatus();
    }));
    if (k < layers) WINNOW_RETURN_IF_ERROR(Attend(k, batch, in, pool));
  }
  if (captured_before && !graphs_->capture_error().ok()) {
    spdlog::warn("CUDA graphs turned off, decode runs kernel by kernel: {}",
                 graphs_->capture_error().ToString());
  }
  return absl::OkStatus();
}

cache::KvDevice& CudaModel::kv_device() { return *kv_device_; }

cache::ScoringBackend& CudaModel::Scoring(const cache::BlockPool&) { return *kv_device_; }

absl::Status CudaModel::ReserveActivations(int64_t rows, int64_t logits_rows) {
  const ModelConfig& c = model_.config();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  Scratch& s = *scratch_;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.x, rows * c.hidden_size));
  for (Buf<Bf16>* b : {&s.xn, &s.proj}) {
    WINNOW_RETURN_IF_ERROR(kc::Reserve(*b, rows * c.hidden_size));
  }
  for (Buf<Bf16>* b : {&s.q, &s.attn}) WINNOW_RETURN_IF_ERROR(kc::Reserve(*b, rows * q_dim));
  for (Buf<Bf16>* b : {&s.k, &s.v}) WINNOW_RETURN_IF_ERROR(kc::Reserve(*b, rows * kv_dim));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.gate_up, rows * 2 * c.ffn_size));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.act, rows * c.ffn_size));
  for (Buf<int32_t>* b : {&s.tokens, &s.embedding_rows, &s.positions}) {
    WINNOW_RETURN_IF_ERROR(kc::Reserve(*b, rows));
  }
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.slots, rows * c.num_layers));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.embeddings, rows * c.hidden_size));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.lse, rows * c.num_heads));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.logits_rows, logits_rows));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.final_rows, logits_rows * c.hidden_size));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.logits, logits_rows * c.vocab_size));
  if (s.logits_host.size() < logits_rows * c.vocab_size) {
    WINNOW_ASSIGN_OR_RETURN(s.logits_host, kc::PinnedBuffer<float>::Allocate(s.logits.size()));
  }
  return kc::Reserve(s.log_norm, logits_rows);
}

absl::Status CudaModel::Upload(const HostInputs& in) {
  WINNOW_RETURN_IF_ERROR(ReserveActivations(in.rows, static_cast<int64_t>(in.logits_rows.size())));
  Scratch& s = *scratch_;
  WINNOW_RETURN_IF_ERROR(kc::UploadAsync(s.tokens, in.tokens, stream_));
  WINNOW_RETURN_IF_ERROR(kc::UploadAsync(s.embedding_rows, in.embedding_rows, stream_));
  WINNOW_RETURN_IF_ERROR(kc::UploadAsync(s.embeddings, in.embeddings, stream_));
  WINNOW_RETURN_IF_ERROR(kc::UploadAsync(s.positions, in.positions, stream_));
  WINNOW_RETURN_IF_ERROR(kc::UploadAsync(s.slots, in.slots, stream_));
  return kc::UploadAsync(s.logits_rows, in.logits_rows, stream_);
}

absl::Status CudaModel::Linear(const void* w, int64_t n, int64_t k, const void* x, int64_t m,
                               void* y, bool float_output) {
  kc::GemmArgs args;
  args.input = kc::GemmType::kBF16;
  args.output = float_output ? kc::GemmType::kF32 : kc::GemmType::kBF16;
  args.m = m;
  args.n = n;
  args.k = k;
  args.x = x;
  args.w = w;
  args.y = y;
  return weights_->gemm->Run(args, stream_);
}

absl::Status CudaModel::RunLayer(int32_t l, std::span<const BatchEntry> batch,
                                 const HostInputs& in, const cache::BlockPool& pool) {
  WINNOW_RETURN_IF_ERROR(PreAttention(l, in.rows));
  WINNOW_RETURN_IF_ERROR(Attend(l, batch, in, pool));
  return PostAttention(l, in.rows);
}

absl::Status CudaModel::PreAttention(int32_t l, int64_t rows) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& L = weights_->layers[l];
  Scratch& s = *scratch_;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  // The previous layer's MLP output (in proj) joins the residual stream inside the norm.
  WINNOW_RETURN_IF_ERROR(kc::RmsNorm(s.x.data(), l == 0 ? nullptr : s.proj.data(),
                                     L.attn_norm.data(), rows, hidden, c.rms_norm_eps,
                                     s.xn.data(), stream_));
  WINNOW_RETURN_IF_ERROR(Linear(L.wq.data(), q_dim, hidden, s.xn.data(), rows, s.q.data()));
  WINNOW_RETURN_IF_ERROR(Linear(L.wk.data(), kv_dim, hidden, s.xn.data(), rows, s.k.data()));
  WINNOW_RETURN_IF_ERROR(Linear(L.wv.data(), kv_dim, hidden, s.xn.data(), rows, s.v.data()));
  if (c.qkv_bias) {
    WINNOW_RETURN_IF_ERROR(kc::AddBias(s.q.data(), L.bq.data(), rows, q_dim, stream_));
    WINNOW_RETURN_IF_ERROR(kc::AddBias(s.k.data(), L.bk.data(), rows, kv_dim, stream_));
    WINNOW_RETURN_IF_ERROR(kc::AddBias(s.v.data(), L.bv.data(), rows, kv_dim, stream_));
  }
  if (c.qk_norm) {
    WINNOW_RETURN_IF_ERROR(kc::HeadRmsNorm(s.q.data(), L.q_norm.data(), rows * c.num_heads,
                                           c.head_dim, c.rms_norm_eps, stream_));
    WINNOW_RETURN_IF_ERROR(kc::HeadRmsNorm(s.k.data(), L.k_norm.data(), rows * c.num_kv_heads,
                                           c.head_dim, c.rms_norm_eps, stream_));
  }
  const kernels::RopeLayout rope_layout =
      c.rope_halves ? kernels::RopeLayout::kHalves : kernels::RopeLayout::kAdjacent;
  WINNOW_RETURN_IF_ERROR(kc::ApplyRope(
      s.q.data(), q_dim, c.num_heads, s.k.data(), kv_dim, c.num_kv_heads, rows, c.head_dim,
      c.rope_dim, s.positions.data(), weights_->rope_inv_freq.data(), model_.rope_attn_factor(),
      rope_layout, stream_));
  return kc::KvAppend(weights_->kv, s.k.data(), s.v.data(), kv_dim, s.slots.data() + l * rows,
                      rows, stream_);
}

absl::Status CudaModel::Attend(int32_t l, std::span<const BatchEntry> batch,
                               const HostInputs& in, const cache::BlockPool& pool) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  std::vector<kernels::AttentionSequence> seqs(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
    batch[e].kv->AppendSlots(l, n);
    seqs[e] = {batch[e].kv->block_table(l).data(), batch[e].kv->num_slots(l), n,
               in.first_row[e]};
  }
  WINNOW_RETURN_IF_ERROR(CaptureQueries(l, batch, in, pool));
  WINNOW_RETURN_IF_ERROR(AttentionProbabilities(l, batch, in));
  WINNOW_ASSIGN_OR_RETURN(const kc::DeviceSparseDecode sparse, SelectSlots(l, batch, in, pool));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const bool hooks_read_rows = std::any_of(batch.begin(), batch.end(), [](const BatchEntry& e) {
    return e.capture != nullptr && (e.capture->layer_done || e.capture->device_plan);
  });
  WINNOW_RETURN_IF_ERROR(weights_->attention->Run(weights_->arena.data(), seqs, s.q.data(), scale,
                                                  s.attn.data(), stream_,
                                                  hooks_read_rows ? s.lse.data() : nullptr));
  // The sequences that attend to a selection get their rows of attn rewritten: FlashInfer's
  // call needs the batch's rows contiguous, so it runs over all of them first.
  WINNOW_RETURN_IF_ERROR(kc::SparseDecodeAttention(weights_->kv, sparse, s.q.data(), c.num_heads,
                                                   scale, s.attn.data(), stream_));
  return RunCaptureHooks(l, batch, in);
}

absl::Status CudaModel::RunCaptureHooks(int32_t l, std::span<const BatchEntry> batch,
                                        const HostInputs& in) {
  const ModelConfig& c = model_.config();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  for (size_t e = 0; e < batch.size(); ++e) {
    cache::QueryCapture* capture = batch[e].capture;
    if (capture == nullptr) continue;
    const bool plan = in.plans_on_device[e];
    if (!capture->layer_done && !plan) continue;
    const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
    const int32_t first = std::clamp(capture->first_position - batch[e].start_position, 0, n);
    cache::DeviceRows rows;
    if (first < n) {
      const int64_t row = in.first_row[e] + first;
      rows.q = scratch_->q.data() + row * q_dim;
      rows.count = n - first;
      rows.lse_log2 = scratch_->lse.data() + row * c.num_heads;
      rows.row_bytes = q_dim * static_cast<int64_t>(sizeof(Bf16));
      rows.num_heads = c.num_heads;
    }
    capture->device_rows = rows;
    if (capture->layer_done) capture->layer_done(l, *batch[e].kv, *kv_device_);
    if (plan) capture->device_plan(l, *batch[e].kv, *kv_device_);
    capture->device_rows = {};
  }
  return absl::OkStatus();
}

absl::StatusOr<kc::DeviceSparseDecode> CudaModel::SelectSlots(int32_t l,
                                                              std::span<const BatchEntry> batch,
                                                              const HostInputs& in,
                                                              const cache::BlockPool& pool) {
  const ModelConfig& c = model_.config();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  std::vector<size_t> selecting;
  for (size_t e = 0; e < batch.size(); ++e) {
    if (batch[e].selector != nullptr) selecting.push_back(e);
  }
  if (selecting.empty()) return kc::DeviceSparseDecode{};
  // The selectors read their query rows on the host: one download and one wait for all.
  std::vector<Bf16> rows_bf16(selecting.size() * q_dim);
  for (size_t i = 0; i < selecting.size(); ++i) {
    WINNOW_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        rows_bf16.data() + i * q_dim, scratch_->q.data() + in.first_row[selecting[i]] * q_dim,
        q_dim * sizeof(Bf16), cudaMemcpyDeviceToHost, stream_));
  }
  WINNOW_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<float> rows(rows_bf16.size());
  kernels::DecodeKv(kernels::KvDtype::kBF16, reinterpret_cast<const std::byte*>(rows_bf16.data()),
                    static_cast<int64_t>(rows.size()), rows.data());
  // Packed as [rows | table offsets | list offsets | tables | lists].
  std::vector<int32_t> item_rows, table_offsets, list_offsets = {0}, tables, lists;
  std::vector<int32_t> selected;
  for (size_t i = 0; i < selecting.size(); ++i) {
    const BatchEntry& entry = batch[selecting[i]];
    const int32_t slots = entry.kv->num_slots(l);  // its new token's included
    const int32_t past = slots - 1;
    selected.clear();
    const bool sparse = entry.selector->Select(
        l, std::span<const float>(rows).subspan(i * q_dim, q_dim), 1, past, *entry.kv, &selected);
    WINNOW_RETURN_IF_ERROR(entry.selector->error());
    if (!sparse) continue;  // dense: FlashInfer's result stands
    WINNOW_RETURN_IF_ERROR(cache::CheckSelection(selected, past, l));
    item_rows.push_back(in.first_row[selecting[i]]);
    table_offsets.push_back(static_cast<int32_t>(tables.size()));
    const std::span<const int32_t> table = entry.kv->block_table(l);
    tables.insert(tables.end(), table.begin(),
                  table.begin() + (slots + pool_block_size_ - 1) / pool_block_size_);
    lists.insert(lists.end(), selected.begin(), selected.end());
    lists.push_back(past);  // its own slot
    list_offsets.push_back(static_cast<int32_t>(lists.size()));
  }
  const int32_t items = static_cast<int32_t>(item_rows.size());
  if (items == 0) return kc::DeviceSparseDecode{};
  std::vector<int32_t> packed = item_rows;
  for (const std::vector<int32_t>* part : {&table_offsets, &list_offsets, &tables, &lists}) {
    packed.insert(packed.end(), part->begin(), part->end());
  }
  Scratch& s = *scratch_;
  WINNOW_RETURN_IF_ERROR(s.stager.Upload(std::span<const int32_t>(packed), s.sparse_ints,
                                         stream_));
  const int32_t* base = s.sparse_ints.data();
  kc::DeviceSparseDecode sparse;
  sparse.num_items = items;
  sparse.rows = base;
  sparse.table_offsets = base + items;
  sparse.list_offsets = base + 2 * items;
  sparse.tables = base + 3 * items + 1;
  sparse.lists = sparse.tables + tables.size();
  return sparse;
}

absl::Status CudaModel::PostAttention(int32_t l, int64_t rows) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& L = weights_->layers[l];
  Scratch& s = *scratch_;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  WINNOW_RETURN_IF_ERROR(Linear(L.wo.data(), hidden, q_dim, s.attn.data(), rows, s.proj.data()));
  WINNOW_RETURN_IF_ERROR(kc::RmsNorm(s.x.data(), s.proj.data(), L.ffn_norm.data(), rows, hidden,
                                     c.rms_norm_eps, s.xn.data(), stream_));
  WINNOW_RETURN_IF_ERROR(
      Linear(L.w_gate_up.data(), 2 * c.ffn_size, hidden, s.xn.data(), rows, s.gate_up.data()));
  WINNOW_RETURN_IF_ERROR(kc::SiluMul(s.gate_up.data(), s.gate_up.data() + c.ffn_size, rows,
                                     int64_t{c.ffn_size}, 2 * int64_t{c.ffn_size}, s.act.data(),
                                     stream_));
  return Linear(L.w_down.data(), hidden, c.ffn_size, s.act.data(), rows, s.proj.data());
}

absl::Status CudaModel::CaptureQueries(int32_t l, std::span<const BatchEntry> batch,
                                       const HostInputs& in, const cache::BlockPool& pool) {
  const ModelConfig& c = model_.config();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  for (size_t e = 0; e < batch.size(); ++e) {
    cache::QueryCapture* capture = batch[e].capture;
    if (capture == nullptr) continue;
    capture->per_layer.resize(c.num_layers);
    const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
    const int32_t start = batch[e].start_position;
    const int32_t first = std::clamp(capture->first_position - start, 0, n);
    // Model::CaptureQueries's rows (post-RoPE, positions >= first_position), here the bf16
    // values the attention reads, widened to float. A consumer that reads rows on the device
    // (layer_done) gets only those from host_from copied to the host.
    const int32_t to_host =
        in.plans_on_device[e] ? n
        : capture->layer_done ? std::clamp(capture->host_from - start, first, n)
                              : first;
    if (to_host < n) {
      // Widened on the device and downloaded without a wait: the rows are complete when the
      // forward returns (it flushes the KV device's downloads), when AfterPrefillChunk reads
      // them. per_layer[l] grows once per forward, so the destination stays put until then.
      const int64_t count = int64_t{n - to_host} * q_dim;
      WINNOW_RETURN_IF_ERROR(kc::Reserve(scratch_->capture_rows, count));
      WINNOW_RETURN_IF_ERROR(kc::WidenToFloat(
          scratch_->q.data() + (in.first_row[e] + to_host) * q_dim, count,
          scratch_->capture_rows.data(), stream_));
      std::vector<float>& rows = capture->per_layer[l];
      const size_t old = rows.size();
      rows.resize(old + count);
      WINNOW_RETURN_IF_ERROR(
          kv_device_->QueueDownload(scratch_->capture_rows.data(), count, rows.data() + old));
    }
    if (l == 0) {
      for (int32_t i = first; i < n; ++i) capture->positions.push_back(start + i);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModel::ReserveProbabilities(std::span<const BatchEntry> batch) {
  Scratch& s = *scratch_;
  s.pending_probs.clear();
  const ModelConfig& c = model_.config();
  int64_t total = 0;
  for (const BatchEntry& entry : batch) {
    if (entry.attention_probs == nullptr) continue;
    const int64_t n = static_cast<int64_t>(entry.tokens.size());
    for (int32_t l = 0; l < c.num_layers; ++l) {
      total += n * c.num_heads * (entry.kv->num_slots(l) + n);  // before the new slots
    }
  }
  s.probs_host_used = 0;
  if (total == 0 || s.probs_host.size() >= total) return absl::OkStatus();
  WINNOW_ASSIGN_OR_RETURN(s.probs_host, kc::PinnedBuffer<float>::Allocate(2 * total));
  return absl::OkStatus();
}

absl::Status CudaModel::AttentionProbabilities(int32_t l, std::span<const BatchEntry> batch,
                                               const HostInputs& in) {
  const ModelConfig& c = model_.config();
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int32_t block_size = pool_block_size_;
  // Every entry's page table and visible lengths in one upload, every entry's probabilities
  // in one buffer, copied to this layer's part of the page-locked host buffer; nothing waits
  // here (FinishProbabilities, after the forward's last wait, hands them out).
  struct Pending {
    size_t entry;
    int32_t n, slots;
    int64_t table_at, visible_at, probs_at;
  };
  std::vector<Pending> pending;
  std::vector<int32_t> ints;
  int64_t floats = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    if (batch[e].attention_probs == nullptr) continue;
    const int32_t n = static_cast<int32_t>(batch[e].tokens.size());
    const int32_t slots = batch[e].kv->num_slots(l);  // the new tokens' included
    const std::span<const int32_t> table = batch[e].kv->block_table(l);
    Pending p{e, n, slots, static_cast<int64_t>(ints.size()), 0, floats};
    ints.insert(ints.end(), table.begin(), table.begin() + (slots + block_size - 1) / block_size);
    p.visible_at = static_cast<int64_t>(ints.size());
    for (int32_t i = 0; i < n; ++i) ints.push_back(slots - n + i + 1);
    floats += int64_t{n} * c.num_heads * slots;
    pending.push_back(p);
  }
  if (pending.empty()) return absl::OkStatus();
  Scratch& s = *scratch_;
  if (s.probs_host_used + floats > s.probs_host.size()) {
    return absl::InternalError("decode attention probabilities outgrew their host buffer");
  }
  WINNOW_RETURN_IF_ERROR(s.stager.Upload(std::span<const int32_t>(ints), s.probs_ints, stream_));
  // One layer's worth on the device: the next layer's kernels run after this copy.
  WINNOW_RETURN_IF_ERROR(kc::Reserve(s.probs, floats));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (const Pending& p : pending) {
    kc::DeviceScoreInput<Bf16> d{s.probs_ints.data() + p.table_at, p.slots,
                                 s.q.data() + in.first_row[p.entry] * q_dim, p.n,
                                 s.probs_ints.data() + p.visible_at, c.num_heads, scale};
    WINNOW_RETURN_IF_ERROR(kc::AttentionProbabilities(weights_->kv, d, s.probs.data() + p.probs_at,
                                                      nullptr, stream_));
  }
  float* host = s.probs_host.data() + s.probs_host_used;
  WINNOW_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, s.probs.data(), floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  for (const Pending& p : pending) {
    s.pending_probs.push_back({l, p.entry, p.n, p.slots, s.probs_host_used + p.probs_at});
  }
  s.probs_host_used += floats;
  return absl::OkStatus();
}

void CudaModel::FinishProbabilities(std::span<const BatchEntry> batch) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  for (const BatchEntry& entry : batch) {
    if (entry.attention_probs != nullptr) entry.attention_probs->resize(c.num_layers);
  }
  // The kernel's [h][i][j] into the CPU forward's [i][h][j], (layer, entry) pairs in parallel.
  threads_.ParallelFor(
      static_cast<int64_t>(s.pending_probs.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const Scratch::PendingProbs& p = s.pending_probs[k];
          std::vector<float>& probs = (*batch[p.entry].attention_probs)[p.layer];
          probs.resize(int64_t{p.n} * c.num_heads * p.slots);
          const float* by_head = s.probs_host.data() + p.host_at;
          for (int32_t h = 0; h < c.num_heads; ++h) {
            for (int32_t i = 0; i < p.n; ++i) {
              std::copy_n(by_head + (int64_t{h} * p.n + i) * p.slots, p.slots,
                          probs.data() + (int64_t{i} * c.num_heads + h) * p.slots);
            }
          }
        }
      });
  s.pending_probs.clear();
}

absl::Status CudaModel::Logits(const HostInputs& in, ForwardOutput* out) {
  const ModelConfig& c = model_.config();
  Scratch& s = *scratch_;
  const int64_t hidden = c.hidden_size;
  const int64_t out_rows = static_cast<int64_t>(in.logits_rows.size());
  // The last MLP output joins the residual stream in the final norm, over every row (a cheap
  // pass); only the rows whose logits were asked for go through the output head.
  WINNOW_RETURN_IF_ERROR(kc::RmsNorm(s.x.data(), s.proj.data(), weights_->output_norm.data(),
                                     in.rows, hidden, c.rms_norm_eps, s.xn.data(), stream_));
  if (out_rows > 0) {
    WINNOW_RETURN_IF_ERROR(kc::GatherRows(s.xn.data(), in.rows, hidden, s.logits_rows.data(),
                                          out_rows, s.final_rows.data(), stream_));
    WINNOW_RETURN_IF_ERROR(Linear(weights_->head(), c.vocab_size, hidden, s.final_rows.data(),
                                  out_rows, s.logits.data(), /*float_output=*/true));
    WINNOW_RETURN_IF_ERROR(
        kc::LogSumExpRows(s.logits.data(), out_rows, c.vocab_size, s.log_norm.data(), stream_));
    out->log_norm.resize(out_rows);
    WINNOW_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.logits_host.data(), s.logits.data(),
                                                out_rows * c.vocab_size * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
    out->logits = std::span<const float>(s.logits_host.data(), out_rows * c.vocab_size);
    WINNOW_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->log_norm.data(), s.log_norm.data(),
                                                out_rows * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream_));
  } else {
    out->log_norm.clear();
  }
  // Also surfaces an asynchronous error of any kernel of this forward.
  WINNOW_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace winnow::model
