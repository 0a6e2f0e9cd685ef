// What a forward takes and gives: a varlen batch of sequences' new tokens (prefill chunks and
// decode tokens mixed) with the compression hooks each sequence asks for, and the logits rows.
// Every forward backend (model/forward_backend.h) has these semantics.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/attention_selector.h"
#include "cache/query_capture.h"
#include "cache/sequence_kv.h"

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
  // Optional: restricts which past slots the new tokens attend to (TokenSelect). The selector
  // is the cache's interface (cache/attention_selector.h); whatever it reads of the keys goes
  // through the scoring backend it was given, which the forward's device implements.
  cache::AttentionSelector* selector = nullptr;
};

struct ForwardOutput {
  int32_t vocab_size = 0;
  // rows x vocab_size floats, entries in batch order: `storage` (the CPU forward) or a buffer of
  // the backend that produced them (the CUDA forward's page-locked copy, which the GPU fills at
  // full PCIe speed), valid until that backend's next forward.
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

}  // namespace winnow::model
