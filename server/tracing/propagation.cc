#include "server/tracing/propagation.h"

#include <random>
#include <span>

namespace winnow::server::tracing {
namespace {

// traceparent of version 00: "vv-<32 hex>-<16 hex>-ff".
constexpr size_t kVersion00Length = 55;
// The tracestate carried on; a longer one is dropped whole, which the specification allows
// (a vendor must propagate at least 512 characters).
constexpr size_t kMaxTraceState = 512;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase hex is invalid in traceparent
}

bool ParseHex(std::string_view text, std::span<uint8_t> out) {
  if (text.size() != out.size() * 2) return false;
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexDigit(text[2 * i]);
    const int lo = HexDigit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

bool PrintableAscii(std::string_view text) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

std::mt19937_64& Generator() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator;
}

template <size_t N>
std::array<uint8_t, N> RandomNonZero() {
  std::array<uint8_t, N> id{};
  while (base::IsZero(id)) {
    for (size_t i = 0; i < N; i += 8) {
      uint64_t bits = Generator()();
      for (size_t j = i; j < N && j < i + 8; ++j, bits >>= 8) id[j] = bits & 0xff;
    }
  }
  return id;
}

}  // namespace

std::optional<TraceParent> ParseTraceparent(std::string_view header) {
  // Surrounding whitespace is allowed in HTTP header values (OWS); httplib keeps it.
  while (!header.empty() && (header.front() == ' ' || header.front() == '\t')) {
    header.remove_prefix(1);
  }
  while (!header.empty() && (header.back() == ' ' || header.back() == '\t')) {
    header.remove_suffix(1);
  }
  if (header.size() < kVersion00Length) return std::nullopt;
  uint8_t version = 0;
  if (!ParseHex(header.substr(0, 2), std::span(&version, 1)) || version == 0xff) {
    return std::nullopt;
  }
  // Version 00 is exactly 55 characters; a later one may append "-..." fields, ignored here.
  if (version == 0 ? header.size() != kVersion00Length
                   : header.size() > kVersion00Length && header[kVersion00Length] != '-') {
    return std::nullopt;
  }
  if (header[2] != '-' || header[35] != '-' || header[52] != '-') return std::nullopt;
  TraceParent parsed;
  if (!ParseHex(header.substr(3, 32), parsed.trace_id) ||
      !ParseHex(header.substr(36, 16), parsed.parent_id) ||
      !ParseHex(header.substr(53, 2), std::span(&parsed.flags, 1))) {
    return std::nullopt;
  }
  if (base::IsZero(parsed.trace_id) || base::IsZero(parsed.parent_id)) return std::nullopt;
  return parsed;
}

std::string FormatTraceparent(const base::TraceContext& context) {
  return "00-" + base::ToHex(context.trace_id) + "-" + base::ToHex(context.span_id) +
         (context.sampled ? "-01" : "-00");
}

base::TraceId NewTraceId() { return RandomNonZero<16>(); }
base::SpanId NewSpanId() { return RandomNonZero<8>(); }

base::TraceContext TraceSampler::Start(std::string_view traceparent, std::string_view tracestate,
                                       std::string span_name) const {
  base::TraceContext context;
  context.span_name = std::move(span_name);
  if (std::optional<TraceParent> parent = ParseTraceparent(traceparent)) {
    context.trace_id = parent->trace_id;
    context.parent_span_id = parent->parent_id;
    context.sampled = parent->sampled();
    if (tracestate.size() <= kMaxTraceState && PrintableAscii(tracestate)) {
      context.trace_state = std::string(tracestate);
    }
  } else if (exporting_) {
    context.trace_id = NewTraceId();
    context.sampled = ratio_ >= 1.0 ||
                      std::uniform_real_distribution<double>(0.0, 1.0)(Generator()) < ratio_;
  } else {
    return context;
  }
  context.span_id = NewSpanId();
  return context;
}

base::TraceContext SiblingSpan(const base::TraceContext& context) {
  base::TraceContext sibling = context;
  if (context.valid()) sibling.span_id = NewSpanId();
  return sibling;
}

}  // namespace winnow::server::tracing
