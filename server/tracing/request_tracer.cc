#include "server/tracing/request_tracer.h"

#include <iterator>
#include <utility>

#include "absl/time/time.h"
#include "server/tracing/propagation.h"

namespace winnow::server::tracing {
namespace {

using scheduler::CompressionEvent;
using scheduler::RequestStats;

Span ChildOf(const Span& parent, std::string name, absl::Time start, absl::Time end) {
  Span span;
  span.trace_id = parent.trace_id;
  span.span_id = NewSpanId();
  span.parent_span_id = parent.span_id;
  span.trace_state = parent.trace_state;
  span.name = std::move(name);
  span.start = start;
  span.end = end;
  return span;
}

double Millis(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

Span RequestSpan(const RequestStats& stats, const std::string& model_name) {
  Span span;
  span.trace_id = stats.trace.trace_id;
  span.span_id = stats.trace.span_id;
  span.parent_span_id = stats.trace.parent_span_id;
  span.trace_state = stats.trace.trace_state;
  span.name = stats.trace.span_name.empty() ? "generate" : stats.trace.span_name;
  span.kind = SpanKind::kServer;
  span.start = stats.submit_time;
  span.end = stats.finish_time;
  span.attributes = {
      {"gen_ai.request.model", model_name},
      {"gen_ai.usage.input_tokens", int64_t{stats.prompt_tokens}},
      {"gen_ai.usage.output_tokens", int64_t{stats.completion_tokens}},
      {"winnow.request_id", stats.request_id},
      {"winnow.finish_reason", std::string(scheduler::FinishReasonName(stats.reason))},
      {"winnow.prompt.cached_tokens", int64_t{stats.cached_prompt_tokens}},
      {"winnow.preemptions", int64_t{stats.preemptions}},
      {"winnow.kv.blocks_peak", int64_t{stats.kv_blocks_peak}},
  };
  if (!stats.compression_policy.empty()) {
    span.attributes.emplace_back("winnow.compression.policy", stats.compression_policy);
    span.attributes.emplace_back("winnow.compression.blocks_freed",
                                 int64_t{stats.kv_blocks_freed_by_compression});
  }
  if (stats.reason == scheduler::FinishReason::kError) {
    span.error = true;
    span.status_message = std::string(stats.status.message());
  }
  return span;
}

Attributes CompactionAttributes(const CompressionEvent& event) {
  return {
      {"winnow.compression.policy", event.policy},
      {"winnow.kv.slots_before", event.slots_before},
      {"winnow.kv.slots_after", event.slots_after},
      {"winnow.kv.blocks_freed", int64_t{event.blocks_freed}},
  };
}

Span CompressionSpan(const Span& request, const CompressionEvent& event) {
  Span span = ChildOf(request, "compression", event.start, event.end);
  span.attributes = CompactionAttributes(event);
  span.attributes.emplace_back("winnow.compression.scoring_ms", Millis(event.time.scoring));
  span.attributes.emplace_back("winnow.compression.planning_ms", Millis(event.time.planning));
  span.attributes.emplace_back("winnow.compression.compaction_ms",
                               Millis(event.time.compaction));
  return span;
}

// The request span's children in time order: queue, prefill, the prompt's compactions, decode
// (as far as the request got).
void AppendChildren(const Span& request, const RequestStats& stats, std::vector<Span>& spans) {
  const absl::Time started = stats.started ? stats.start_time : stats.finish_time;
  Span queue = ChildOf(request, "queue", stats.submit_time, started);
  queue.attributes = {{"winnow.prompt.tokens", int64_t{stats.prompt_tokens}}};
  spans.push_back(std::move(queue));
  if (!stats.started) return;

  const absl::Time prefilled = stats.has_first_token ? stats.first_token_time : stats.finish_time;
  Span prefill = ChildOf(request, "prefill", stats.start_time, prefilled);
  int64_t prefill_slots_before = 0, prefill_slots_after = 0;
  for (const CompressionEvent& event : stats.compressions) {
    if (!event.prefill) continue;
    prefill_slots_before += event.slots_before;
    prefill_slots_after += event.slots_after;
  }
  prefill.attributes = {
      {"winnow.prompt.tokens", int64_t{stats.prompt_tokens}},
      {"winnow.prompt.cached_tokens", int64_t{stats.cached_prompt_tokens}},
      {"winnow.prompt.computed_tokens", int64_t{stats.prompt_tokens - stats.cached_prompt_tokens}},
      {"winnow.preemptions", int64_t{stats.preemptions}},
  };
  if (prefill_slots_before > 0) {
    prefill.attributes.emplace_back("winnow.kv.slots_evicted",
                                    prefill_slots_before - prefill_slots_after);
  }
  spans.push_back(std::move(prefill));

  for (const CompressionEvent& event : stats.compressions) {
    if (event.prefill) spans.push_back(CompressionSpan(request, event));
  }
  if (!stats.has_first_token) return;

  Span decode = ChildOf(request, "decode", stats.first_token_time, stats.finish_time);
  decode.attributes = {{"winnow.completion.tokens", int64_t{stats.completion_tokens}}};
  for (const CompressionEvent& event : stats.compressions) {
    if (!event.prefill) decode.events.push_back({event.end, "kv_eviction",
                                                 CompactionAttributes(event)});
  }
  if (stats.compressions_untraced > 0) {
    decode.attributes.emplace_back("winnow.compression.untraced",
                                   int64_t{stats.compressions_untraced});
  }
  spans.push_back(std::move(decode));
}

}  // namespace

std::vector<Span> RequestSpans(const RequestStats& stats, const std::string& model_name) {
  if (!stats.trace.valid() || !stats.trace.sampled) return {};
  std::vector<Span> spans(1, RequestSpan(stats, model_name));
  std::vector<Span> children;
  AppendChildren(spans.front(), stats, children);
  std::move(children.begin(), children.end(), std::back_inserter(spans));
  return spans;
}

void RequestTracer::OnRequestFinished(const RequestStats& stats) {
  std::vector<Span> spans = RequestSpans(stats, model_name_);
  if (!spans.empty()) exporter_->Export(std::move(spans));
}

}  // namespace winnow::server::tracing
