#include "server/metrics.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/policies/policy.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace winnow::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using Buckets = prometheus::Histogram::BucketBoundaries;

// Bucket boundaries follow vLLM's, so dashboards and SLO queries port over unchanged.
const Buckets& TtftBuckets() {
  static const Buckets b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                            1.0,   2.5,   5.0,  7.5,  10,   20,   40,   80,  160, 640, 2560};
  return b;
}
const Buckets& ItlBuckets() {
  static const Buckets b = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                            0.75, 1.0,   2.5,  5.0,   7.5, 10,   20,  40,  80};
  return b;
}
const Buckets& RequestTimeBuckets() {
  static const Buckets b = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,  10,   15,   20,
                            30,  40,  50,  60,  120, 240, 480, 960, 1920, 7680};
  return b;
}
// Queue time is often sub-second on a healthy server, so it starts lower than the e2e buckets.
// The budgets clients ask for (0.05, 0.1, 0.2, 0.5) each get a bucket edge.
const Buckets& KeptRatioBuckets() {
  static const Buckets b = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 0.9, 1.0};
  return b;
}

const Buckets& QueueTimeBuckets() {
  static const Buckets b = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0,
                            2.5,   5.0,   10,   15,    20,   30,  40,  50,  60,  120, 240, 480};
  return b;
}
// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets).
Buckets OneTwoFive(double max) {
  Buckets b;
  for (double scale = 1; scale <= max; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale <= max) b.push_back(m * scale);
    }
  }
  return b;
}
Buckets PowersOfTwo(double max) {
  Buckets b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

Metrics::Metrics(int32_t max_request_tokens, const std::string& model_name,
                 const std::map<std::string, std::string>& labels)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  // Constant labels of every family below: --metrics-labels, and model_name when known.
  prometheus::Labels model(labels.begin(), labels.end());
  if (!model_name.empty()) model["model_name"] = model_name;
  running_ = &BuildGauge()
                  .Name("winnow_requests_running")
                  .Labels(model)
                  .Help("Requests holding KV blocks (prefilling or decoding).")
                  .Register(r)
                  .Add({});
  waiting_ = &BuildGauge()
                  .Name("winnow_requests_waiting")
                  .Labels(model)
                  .Help("Requests queued: not admitted yet, or preempted and waiting to "
                        "recompute.")
                  .Register(r)
                  .Add({});
  kv_blocks_total_ = &BuildGauge()
                          .Name("winnow_kv_blocks_capacity")
                          .Labels(model)
                          .Help("KV blocks in the pool (one layer's K and V for block_size "
                                "tokens each).")
                          .Register(r)
                          .Add({});
  kv_blocks_used_ = &BuildGauge()
                         .Name("winnow_kv_blocks_used")
                         .Labels(model)
                         .Help("KV blocks held by sequences.")
                         .Register(r)
                         .Add({});
  kv_usage_ratio_ = &BuildGauge()
                         .Name("winnow_kv_cache_usage_ratio")
                         .Labels(model)
                         .Help("Fraction of KV blocks in use, 0 to 1.")
                         .Register(r)
                         .Add({});
  serving_ = &BuildGauge()
                  .Name("winnow_serving")
                  .Labels(model)
                  .Help("1 while the daemon accepts requests; 0 while loading or draining.")
                  .Register(r)
                  .Add({});
  prompt_tokens_ = &BuildCounter()
                        .Name("winnow_prompt_tokens_total")
                        .Labels(model)
                        .Help("Prompt tokens of requests that started prefill.")
                        .Register(r)
                        .Add({});
  generation_tokens_ = &BuildCounter()
                            .Name("winnow_generation_tokens_total")
                            .Labels(model)
                            .Help("Tokens generated.")
                            .Register(r)
                            .Add({});
  preemptions_ = &BuildCounter()
                      .Name("winnow_preemptions_total")
                      .Labels(model)
                      .Help("Sequences preempted (KV freed, to be recomputed).")
                      .Register(r)
                      .Add({});
  prefix_cache_queries_ = &BuildCounter()
                               .Name("winnow_prefix_cache_queries_total")
                               .Labels(model)
                               .Help("Prompt tokens looked up in the prefix cache at admission.")
                               .Register(r)
                               .Add({});
  prefix_cache_hits_ = &BuildCounter()
                            .Name("winnow_prefix_cache_hits_total")
                            .Labels(model)
                            .Help("Prompt tokens whose KV came from the prefix cache.")
                            .Register(r)
                            .Add({});
  compressed_prefix_queries_ =
      &BuildCounter()
           .Name("winnow_compressed_prefix_queries_total")
           .Labels(model)
           .Help("Context tokens looked up as published compressed contexts at admission.")
           .Register(r)
           .Add({});
  compressed_prefix_hits_ =
      &BuildCounter()
           .Name("winnow_compressed_prefix_hits_total")
           .Labels(model)
           .Help("Context tokens attached compressed instead of prefilled.")
           .Register(r)
           .Add({});
  compressed_prefix_hit_bytes_ =
      &BuildCounter()
           .Name("winnow_compressed_prefix_hit_kv_bytes_total")
           .Labels(model)
           .Help("K/V bytes of compressed contexts attached at admission.")
           .Register(r)
           .Add({});
  compressed_contexts_ = &BuildGauge()
                              .Name("winnow_compressed_prefix_contexts")
                              .Labels(model)
                              .Help("Published compressed contexts resident in the KV pool.")
                              .Register(r)
                              .Add({});
  finished_ = &BuildCounter()
                   .Name("winnow_requests_finished_total")
                   .Labels(model)
                   .Help("Requests finished, by reason (stop, length, cancelled, deadline, "
                         "error).")
                   .Register(r);
  // Pre-create each reason so rate() queries see a zero before the first event.
  for (const char* reason : {"stop", "length", "cancelled", "deadline", "error"}) {
    finished_->Add({{"reason", reason}});
  }
  rejected_ = &BuildCounter()
                   .Name("winnow_requests_rejected_total")
                   .Labels(model)
                   .Help("Generation requests (gRPC or HTTP) refused before reaching the engine, "
                         "by gRPC code.")
                   .Register(r);
  for (const char* code : kRejectedCodes) rejected_->Add({{"code", code}});
  trace_spans_exported_ = &BuildCounter()
                               .Name("winnow_trace_spans_exported_total")
                               .Labels(model)
                               .Help("Spans the OTLP collector accepted (--otlp-endpoint).")
                               .Register(r)
                               .Add({});
  trace_spans_dropped_ = &BuildCounter()
                              .Name("winnow_trace_spans_dropped_total")
                              .Labels(model)
                              .Help("Spans not exported, by reason: queue_full (the export "
                                    "queue was full), export_failed (the collector did not "
                                    "take them).")
                              .Register(r);
  for (const char* reason : kSpanDropReasons) trace_spans_dropped_->Add({{"reason", reason}});
  cache_config_ = &BuildGauge()
                       .Name("winnow_cache_config_info")
                       .Help("KV cache configuration as labels (value 1): block_size in tokens, "
                             "num_gpu_blocks in vLLM's sense (blocks holding every layer), "
                             "kv_blocks (winnow's per-layer blocks) and num_layers.")
                       .Register(r);
  kv_tokens_evicted_ = &BuildCounter()
                            .Name("winnow_kv_tokens_evicted_total")
                            .Labels(model)
                            .Help("KV slots removed by compression (prefill and decode-time "
                                  "eviction), summed over layers, by policy.")
                            .Register(r);
  kv_blocks_reclaimed_ = &BuildCounter()
                              .Name("winnow_kv_blocks_reclaimed_total")
                              .Labels(model)
                              .Help("KV blocks returned to the pool by compression, by policy.")
                              .Register(r);
  kv_kept_ratio_ = &BuildHistogram()
                        .Name("winnow_kv_kept_ratio")
                        .Labels(model)
                        .Help("Fraction of a prompt's KV slots (summed over layers) kept by "
                              "its prefill compression, by policy.")
                        .Register(r);
  // Pre-create each policy's series so rate() queries see a zero before its first compaction.
  for (const std::string& policy : cache::policies::KnownPolicies()) {
    if (policy == "none") continue;
    kv_tokens_evicted_->Add({{"policy", policy}});
    kv_blocks_reclaimed_->Add({{"policy", policy}});
    kv_kept_ratio_->Add({{"policy", policy}}, KeptRatioBuckets());
  }
  ttft_ = &BuildHistogram()
               .Name("winnow_time_to_first_token_seconds")
               .Labels(model)
               .Help("Time from arrival to the first generated token.")
               .Register(r)
               .Add({}, TtftBuckets());
  itl_ = &BuildHistogram()
              .Name("winnow_inter_token_latency_seconds")
              .Labels(model)
              .Help("Time between consecutive generated tokens of a request.")
              .Register(r)
              .Add({}, ItlBuckets());
  e2e_ = &BuildHistogram()
              .Name("winnow_e2e_request_latency_seconds")
              .Labels(model)
              .Help("Time from arrival to finish.")
              .Register(r)
              .Add({}, RequestTimeBuckets());
  queue_time_ = &BuildHistogram()
                     .Name("winnow_request_queue_time_seconds")
                     .Labels(model)
                     .Help("Time from arrival to the first scheduled prefill chunk.")
                     .Register(r)
                     .Add({}, QueueTimeBuckets());
  double max_tokens = max_request_tokens > 0 ? max_request_tokens : 8192;
  request_prompt_tokens_ = &BuildHistogram()
                                .Name("winnow_request_prompt_tokens")
                                .Labels(model)
                                .Help("Prompt length of finished requests, in tokens.")
                                .Register(r)
                                .Add({}, OneTwoFive(max_tokens));
  request_generation_tokens_ = &BuildHistogram()
                                    .Name("winnow_request_generation_tokens")
                                    .Labels(model)
                                    .Help("Generated tokens of finished requests.")
                                    .Register(r)
                                    .Add({}, OneTwoFive(max_tokens));
  iteration_tokens_ = &BuildHistogram()
                           .Name("winnow_iteration_tokens")
                           .Labels(model)
                           .Help("Tokens fed to one engine iteration (prefill + decode).")
                           .Register(r)
                           .Add({}, PowersOfTwo(16384));
  iteration_sequences_ = &BuildHistogram()
                              .Name("winnow_iteration_sequences")
                              .Labels(model)
                              .Help("Sequences in one engine iteration.")
                              .Register(r)
                              .Add({}, PowersOfTwo(1024));
  iteration_seconds_ = &BuildHistogram()
                            .Name("winnow_iteration_seconds")
                            .Labels(model)
                            .Help("Forward time of one engine iteration.")
                            .Register(r)
                            .Add({}, Buckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5, 1.0, 2.5, 5.0, 10});
  compression_seconds_ = &BuildHistogram()
                              .Name("winnow_iteration_compression_seconds")
                              .Labels(model)
                              .Help("Time one engine iteration spent in the compression hooks "
                                    "after its forward (scoring, policy decisions, compaction); "
                                    "iterations without compression are not observed.")
                              .Register(r)
                              .Add({}, Buckets{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5});
  sampling_seconds_ = &BuildHistogram()
                           .Name("winnow_iteration_sampling_seconds")
                           .Labels(model)
                           .Help("Time one engine iteration spent sampling after its forward "
                                 "(structured-output token masks included).")
                           .Register(r)
                           .Add({}, Buckets{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1});
}

Metrics::~Metrics() {
  if (exposer_ != nullptr) {
    exposer_->stop();
    exposer_thread_.join();
  }
}

// cpp-httplib, as on the HTTP port, rather than prometheus-cpp's civetweb Exposer: civetweb
// starts its threads with a fixed 100 KiB stack, which the static TLS of the CUDA build's
// libraries (cuBLASLt alone holds 94 KiB) leaves too small, so pthread_create fails.
absl::Status Metrics::StartExposer(const std::string& host, int32_t port) {
  exposer_ = std::make_unique<httplib::Server>();
  exposer_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Exposition(), kExpositionContentType);
  });
  port_ = port == 0 ? exposer_->bind_to_any_port(host)
                    : (exposer_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    exposer_.reset();
    port_ = -1;
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", host, ":", port));
  }
  exposer_thread_ = std::thread([this] { exposer_->listen_after_bind(); });
  return absl::OkStatus();
}

std::string Metrics::Exposition() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::SetCacheConfig(int32_t block_size, int32_t kv_blocks_total, int32_t num_layers) {
  const int32_t layers = num_layers > 0 ? num_layers : 1;
  cache_config_
      ->Add({{"block_size", absl::StrCat(block_size)},
             {"num_gpu_blocks", absl::StrCat(kv_blocks_total / layers)},
             {"kv_blocks", absl::StrCat(kv_blocks_total)},
             {"num_layers", absl::StrCat(layers)}})
      .Set(1);
}

void Metrics::OnRejected(const std::string& code) {
  // Family::Add is thread-safe and returns the existing series for known labels.
  rejected_->Add({{"code", code}}).Increment();
}

void Metrics::OnSpansExported(int64_t spans) {
  trace_spans_exported_->Increment(static_cast<double>(spans));
}

void Metrics::OnSpansDropped(std::string_view reason, int64_t spans) {
  trace_spans_dropped_->Add({{"reason", std::string(reason)}})
      .Increment(static_cast<double>(spans));
}

void Metrics::SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }

void Metrics::OnRequestQueued(uint64_t id, int32_t prompt_tokens) {
  queued_prompt_tokens_[id] = prompt_tokens;
}

void Metrics::OnRequestStarted(uint64_t id, absl::Duration queue_time) {
  queue_time_->Observe(Seconds(queue_time));
  if (auto it = queued_prompt_tokens_.find(id); it != queued_prompt_tokens_.end()) {
    prompt_tokens_->Increment(it->second);
    queued_prompt_tokens_.erase(it);
  }
}

void Metrics::OnFirstToken(uint64_t id, absl::Duration ttft) {
  ttft_->Observe(Seconds(ttft));
  generation_tokens_->Increment();
}

void Metrics::OnToken(uint64_t id, absl::Duration inter_token_latency) {
  itl_->Observe(Seconds(inter_token_latency));
  generation_tokens_->Increment();
}

void Metrics::OnPreemption(uint64_t id) { preemptions_->Increment(); }

void Metrics::OnPrefixCacheLookup(int32_t queried_tokens, int32_t hit_tokens) {
  prefix_cache_queries_->Increment(queried_tokens);
  prefix_cache_hits_->Increment(hit_tokens);
}

void Metrics::OnCompression(const scheduler::CompressionEvent& event) {
  const std::map<std::string, std::string> labels = {{"policy", event.policy}};
  kv_tokens_evicted_->Add(labels).Increment(
      static_cast<double>(event.slots_before - event.slots_after));
  kv_blocks_reclaimed_->Add(labels).Increment(event.blocks_freed);
  if (event.prefill && event.slots_before > 0) {
    kv_kept_ratio_->Add(labels, KeptRatioBuckets())
        .Observe(static_cast<double>(event.slots_after) / event.slots_before);
  }
}

void Metrics::OnRequestFinished(const scheduler::RequestStats& stats) {
  queued_prompt_tokens_.erase(stats.id);
  finished_->Add({{"reason", scheduler::FinishReasonName(stats.reason)}}).Increment();
  e2e_->Observe(Seconds(stats.e2e));
  request_prompt_tokens_->Observe(stats.prompt_tokens);
  request_generation_tokens_->Observe(stats.completion_tokens);
}

void Metrics::OnIteration(const scheduler::IterationStats& stats) {
  iteration_tokens_->Observe(stats.batch_tokens);
  iteration_sequences_->Observe(stats.batch_seqs);
  iteration_seconds_->Observe(Seconds(stats.forward_time));
  sampling_seconds_->Observe(Seconds(stats.sampling_time));
  if (stats.compression_time > absl::ZeroDuration()) {
    compression_seconds_->Observe(Seconds(stats.compression_time));
  }
}

void Metrics::OnCompressedContextLookup(int32_t queried_tokens, int32_t hit_tokens,
                                        int64_t hit_kv_bytes) {
  compressed_prefix_queries_->Increment(queried_tokens);
  compressed_prefix_hits_->Increment(hit_tokens);
  compressed_prefix_hit_bytes_->Increment(static_cast<double>(hit_kv_bytes));
}

void Metrics::OnSchedulerState(const scheduler::SchedulerState& state) {
  running_->Set(state.running);
  compressed_contexts_->Set(state.compressed_contexts);
  waiting_->Set(state.waiting);
  kv_blocks_total_->Set(state.kv_blocks_total);
  int32_t used = state.kv_blocks_total - state.kv_blocks_free;
  kv_blocks_used_->Set(used);
  kv_usage_ratio_->Set(state.kv_blocks_total > 0
                           ? static_cast<double>(used) / state.kv_blocks_total
                           : 0.0);
}

}  // namespace winnow::server
