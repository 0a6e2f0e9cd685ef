// Exports spans to an OpenTelemetry collector over OTLP/HTTP with the JSON encoding
// (POST <endpoint>/v1/traces, Content-Type application/json). OpenTelemetry's C++ SDK is not
// packaged by Debian; what winnow needs of it is this: a bounded queue the engine thread only
// appends to, and one thread that sends batches.
//
// Never blocks the engine: Export() takes a mutex for a vector append and returns; when the
// queue is full the new spans are dropped and counted. A batch the collector does not accept
// (unreachable, timeout, a status other than 2xx) is dropped and counted too; nothing is
// retried, so a collector that is down costs one attempt per flush interval.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "server/tracing/span.h"

namespace httplib {
class Client;
}

namespace winnow::server::tracing {

struct OtlpOptions {
  // The collector's OTLP/HTTP base URL, e.g. http://otel-collector:4318 (spans go to
  // /v1/traces under it); a URL with a path of its own is used as given. http or https.
  std::string endpoint;
  std::map<std::string, std::string> headers;  // sent with every export (e.g. authorization)
  Attributes resource;  // service.name, service.version, service.instance.id
  int32_t max_queue_spans = 8192;
  int32_t max_batch_spans = 512;
  absl::Duration flush_interval = absl::Seconds(1);  // a partial batch waits at most this long
  absl::Duration timeout = absl::Seconds(5);         // per export request
};

// Where the exporter reports what became of spans (the daemon's metrics); both may be called
// from any thread.
struct ExportCounters {
  std::function<void(int64_t spans)> exported;
  std::function<void(std::string_view reason, int64_t spans)> dropped;  // queue_full,
                                                                        // export_failed
};

// An endpoint split for the HTTP client: "http://host:4318" and "/v1/traces".
struct OtlpUrl {
  std::string origin;
  std::string path;
};
absl::StatusOr<OtlpUrl> ParseOtlpEndpoint(const std::string& endpoint);

// One ExportTraceServiceRequest in OTLP/JSON: ids as lowercase hex, 64-bit integers as strings.
std::string EncodeOtlpJson(std::span<const Span> spans, const Attributes& resource);

class OtlpExporter {
 public:
  // Fails when the endpoint is not an http(s) URL.
  static absl::StatusOr<std::unique_ptr<OtlpExporter>> Create(OtlpOptions options,
                                                              ExportCounters counters);
  ~OtlpExporter();  // Shutdown(options.timeout) unless called

  // Queues the spans of one request, or drops them all when they do not fit.
  void Export(std::vector<Span> spans);

  // Sends what is queued, for up to `deadline` (what is left after it is dropped), then stops
  // the sending thread. Export() afterwards drops.
  void Shutdown(absl::Duration deadline);

  const OtlpUrl& url() const { return url_; }

 private:
  OtlpExporter(OtlpOptions options, OtlpUrl url, ExportCounters counters);
  void Run();
  // Sends one batch; false when the collector did not take it. Logs the first failure of a run
  // of failures and the recovery, not every attempt.
  bool Post(httplib::Client& client, std::span<const Span> batch);
  void Dropped(std::string_view reason, int64_t spans) const;

  const OtlpOptions options_;
  const OtlpUrl url_;
  const ExportCounters counters_;
  base::Mutex mu_;
  std::vector<Span> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time give_up_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool failing_ = false;  // the sending thread's own
  std::thread thread_;
};

}  // namespace winnow::server::tracing
