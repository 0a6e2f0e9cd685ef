// The engine's sink for one HTTP generation. The engine thread must never block, and an HTTP
// handler thread blocks on its connection, so events go into a buffer that the handler drains
// with Take(): tokens that arrive while the handler is writing coalesce into one batch.
#pragma once

#include <cstdint>
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
  std::optional<scheduler::FinishEvent> finish;  // set once, on the last batch

  bool empty() const { return token_ids.empty() && text.empty() && !finish.has_value(); }
};

class GenerationSink final : public scheduler::RequestSink {
 public:
  // Engine thread.
  void OnTokens(const scheduler::TokenEvent& event) override;
  void OnFinish(const scheduler::FinishEvent& event) override;

  // Waits up to `timeout` for something new and returns everything that arrived since the last
  // call (empty on timeout). After the batch holding `finish`, every call returns at once.
  GenerationBatch Take(absl::Duration timeout);

 private:
  base::Mutex mu_;
  GenerationBatch pending_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace winnow::server::http
