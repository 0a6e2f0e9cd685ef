#include "scheduler/output_processor.h"

#include <algorithm>
#include <utility>

namespace winnow::scheduler {

std::optional<FinishReason> OutputProcessor::OnToken(Sequence& seq,
                                                     const model::SampledToken& token,
                                                     absl::Time now) {
  seq.tokens.push_back(token.id);
  ++seq.num_generated;
  ObserveToken(seq, now);

  TokenEvent event;
  if (seq.num_generated == 1 && seq.req.prompt_logprobs >= 0) {
    event.prompt_logprobs = std::move(seq.prompt_logprobs);
  }
  event.token_ids.push_back(token.id);
  if (seq.req.logprobs) event.logprobs.push_back({token.id, token.logprob, token.top_logprobs});

  const bool eog = !seq.req.ignore_eos && tokenizer_.IsEndOfGeneration(token.id);
  const std::vector<int32_t>& stop_ids = seq.req.stop_token_ids;
  const bool stop_id = std::find(stop_ids.begin(), stop_ids.end(), token.id) != stop_ids.end();
  bool matched = false;
  // An end-of-generation token ends the text; it is reported as a token but not rendered.
  if (!eog) event.text = AppendText(seq, token.id, &matched);

  std::optional<FinishReason> reason;
  if (matched || eog || stop_id) {
    reason = FinishReason::kStop;
  } else if (seq.num_generated >= seq.req.max_tokens || seq.num_tokens() >= context_length_) {
    reason = FinishReason::kLength;
  }
  if (reason.has_value() && !matched && seq.output != nullptr) {
    // Bytes the detokenizer held for an incomplete character may still complete a stop string.
    event.text += seq.output->stops.Append(seq.output->detok.Flush(), &matched);
    if (matched) {
      reason = FinishReason::kStop;
    } else {
      event.text += seq.output->stops.Flush();
    }
  }
  if (seq.output != nullptr) seq.output->sink->OnTokens(event);
  return reason;
}

void OutputProcessor::ObserveToken(Sequence& seq, absl::Time now) {
  if (observer_ != nullptr) {
    if (!seq.has_first_token) {
      observer_->OnFirstToken(seq.id, now - seq.submit_time);
    } else {
      observer_->OnToken(seq.id, now - seq.last_token_time);
    }
  }
  if (!seq.has_first_token) {
    seq.has_first_token = true;
    seq.first_token_time = now;
  }
  seq.last_token_time = now;
}

std::string OutputProcessor::AppendText(Sequence& seq, int32_t id, bool* matched) {
  if (seq.output == nullptr || id < 0 || id >= tokenizer_.vocab_size()) return "";
  return seq.output->stops.Append(seq.output->detok.Append(id), matched);
}

FinishEvent OutputProcessor::MakeFinishEvent(const Sequence& seq, FinishReason reason,
                                             absl::Status status) const {
  FinishEvent event;
  event.reason = reason;
  event.status = std::move(status);
  Usage& u = event.usage;
  u.prompt_tokens = seq.prompt_len;
  u.cached_prompt_tokens = seq.cached_prompt_tokens;
  u.completion_tokens = seq.num_generated;
  u.kv_blocks_at_finish = seq.kv.num_blocks_held();
  u.kv_blocks_peak = std::max(seq.kv_blocks_peak, u.kv_blocks_at_finish);
  u.kv_tokens_per_layer.resize(seq.kv.num_layers());
  for (int32_t l = 0; l < seq.kv.num_layers(); ++l) u.kv_tokens_per_layer[l] = seq.kv.num_slots(l);
  u.preemptions = seq.preemptions;
  u.kv_blocks_freed_by_compression = seq.compression_blocks_freed;
  u.kv_tokens_evicted = seq.compression_slots_evicted;
  if (seq.compression != nullptr) {
    u.kv_blocks_freed_by_compression += seq.compression->stats().blocks_freed;
    u.kv_tokens_evicted += seq.compression->stats().slots_evicted;
  }
  u.kv_tokens_kept_per_layer = seq.compression_kept_per_layer;
  return event;
}

void OutputProcessor::DeliverFinish(Sequence& seq, const FinishEvent& event, absl::Time now) {
  if (seq.output != nullptr) {
    seq.output->sink->OnFinish(event);
    seq.output->sink.reset();
  }
  if (observer_ == nullptr) return;
  RequestStats stats;
  stats.id = seq.id;
  stats.request_id = seq.req.request_id;
  stats.reason = event.reason;
  stats.status = event.status;
  stats.prompt_tokens = event.usage.prompt_tokens;
  stats.completion_tokens = event.usage.completion_tokens;
  stats.preemptions = event.usage.preemptions;
  stats.kv_blocks_peak = event.usage.kv_blocks_peak;
  stats.compression_policy = seq.req.compression.enabled() ? seq.req.compression.policy : "";
  stats.kv_blocks_freed_by_compression = event.usage.kv_blocks_freed_by_compression;
  stats.started = seq.started;
  stats.has_first_token = seq.has_first_token;
  if (seq.started) stats.queue_time = seq.start_time - seq.submit_time;
  if (seq.has_first_token) stats.ttft = seq.first_token_time - seq.submit_time;
  stats.e2e = now - seq.submit_time;
  stats.trace = seq.req.trace;
  stats.submit_time = seq.submit_time;
  stats.start_time = seq.start_time;
  stats.first_token_time = seq.first_token_time;
  stats.finish_time = now;
  stats.cached_prompt_tokens = event.usage.cached_prompt_tokens;
  stats.compressions = std::move(seq.traced_compressions);
  stats.compressions_untraced = seq.untraced_compressions;
  observer_->OnRequestFinished(stats);
}

}  // namespace winnow::scheduler
