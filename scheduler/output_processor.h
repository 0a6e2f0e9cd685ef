// The output processor turns a sequence's sampled tokens into its client's stream: it appends
// the token, detokenizes, applies stop strings, stop ids, end-of-generation and length limits,
// attaches logprobs, and delivers events to the request's sink; at finish it assembles usage
// and reports the request to the observer. It neither schedules nor computes.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/engine_observer.h"
#include "scheduler/request.h"
#include "scheduler/sequence.h"

namespace winnow::scheduler {

class OutputProcessor {
 public:
  // The tokenizer (and observer, which may be null) must outlive the processor.
  OutputProcessor(const model::Tokenizer& tokenizer, int32_t context_length,
                  EngineObserver* observer)
      : tokenizer_(tokenizer), context_length_(context_length), observer_(observer) {}

  // Appends a sampled token to `seq`, streams what it completes, and returns why the request
  // ends with this token, if it does (the caller then finishes it).
  std::optional<FinishReason> OnToken(Sequence& seq, const model::SampledToken& token,
                                      absl::Time now);

  // The finish event as of now; call while the sequence still holds its blocks, so usage
  // shows what it held at the end.
  FinishEvent MakeFinishEvent(const Sequence& seq, FinishReason reason,
                              absl::Status status) const;
  // Delivers the finish event (the sink is dropped right after) and reports the request.
  void DeliverFinish(Sequence& seq, const FinishEvent& event, absl::Time now);

 private:
  void ObserveToken(Sequence& seq, absl::Time now);
  // Text this token completes, and whether a stop string matched in it.
  std::string AppendText(Sequence& seq, int32_t id, bool* matched);

  const model::Tokenizer& tokenizer_;
  int32_t context_length_;
  EngineObserver* observer_;
};

}  // namespace winnow::scheduler
