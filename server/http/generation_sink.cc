#include "server/http/generation_sink.h"

#include <utility>

namespace winnow::server::http {

void GenerationSink::OnTokens(const scheduler::TokenEvent& event) {
  base::MutexLock lock(&mu_);
  pending_.token_ids.insert(pending_.token_ids.end(), event.token_ids.begin(),
                            event.token_ids.end());
  pending_.text += event.text;
  pending_.logprobs.insert(pending_.logprobs.end(), event.logprobs.begin(),
                           event.logprobs.end());
}

void GenerationSink::OnFinish(const scheduler::FinishEvent& event) {
  base::MutexLock lock(&mu_);
  pending_.finish = event;
  finished_ = true;
}

GenerationBatch GenerationSink::Take(absl::Duration timeout) {
  base::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !pending_.empty(); };
  if (!finished_) mu_.AwaitWithTimeout(ready, timeout);
  GenerationBatch out = std::move(pending_);
  pending_ = GenerationBatch();
  return out;
}

}  // namespace winnow::server::http
