// The spans of a finished request, from what the engine reports (RequestStats), handed to the
// OTLP exporter. A request's span has four kinds of children, each with its token counts:
//
//   POST /v1/chat/completions (or winnow.v1.Inference/Generate)   submit -> finish
//     queue        submit -> first scheduled
//     prefill      first scheduled -> first token (prompt, cached and computed tokens)
//     compression  one per prompt compaction (policy, KV slots before and after, phase times)
//     decode       first token -> finish (completion tokens; decode-time evictions as events)
//
// Times are the engine's: the queue starts when an edge submitted the request, so parsing and
// tokenizing at the edge are not in it.
#pragma once

#include <string>
#include <vector>

#include "scheduler/engine_observer.h"
#include "server/tracing/otlp_exporter.h"
#include "server/tracing/span.h"

namespace winnow::server::tracing {

// The spans of one finished request; empty unless stats.trace is valid and sampled.
// model_name labels the request span (gen_ai.request.model).
std::vector<Span> RequestSpans(const scheduler::RequestStats& stats,
                               const std::string& model_name);

// Exports every sampled request's spans when it finishes. On the engine thread: building the
// spans is a few allocations, and the exporter only queues them.
class RequestTracer : public scheduler::EngineObserver {
 public:
  RequestTracer(OtlpExporter* exporter, std::string model_name)
      : exporter_(exporter), model_name_(std::move(model_name)) {}

  void OnRequestFinished(const scheduler::RequestStats& stats) override;

 private:
  OtlpExporter* exporter_;
  std::string model_name_;
};

}  // namespace winnow::server::tracing
