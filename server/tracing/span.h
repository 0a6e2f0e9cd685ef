// A finished span as the exporter sends it: OpenTelemetry's span model, the parts winnow uses.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "base/trace_context.h"

namespace winnow::server::tracing {

using AttributeValue = std::variant<std::string, int64_t, double, bool>;
using Attributes = std::vector<std::pair<std::string, AttributeValue>>;

// OTLP's Span.SpanKind numbers.
enum class SpanKind : int { kInternal = 1, kServer = 2 };

struct SpanEvent {
  absl::Time time;
  std::string name;
  Attributes attributes;
};

struct Span {
  base::TraceId trace_id{};
  base::SpanId span_id{};
  base::SpanId parent_span_id{};  // zero: a root span
  std::string trace_state;
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  absl::Time start;
  absl::Time end;
  Attributes attributes;
  std::vector<SpanEvent> events;
  bool error = false;          // OTLP status ERROR with `status_message`; else UNSET
  std::string status_message;
};

}  // namespace winnow::server::tracing
