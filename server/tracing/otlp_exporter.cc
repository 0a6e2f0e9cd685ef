#include "server/tracing/otlp_exporter.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace winnow::server::tracing {
namespace {

using nlohmann::json;

// OTLP/JSON writes 64-bit integers as decimal strings (the protobuf JSON mapping).
std::string UnixNanos(absl::Time time) { return std::to_string(absl::ToUnixNanos(time)); }

json Value(const AttributeValue& value) {
  struct Visitor {
    json operator()(const std::string& v) const { return {{"stringValue", v}}; }
    json operator()(int64_t v) const { return {{"intValue", std::to_string(v)}}; }
    json operator()(double v) const { return {{"doubleValue", v}}; }
    json operator()(bool v) const { return {{"boolValue", v}}; }
  };
  return std::visit(Visitor{}, value);
}

json EncodeAttributes(const Attributes& attributes) {
  json out = json::array();
  for (const auto& [key, value] : attributes) {
    out.push_back({{"key", key}, {"value", Value(value)}});
  }
  return out;
}

json EncodeSpan(const Span& span) {
  json out = {
      {"traceId", base::ToHex(span.trace_id)},
      {"spanId", base::ToHex(span.span_id)},
      {"name", span.name},
      {"kind", static_cast<int>(span.kind)},
      {"startTimeUnixNano", UnixNanos(span.start)},
      {"endTimeUnixNano", UnixNanos(span.end)},
      {"attributes", EncodeAttributes(span.attributes)},
  };
  if (!base::IsZero(span.parent_span_id)) out["parentSpanId"] = base::ToHex(span.parent_span_id);
  if (!span.trace_state.empty()) out["traceState"] = span.trace_state;
  if (!span.events.empty()) {
    json events = json::array();
    for (const SpanEvent& event : span.events) {
      events.push_back({{"timeUnixNano", UnixNanos(event.time)},
                        {"name", event.name},
                        {"attributes", EncodeAttributes(event.attributes)}});
    }
    out["events"] = std::move(events);
  }
  if (span.error) out["status"] = {{"code", 2}, {"message", span.status_message}};
  return out;
}

}  // namespace

absl::StatusOr<OtlpUrl> ParseOtlpEndpoint(const std::string& endpoint) {
  const size_t sep = endpoint.find("://");
  const std::string scheme =
      sep == std::string::npos ? "" : absl::AsciiStrToLower(endpoint.substr(0, sep));
  if (scheme != "http" && scheme != "https") {
    return absl::InvalidArgumentError(
        absl::StrCat("must be an http:// or https:// URL, got '", endpoint, "'"));
  }
  const std::string rest = endpoint.substr(sep + 3);
  const size_t slash = rest.find('/');
  const std::string host = rest.substr(0, slash);
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("has no host: '", endpoint, "'"));
  }
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (path.empty() || path == "/") path = "/v1/traces";
  return OtlpUrl{scheme + "://" + host, path};
}

std::string EncodeOtlpJson(std::span<const Span> spans, const Attributes& resource) {
  json encoded = json::array();
  for (const Span& span : spans) encoded.push_back(EncodeSpan(span));
  const json request = {
      {"resourceSpans",
       {{{"resource", {{"attributes", EncodeAttributes(resource)}}},
         {"scopeSpans", {{{"scope", {{"name", "winnow"}}}, {"spans", std::move(encoded)}}}}}}}};
  return request.dump();
}

absl::StatusOr<std::unique_ptr<OtlpExporter>> OtlpExporter::Create(OtlpOptions options,
                                                                   ExportCounters counters) {
  absl::StatusOr<OtlpUrl> url = ParseOtlpEndpoint(options.endpoint);
  if (!url.ok()) return url.status();
  return std::unique_ptr<OtlpExporter>(
      new OtlpExporter(std::move(options), *std::move(url), std::move(counters)));
}

OtlpExporter::OtlpExporter(OtlpOptions options, OtlpUrl url, ExportCounters counters)
    : options_(std::move(options)), url_(std::move(url)), counters_(std::move(counters)) {
  thread_ = std::thread([this] { Run(); });
}

OtlpExporter::~OtlpExporter() { Shutdown(options_.timeout); }

void OtlpExporter::Export(std::vector<Span> spans) {
  const int64_t count = static_cast<int64_t>(spans.size());
  {
    base::MutexLock lock(&mu_);
    const size_t capacity = static_cast<size_t>(options_.max_queue_spans);
    if (!stopping_ && queue_.size() + spans.size() <= capacity) {
      std::move(spans.begin(), spans.end(), std::back_inserter(queue_));
      return;
    }
  }
  Dropped("queue_full", count);
}

void OtlpExporter::Shutdown(absl::Duration deadline) {
  {
    base::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    give_up_at_ = absl::Now() + deadline;
  }
  if (thread_.joinable()) thread_.join();
}

void OtlpExporter::Run() {
  httplib::Client client(url_.origin);
  const auto timeout = absl::ToChronoMilliseconds(options_.timeout);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  const size_t batch_size = static_cast<size_t>(options_.max_batch_spans);
  for (;;) {
    std::vector<Span> batch;
    {
      base::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || queue_.size() >= batch_size;
      }, options_.flush_interval);
      if (stopping_ && (queue_.empty() || absl::Now() >= give_up_at_)) {
        if (!queue_.empty()) Dropped("export_failed", static_cast<int64_t>(queue_.size()));
        queue_.clear();
        return;
      }
      const size_t n = std::min(queue_.size(), batch_size);
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + static_cast<ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(n));
    }
    if (batch.empty()) continue;
    const int64_t count = static_cast<int64_t>(batch.size());
    if (!Post(client, batch)) {
      Dropped("export_failed", count);
    } else if (counters_.exported) {
      counters_.exported(count);
    }
  }
}

bool OtlpExporter::Post(httplib::Client& client, std::span<const Span> batch) {
  httplib::Headers headers(options_.headers.begin(), options_.headers.end());
  httplib::Result result = client.Post(url_.path, headers, EncodeOtlpJson(batch, options_.resource),
                                       "application/json");
  std::string problem;
  if (!result) {
    problem = httplib::to_string(result.error());
  } else if (result->status / 100 != 2) {
    problem = absl::StrCat("status ", result->status, ": ", result->body.substr(0, 200));
  }
  if (!problem.empty() && !failing_) {
    spdlog::warn("tracing: the collector at {}{} took no spans ({}); dropping them until it "
                 "does (winnow_trace_spans_dropped_total)", url_.origin, url_.path, problem);
  } else if (problem.empty() && failing_) {
    spdlog::info("tracing: the collector at {}{} takes spans again", url_.origin, url_.path);
  }
  failing_ = !problem.empty();
  return problem.empty();
}

void OtlpExporter::Dropped(std::string_view reason, int64_t spans) const {
  if (counters_.dropped) counters_.dropped(reason, spans);
}

}  // namespace winnow::server::tracing
