// The W3C Trace Context (https://www.w3.org/TR/trace-context/) a request carries from the
// edge that received it to the engine, so that its spans join the caller's trace.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace winnow::base {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// Lowercase hex, as traceparent and OTLP/JSON write ids.
inline std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

inline bool IsZero(std::span<const uint8_t> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

struct TraceContext {
  TraceId trace_id{};        // all zero: the request is in no trace
  SpanId span_id{};          // the span that stands for this request in winnow
  SpanId parent_span_id{};   // the caller's span (traceparent's parent-id); zero: a root span
  bool sampled = false;      // the request's spans are recorded and exported
  std::string trace_state;   // tracestate as received, carried on unchanged
  // The request span's name: "POST /v1/chat/completions", "winnow.v1.Inference/Generate".
  std::string span_name;

  bool valid() const { return !IsZero(trace_id) && !IsZero(span_id); }
  bool has_parent() const { return !IsZero(parent_span_id); }
};

}  // namespace winnow::base
