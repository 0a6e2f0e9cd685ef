// A loaded Llama-family model (weights, tokenizer, chat template) and its varlen batched
// forward pass over the paged KV cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/attention_selector.h"
#include "cache/block_pool.h"
#include "cache/query_capture.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"
#include "model/chat_template.h"
#include "model/cpu_activations.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::kernels {
struct AttentionSequence;  // kernels/cpu/attention.h
}  // namespace winnow::kernels

namespace winnow::model {

// A token id that means "take this position's input from the embeddings rows".
inline constexpr int32_t kEmbeddingInput = -1;

enum class LogitsMode {
  kNone,  // no logits (an intermediate prefill chunk)
  kLast,  // logits of the last new token only (decode, last prefill chunk)
  kAll,   // logits of every new token (scoring)
};

// Post-RoPE query rows captured during prefill (see cache/query_capture.h).
using QueryCapture = cache::QueryCapture;

// One sequence's share of a batch: `tokens.size()` new tokens at absolute positions
// start_position, start_position + 1, ...  They attend to everything already in `kv` plus the
// earlier new tokens (causal). The caller must have reserved capacity for them in every layer.
struct BatchEntry {
  cache::SequenceKv* kv = nullptr;
  std::span<const int32_t> tokens;
  // Rows of hidden_size floats, one per token whose id is kEmbeddingInput, in order.
  std::span<const float> embeddings;
  int32_t start_position = 0;
  LogitsMode logits = LogitsMode::kLast;
  QueryCapture* capture = nullptr;  // optional
  // Optional, for decode-time policies. Per layer, the new tokens' attention probabilities:
  // (*attention_probs)[layer][(i * num_heads + h) * num_slots + j] for new token i over the
  // layer's slots after the new K/V were written (0 where it did not attend).
  std::vector<std::vector<float>>* attention_probs = nullptr;
  // Optional: restricts which past slots the new tokens attend to (TokenSelect).
  cache::AttentionSelector* selector = nullptr;
};

struct ForwardOutput {
  int32_t vocab_size = 0;
  // rows x vocab_size floats, entries in batch order: `storage` (the CPU forward) or a buffer of
  // the model that produced them (the CUDA forward's page-locked copy, which the GPU fills at
  // full PCIe speed), valid until that model's next forward.
  std::span<const float> logits;
  std::vector<float> storage;
  std::vector<int32_t> first_row;      // per entry: its first logits row, -1 when none
  std::vector<int32_t> num_rows;       // per entry: how many rows
  // Per logits row, log(sum(exp(row))) when the forward computed it (the CUDA forward, where the
  // GPU's pass over the vocabulary is nearly free); empty otherwise.
  std::vector<float> log_norm;

  std::span<const float> Row(int32_t row) const {
    return logits.subspan(int64_t{row} * vocab_size, vocab_size);
  }
};

// The largest batch a forward will be given: `max_rows` new tokens over all entries, of which
// at most `max_logits_rows` ask for logits (the engine: max_batched_tokens and max_seqs). The
// CUDA forward allocates its activations for this up front, so that serving allocates nothing
// and the memory it needs is known before the KV pool is sized.
struct ForwardLimits {
  int64_t max_rows = 0;
  int64_t max_logits_rows = 0;
};

struct ModelOptions {
  int32_t num_threads = 0;  // 0: one per hardware thread
  CpuActivations activations = CpuActivations::kF32;
};

class Model {
 public:
  // Loads and validates the GGUF: architecture, hyper-parameters, every tensor's presence, type
  // and shape, and the tokenizer. Errors name the key or tensor at fault.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Not every model has a recognised chat template.
  const absl::StatusOr<ChatTemplate>& chat_template() const { return chat_template_; }
  const GgufFile& gguf() const { return *file_; }
  // The KV pool geometry this model needs, with rows stored as `dtype`.
  cache::KvLayout KvLayoutFor(int32_t block_size,
                              kernels::KvDtype dtype = kernels::KvDtype::kF32) const;

  // One forward over a varlen batch (prefill chunks and decode tokens mixed). Writes the new
  // tokens' K/V into their sequences' blocks and advances their slot counts. Not thread-safe:
  // one engine thread owns the model.
  absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                       ForwardOutput* out);

  // The forward's worker threads, for engine-thread kernels between forwards (scoring for the
  // compression policies). Not to be used while a Forward runs.
  kernels::ThreadPool& threads() const { return *pool_; }

  // What every forward (this one and the CUDA one, model/cuda_model.h) requires of a batch:
  // a pool of this model's geometry, token ids in the vocabulary, embedding rows that match,
  // positions within the context, and reserved KV capacity. Errors name the entry.
  absl::Status ValidateBatch(std::span<const BatchEntry> batch,
                             const cache::BlockPool& pool) const;
  // RoPE's per-pair inverse frequencies (rope_dim / 2, scaling folded in) and attention factor.
  std::span<const float> rope_inv_freq() const { return rope_inv_freq_; }
  float rope_attn_factor() const { return rope_attn_factor_; }

 private:
  struct Weights;
  struct Scratch;
  struct Pass;
  Model() = default;

  // Forward's stages, in order (they mirror CudaModel's): the batch's rows, the embeddings,
  // then per layer PreAttention, each sequence's AppendKv and AttachAttentionHooks, Attend and
  // PostAttention, then the Logits of the rows that asked for them.
  Pass LayOutRows(std::span<const BatchEntry> batch);
  absl::Status Embed(std::span<const BatchEntry> batch, const Pass& pass);
  absl::Status PreAttention(int32_t layer, const Pass& pass);
  void AppendKv(const BatchEntry& entry, int32_t layer, int32_t first_row,
                cache::BlockPool& pool, kernels::AttentionSequence* attention);
  absl::Status AttachAttentionHooks(const BatchEntry& entry, int32_t layer, int32_t first_row,
                                    const cache::BlockPool& pool,
                                    kernels::AttentionSequence* attention,
                                    std::vector<int32_t>* selected);
  absl::Status Attend(std::span<const BatchEntry> batch, int32_t layer,
                      const cache::BlockPool& pool, const Pass& pass);
  absl::Status PostAttention(int32_t layer, const Pass& pass);
  absl::Status Logits(std::span<const BatchEntry> batch, const Pass& pass, ForwardOutput* out);
  // RMSNorm of every row of the residual stream into the norm scratch.
  void NormRows(const std::vector<float>& weight, int64_t rows);
  void CaptureQueries(std::span<const BatchEntry> batch, std::span<const int32_t> first_row,
                      int32_t layer, const float* q, int64_t q_dim,
                      const cache::BlockPool& pool) const;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_ = absl::UnknownError("not loaded");
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  CpuActivations activations_ = CpuActivations::kF32;
  std::vector<float> rope_inv_freq_;
  float rope_attn_factor_ = 1.0f;
};

}  // namespace winnow::model
