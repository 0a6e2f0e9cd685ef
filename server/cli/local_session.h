// Runs one token sequence through a model in-process for `winnow score`, which needs the logits
// of every position (generation goes through scheduler::Engine instead): a pool sized for the
// sequence and chunked prefill.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/cpu/thread_pool.h"
#include "model/cpu_forward.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::cli {

class LocalSession {
 public:
  // A pool large enough for `max_tokens` positions of one sequence, storing K/V as `dtype`,
  // and a CPU forward on threads of its own (`host`).
  static absl::StatusOr<std::unique_ptr<LocalSession>> Create(const model::Model& model,
                                                              const scheduler::WorkerOptions& host,
                                                              int32_t max_tokens,
                                                              kernels::KvDtype dtype,
                                                              int32_t block_size = 16);
  ~LocalSession();

  // Feeds `tokens` in chunks of `chunk_size`; returns one logits row per token, as one flat
  // vector.
  absl::StatusOr<std::vector<float>> Feed(std::span<const int32_t> tokens, int32_t chunk_size);

 private:
  LocalSession(const model::Model& model, const scheduler::WorkerOptions& host,
               std::unique_ptr<cache::BlockPool> pool);

  std::unique_ptr<cache::BlockPool> pool_;
  kernels::ThreadPool threads_;
  model::CpuForward forward_;
  cache::SequenceKv kv_;
  int32_t position_ = 0;
};

}  // namespace winnow::cli
