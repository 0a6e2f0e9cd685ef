// The engine's sink for one HTTP generation. The engine thread must never block, and an HTTP
// handler thread blocks on its connection, so events go into a buffer that the handler drains
// with Take(): tokens that arrive while the handler is writing coalesce into one batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/mutex.h"
#include "scheduler/request.h"

namespace winnow::server::http {

struct GenerationBatch {
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<scheduler::TokenLogprob> logprobs;
  std::vector<scheduler::TokenLogprob> prompt_logprobs;  // in the first batch, when asked
  std::optional<scheduler::FinishEvent> finish;  // set once, on the last batch

  bool empty() const { return token_ids.empty() && text.empty() && !finish.has_value(); }
};

// Wakes a handler that pumps several sinks (the choices of one request) when any of them gets
// an event: each sink notifies it after buffering.
class Wakeup {
 public:
  void Notify();
  uint64_t count();
  // Waits until the count is no longer `seen`, or `timeout`.
  void Wait(uint64_t seen, absl::Duration timeout);

 private:
  base::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

class GenerationSink final : public scheduler::RequestSink {
 public:
  explicit GenerationSink(std::shared_ptr<Wakeup> wakeup = nullptr)
      : wakeup_(std::move(wakeup)) {}

  // Engine thread.
  void OnTokens(const scheduler::TokenEvent& event) override;
  void OnFinish(const scheduler::FinishEvent& event) override;

  // Waits up to `timeout` for something new and returns everything that arrived since the last
  // call (empty on timeout). After the batch holding `finish`, every call returns at once.
  GenerationBatch Take(absl::Duration timeout);
  // Waits up to `timeout` until the request has produced anything (its first token, or its
  // end), without taking it: its prompt's prefill is then done.
  void WaitStarted(absl::Duration timeout);

 private:
  std::shared_ptr<Wakeup> wakeup_;
  base::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  GenerationBatch pending_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace winnow::server::http
