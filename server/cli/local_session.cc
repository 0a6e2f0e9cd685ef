#include "server/cli/local_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace winnow::cli {

absl::StatusOr<std::unique_ptr<LocalSession>> LocalSession::Create(
    const model::Model& model, const scheduler::WorkerOptions& host, int32_t max_tokens,
                                                                   kernels::KvDtype dtype,
                                                                   int32_t block_size) {
  const cache::KvLayout layout = model.KvLayoutFor(block_size, dtype);
  const int32_t blocks = layout.num_layers * ((max_tokens + block_size - 1) / block_size);
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<cache::BlockPool> pool,
                          cache::BlockPool::Create(layout, blocks));
  return std::unique_ptr<LocalSession>(new LocalSession(model, host, std::move(pool)));
}

LocalSession::LocalSession(const model::Model& model, const scheduler::WorkerOptions& host,
                           std::unique_ptr<cache::BlockPool> pool)
    : pool_(std::move(pool)),
      threads_(host.num_threads),
      forward_(model, threads_, host.cpu_activations),
      kv_(model.config().num_layers, pool_->layout().block_size) {}

LocalSession::~LocalSession() { kv_.Release(*pool_); }

absl::StatusOr<std::vector<float>> LocalSession::Feed(std::span<const int32_t> tokens,
                                                      int32_t chunk_size) {
  std::vector<float> logits;
  const int64_t total = static_cast<int64_t>(tokens.size());
  for (int64_t start = 0; start < total; start += chunk_size) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(chunk_size, total - start));
    if (!kv_.Reserve(*pool_, n)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV pool too small for position ", position_ + n));
    }
    model::BatchEntry entry;
    entry.kv = &kv_;
    entry.tokens = tokens.subspan(start, n);
    entry.start_position = position_;
    entry.logits = model::LogitsMode::kAll;
    model::ForwardOutput out;
    WINNOW_RETURN_IF_ERROR(forward_.Forward({&entry, 1}, *pool_, &out));
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    position_ += n;
  }
  return logits;
}

}  // namespace winnow::cli
