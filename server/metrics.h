// Prometheus metrics of the daemon, fed by the engine's observer hooks and by the gRPC edge
// (rejections). Names follow Prometheus conventions (winnow_ prefix, base units, _total
// counters); docs/metrics.md maps each to its vLLM equivalent and to the signals the Kubernetes
// Gateway API Inference Extension reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "scheduler/engine_observer.h"

namespace httplib {
class Server;
}

namespace winnow::server {

// What GET /metrics answers with: Prometheus' text format 0.0.4.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The codes an edge refuses requests with; pre-created at 0 so rate() sees the first one.
inline constexpr const char* kRejectedCodes[] = {
    "INVALID_ARGUMENT", "NOT_FOUND",         "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",      "DEADLINE_EXCEEDED", "CANCELLED",           "INTERNAL",
    "UNAUTHENTICATED"};

// Why spans were not exported (tracing::ExportCounters); pre-created at 0.
inline constexpr const char* kSpanDropReasons[] = {"queue_full", "export_failed"};

class Metrics : public scheduler::EngineObserver {
 public:
  // max_request_tokens bounds the token-count histograms' buckets (the context length).
  // model_name, when not empty, labels every series of the engine and the edge as
  // model_name="..." (vLLM's label), so dashboards and the Gateway API Inference Extension can
  // tell models apart when one Prometheus scrapes several.
  // `labels` are constant labels of every series beside model_name (--metrics-labels).
  explicit Metrics(int32_t max_request_tokens = 8192, const std::string& model_name = "",
                   const std::map<std::string, std::string>& labels = {});
  ~Metrics() override;

  // Serves the registry at http://host:port/metrics. Port 0 picks a free port.
  absl::Status StartExposer(const std::string& host, int32_t port);
  // The bound port (after StartExposer), or -1.
  int32_t port() const { return port_; }

  std::shared_ptr<prometheus::Registry> registry() { return registry_; }
  // The registry in the Prometheus text format (0.0.4), for GET /metrics on the HTTP port.
  std::string Exposition() const;

  // winnow_cache_config_info{block_size, num_gpu_blocks, kv_blocks, num_layers} = 1, once the
  // engine has sized its pool (vLLM's cache_config_info; the endpoint picker reads block_size).
  void SetCacheConfig(int32_t block_size, int32_t kv_blocks_total, int32_t num_layers);

  // Requests refused at the gRPC or HTTP edge before reaching the engine, by gRPC status code
  // name (absl::StatusCodeToString). Every name in kRejectedCodes is exported from start-up.
  void OnRejected(const std::string& code);
  void SetServing(bool serving);
  // The OTLP exporter's outcomes (server/tracing/otlp_exporter.h); any thread.
  void OnSpansExported(int64_t spans);
  void OnSpansDropped(std::string_view reason, int64_t spans);

  // EngineObserver: all on the engine thread.
  void OnRequestQueued(uint64_t id, int32_t prompt_tokens) override;
  void OnRequestStarted(uint64_t id, absl::Duration queue_time) override;
  void OnFirstToken(uint64_t id, absl::Duration ttft) override;
  void OnToken(uint64_t id, absl::Duration inter_token_latency) override;
  void OnPreemption(uint64_t id) override;
  void OnPrefixCacheLookup(int32_t queried_tokens, int32_t hit_tokens) override;
  void OnCompressedContextLookup(int32_t queried_tokens, int32_t hit_tokens,
                                 int64_t hit_kv_bytes) override;
  void OnCompression(const scheduler::CompressionEvent& event) override;
  void OnRequestFinished(const scheduler::RequestStats& stats) override;
  void OnIteration(const scheduler::IterationStats& stats) override;
  void OnSchedulerState(const scheduler::SchedulerState& state) override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> exposer_;  // the separate --metrics-port, if any
  std::thread exposer_thread_;
  int32_t port_ = -1;

  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_blocks_total_;
  prometheus::Gauge* kv_blocks_used_;
  prometheus::Gauge* kv_usage_ratio_;
  prometheus::Gauge* serving_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* prefix_cache_queries_;
  prometheus::Counter* prefix_cache_hits_;
  prometheus::Counter* compressed_prefix_queries_;
  prometheus::Counter* compressed_prefix_hits_;
  prometheus::Counter* compressed_prefix_hit_bytes_;
  prometheus::Gauge* compressed_contexts_;
  prometheus::Family<prometheus::Counter>* finished_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Counter* trace_spans_exported_;
  prometheus::Family<prometheus::Counter>* trace_spans_dropped_;
  prometheus::Family<prometheus::Gauge>* cache_config_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* request_prompt_tokens_;
  prometheus::Histogram* request_generation_tokens_;
  prometheus::Histogram* iteration_tokens_;
  prometheus::Histogram* iteration_sequences_;
  prometheus::Histogram* iteration_seconds_;
  prometheus::Histogram* compression_seconds_;
  prometheus::Histogram* sampling_seconds_;
  prometheus::Family<prometheus::Counter>* kv_tokens_evicted_;
  prometheus::Family<prometheus::Counter>* kv_blocks_reclaimed_;
  prometheus::Family<prometheus::Histogram>* kv_kept_ratio_;

  // Prompt sizes between queueing and first scheduling, so the prompt-token counter moves when
  // the prefill starts rather than when the request ends. Engine thread only.
  absl::flat_hash_map<uint64_t, int32_t> queued_prompt_tokens_;
};

}  // namespace winnow::server
