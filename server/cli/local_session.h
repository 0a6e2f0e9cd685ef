// Runs one sequence through a model in-process, for the CLI commands (generate, score): a pool
// sized for the sequence, chunked prefill and decode steps. The daemon uses the scheduler
// instead; this is the smallest correct driver of Model::Forward.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "model/model.h"

namespace winnow::cli {

class LocalSession {
 public:
  // A pool large enough for `max_tokens` positions of one sequence.
  static absl::StatusOr<std::unique_ptr<LocalSession>> Create(model::Model& model,
                                                              int32_t max_tokens,
                                                              int32_t block_size = 16);
  ~LocalSession();

  // Feeds `tokens` in chunks of `chunk_size`; returns the logits rows the mode asks for (kAll:
  // one row per token; kLast: the last token's row) as one flat vector.
  absl::StatusOr<std::vector<float>> Feed(std::span<const int32_t> tokens, int32_t chunk_size,
                                          model::LogitsMode mode);
  int32_t position() const { return position_; }

 private:
  LocalSession(model::Model& model, std::unique_ptr<cache::BlockPool> pool);

  model::Model& model_;
  std::unique_ptr<cache::BlockPool> pool_;
  cache::SequenceKv kv_;
  int32_t position_ = 0;
};

}  // namespace winnow::cli
