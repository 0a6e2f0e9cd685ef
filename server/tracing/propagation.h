// W3C Trace Context propagation at the edges: the `traceparent` and `tracestate` an HTTP
// request's headers or a gRPC call's metadata carry become the request's TraceContext, whose
// spans then continue the caller's trace (server/tracing/request_tracer.h records them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/trace_context.h"

namespace winnow::server::tracing {

// A traceparent header's fields (version 00, or a later version's first four fields).
struct TraceParent {
  base::TraceId trace_id{};
  base::SpanId parent_id{};
  uint8_t flags = 0;  // bit 0: the caller sampled (recorded) its span

  bool sampled() const { return (flags & 1) != 0; }
};

// The header's fields, or nullopt when it is not a valid traceparent (W3C rules: lowercase hex,
// ids not all zero, version ff refused, version 00 exactly 55 characters, a later version at
// least that and a '-' after the flags). An invalid header is ignored, never an error: the
// request starts a trace of its own, as the specification asks.
std::optional<TraceParent> ParseTraceparent(std::string_view header);

// "00-<trace-id>-<span-id>-<flags>" for the context's own span.
std::string FormatTraceparent(const base::TraceContext& context);

// Random ids, never all zero.
base::TraceId NewTraceId();
base::SpanId NewSpanId();

// Decides each request's context. Thread-safe (both edges call it from their own threads).
class TraceSampler {
 public:
  // exporting: spans go somewhere (--otlp-endpoint). ratio, in [0, 1]: the share of requests
  // without a traceparent that start a sampled trace (--trace-sample-ratio).
  TraceSampler(bool exporting, double ratio) : exporting_(exporting), ratio_(ratio) {}

  // The context of a request that came with these header values (empty when absent): it
  // continues a valid traceparent, keeping the caller's sampled flag (parent-based sampling)
  // and tracestate; without one it starts a trace, sampled by ratio, when exporting, and is in
  // no trace otherwise. Each call makes a new span id for the request's own span.
  base::TraceContext Start(std::string_view traceparent, std::string_view tracestate,
                           std::string span_name) const;

 private:
  bool exporting_;
  double ratio_;
};

// The same trace, parent and sampling with a span of its own: a request's other samples
// (gRPC n > 1, OpenAI n and prompt lists) each get one.
base::TraceContext SiblingSpan(const base::TraceContext& context);

}  // namespace winnow::server::tracing
