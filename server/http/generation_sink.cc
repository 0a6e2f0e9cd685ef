#include "server/http/generation_sink.h"

#include <utility>

namespace winnow::server::http {

void Wakeup::Notify() {
  base::MutexLock lock(&mu_);
  ++count_;
}

uint64_t Wakeup::count() {
  base::MutexLock lock(&mu_);
  return count_;
}

void Wakeup::Wait(uint64_t seen, absl::Duration timeout) {
  base::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return count_ != seen; },
                       timeout);
}

void GenerationSink::OnTokens(const scheduler::TokenEvent& event) {
  {
    base::MutexLock lock(&mu_);
    pending_.token_ids.insert(pending_.token_ids.end(), event.token_ids.begin(),
                              event.token_ids.end());
    pending_.text += event.text;
    pending_.logprobs.insert(pending_.logprobs.end(), event.logprobs.begin(),
                             event.logprobs.end());
    pending_.prompt_logprobs.insert(pending_.prompt_logprobs.end(),
                                    event.prompt_logprobs.begin(), event.prompt_logprobs.end());
    started_ = true;
  }
  if (wakeup_ != nullptr) wakeup_->Notify();
}

void GenerationSink::OnFinish(const scheduler::FinishEvent& event) {
  {
    base::MutexLock lock(&mu_);
    pending_.finish = event;
    finished_ = true;
    started_ = true;
  }
  if (wakeup_ != nullptr) wakeup_->Notify();
}

GenerationBatch GenerationSink::Take(absl::Duration timeout) {
  base::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !pending_.empty(); };
  if (!finished_) mu_.AwaitWithTimeout(ready, timeout);
  GenerationBatch out = std::move(pending_);
  pending_ = GenerationBatch();
  return out;
}

void GenerationSink::WaitStarted(absl::Duration timeout) {
  base::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return started_; }, timeout);
}

}  // namespace winnow::server::http
