// Tracing: traceparent parsing (the W3C Trace Context rules), the sampler, the spans of a
// finished request, their OTLP/JSON encoding, and the exporter against a local HTTP receiver.
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/mutex.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "server/tracing/otlp_exporter.h"
#include "server/tracing/propagation.h"
#include "server/tracing/request_tracer.h"

namespace winnow::server::tracing {
namespace {

using nlohmann::json;

// The W3C specification's own example.
constexpr char kTraceparent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
constexpr char kTraceId[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParentId[] = "00f067aa0ba902b7";

TEST(TraceparentTest, ParsesTheSpecificationsExample) {
  std::optional<TraceParent> p = ParseTraceparent(kTraceparent);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(base::ToHex(p->trace_id), kTraceId);
  EXPECT_EQ(base::ToHex(p->parent_id), kParentId);
  EXPECT_TRUE(p->sampled());
  p = ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->sampled());
  // Header whitespace around the value; other flag bits are kept but mean nothing here.
  EXPECT_TRUE(ParseTraceparent(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03\t"));
}

TEST(TraceparentTest, RefusesWhatTheSpecificationRefuses) {
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // uppercase
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // 00 has 4 fields
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // delimiter
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
           "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",    // short version
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // no '-' after flags
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
  // A later version may carry more fields after the four it shares with 00.
  EXPECT_TRUE(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"));
  EXPECT_TRUE(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
}

TEST(TraceSamplerTest, ContinuesTheCallersTraceWithItsSamplingDecision) {
  const TraceSampler sampler(/*exporting=*/true, /*ratio=*/0.0);
  base::TraceContext c = sampler.Start(kTraceparent, "vendor=abc,other=1", "POST /v1/completions");
  ASSERT_TRUE(c.valid());
  EXPECT_EQ(base::ToHex(c.trace_id), kTraceId);
  EXPECT_EQ(base::ToHex(c.parent_span_id), kParentId);
  EXPECT_NE(base::ToHex(c.span_id), kParentId);
  EXPECT_TRUE(c.sampled);  // the parent's flag wins over ratio 0
  EXPECT_EQ(c.trace_state, "vendor=abc,other=1");
  EXPECT_EQ(c.span_name, "POST /v1/completions");
  EXPECT_EQ(FormatTraceparent(c), "00-" + std::string(kTraceId) + "-" +
                                      base::ToHex(c.span_id) + "-01");

  c = sampler.Start("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "", "x");
  EXPECT_TRUE(c.valid());
  EXPECT_FALSE(c.sampled);  // the caller did not sample: neither do we

  // A tracestate longer than the 512 characters a vendor must carry is dropped whole.
  c = sampler.Start(kTraceparent, std::string(600, 'a'), "x");
  EXPECT_EQ(c.trace_state, "");
}

TEST(TraceSamplerTest, StartsATraceOnlyWhenExporting) {
  EXPECT_FALSE(TraceSampler(false, 1.0).Start("", "", "x").valid());
  EXPECT_FALSE(TraceSampler(false, 1.0).Start("garbage", "", "x").valid());
  // Not exporting, a caller's trace is still carried (the request log names it).
  EXPECT_TRUE(TraceSampler(false, 1.0).Start(kTraceparent, "", "x").valid());

  base::TraceContext root = TraceSampler(true, 1.0).Start("garbage", "state", "x");
  ASSERT_TRUE(root.valid());
  EXPECT_TRUE(root.sampled);
  EXPECT_FALSE(root.has_parent());
  EXPECT_EQ(root.trace_state, "");  // tracestate means nothing without its traceparent
  EXPECT_FALSE(TraceSampler(true, 0.0).Start("", "", "x").sampled);
  int sampled = 0;
  const TraceSampler half(true, 0.5);
  for (int i = 0; i < 2000; ++i) sampled += half.Start("", "", "x").sampled;
  EXPECT_GT(sampled, 800);
  EXPECT_LT(sampled, 1200);
}

TEST(TraceSamplerTest, IdsAreFreshAndSiblingsShareTheTrace) {
  const TraceSampler sampler(true, 1.0);
  std::set<std::string> traces, spans;
  for (int i = 0; i < 100; ++i) {
    base::TraceContext c = sampler.Start("", "", "x");
    traces.insert(base::ToHex(c.trace_id));
    spans.insert(base::ToHex(c.span_id));
  }
  EXPECT_EQ(traces.size(), 100u);
  EXPECT_EQ(spans.size(), 100u);
  base::TraceContext c = sampler.Start(kTraceparent, "", "x");
  base::TraceContext sibling = SiblingSpan(c);
  EXPECT_EQ(sibling.trace_id, c.trace_id);
  EXPECT_EQ(sibling.parent_span_id, c.parent_span_id);
  EXPECT_NE(sibling.span_id, c.span_id);
  EXPECT_FALSE(SiblingSpan(base::TraceContext{}).valid());
}

// A request that waited 10 ms, prefilled for 50 (its prompt compressed at 40-55), decoded for
// 100, and had one decode-time eviction.
scheduler::RequestStats FinishedRequest() {
  scheduler::RequestStats s;
  s.trace = TraceSampler(true, 1.0).Start(kTraceparent, "k=v", "POST /v1/chat/completions");
  s.request_id = "req-1";
  s.prompt_tokens = 100;
  s.cached_prompt_tokens = 32;
  s.completion_tokens = 9;
  s.compression_policy = "snapkv";
  s.kv_blocks_freed_by_compression = 12;
  s.started = s.has_first_token = true;
  const absl::Time t0 = absl::FromUnixMillis(1'700'000'000'000);
  s.submit_time = t0;
  s.start_time = t0 + absl::Milliseconds(10);
  s.first_token_time = t0 + absl::Milliseconds(60);
  s.finish_time = t0 + absl::Milliseconds(160);
  scheduler::CompressionEvent prompt;
  prompt.policy = "snapkv";
  prompt.slots_before = 3000;
  prompt.slots_after = 900;
  prompt.blocks_freed = 10;
  prompt.start = t0 + absl::Milliseconds(40);
  prompt.end = t0 + absl::Milliseconds(55);
  prompt.time.scoring = absl::Milliseconds(8);
  scheduler::CompressionEvent eviction;
  eviction.policy = "snapkv";
  eviction.prefill = false;
  eviction.slots_before = 1000;
  eviction.slots_after = 970;
  eviction.blocks_freed = 2;
  eviction.start = eviction.end = t0 + absl::Milliseconds(120);
  s.compressions = {prompt, eviction};
  return s;
}

const Span& Named(const std::vector<Span>& spans, const std::string& name) {
  for (const Span& s : spans) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no span " << name;
  return spans.front();
}

std::map<std::string, AttributeValue> AttributeMap(const Span& span) {
  return {span.attributes.begin(), span.attributes.end()};
}

TEST(RequestSpansTest, RequestQueuePrefillCompressionDecode) {
  const scheduler::RequestStats stats = FinishedRequest();
  const std::vector<Span> spans = RequestSpans(stats, "smollm2");
  ASSERT_EQ(spans.size(), 5u);
  const Span& request = Named(spans, "POST /v1/chat/completions");
  EXPECT_EQ(request.kind, SpanKind::kServer);
  EXPECT_EQ(request.span_id, stats.trace.span_id);
  EXPECT_EQ(base::ToHex(request.parent_span_id), kParentId);  // the caller's span
  EXPECT_EQ(request.start, stats.submit_time);
  EXPECT_EQ(request.end, stats.finish_time);
  auto attrs = AttributeMap(request);
  EXPECT_EQ(std::get<std::string>(attrs["gen_ai.request.model"]), "smollm2");
  EXPECT_EQ(std::get<int64_t>(attrs["gen_ai.usage.input_tokens"]), 100);
  EXPECT_EQ(std::get<int64_t>(attrs["gen_ai.usage.output_tokens"]), 9);
  EXPECT_EQ(std::get<std::string>(attrs["winnow.finish_reason"]), "stop");
  EXPECT_EQ(std::get<std::string>(attrs["winnow.compression.policy"]), "snapkv");
  EXPECT_FALSE(request.error);

  for (const Span& s : spans) {
    EXPECT_EQ(s.trace_id, stats.trace.trace_id) << s.name;
    EXPECT_EQ(s.trace_state, "k=v") << s.name;
    if (&s == &request) continue;
    EXPECT_EQ(s.parent_span_id, request.span_id) << s.name;
    EXPECT_NE(s.span_id, request.span_id) << s.name;
    EXPECT_GE(s.start, request.start) << s.name;
    EXPECT_LE(s.end, request.end) << s.name;
    EXPECT_LE(s.start, s.end) << s.name;
  }
  const Span& queue = Named(spans, "queue");
  EXPECT_EQ(queue.end - queue.start, absl::Milliseconds(10));
  const Span& prefill = Named(spans, "prefill");
  EXPECT_EQ(prefill.start, stats.start_time);
  EXPECT_EQ(prefill.end, stats.first_token_time);
  attrs = AttributeMap(prefill);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.prompt.cached_tokens"]), 32);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.prompt.computed_tokens"]), 68);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.kv.slots_evicted"]), 2100);
  const Span& compression = Named(spans, "compression");
  EXPECT_EQ(compression.end - compression.start, absl::Milliseconds(15));
  attrs = AttributeMap(compression);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.kv.slots_before"]), 3000);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.kv.slots_after"]), 900);
  EXPECT_EQ(std::get<int64_t>(attrs["winnow.kv.blocks_freed"]), 10);
  EXPECT_DOUBLE_EQ(std::get<double>(attrs["winnow.compression.scoring_ms"]), 8.0);
  const Span& decode = Named(spans, "decode");
  EXPECT_EQ(std::get<int64_t>(AttributeMap(decode)["winnow.completion.tokens"]), 9);
  ASSERT_EQ(decode.events.size(), 1u);  // the decode-time eviction
  EXPECT_EQ(decode.events[0].name, "kv_eviction");
}

TEST(RequestSpansTest, UnsampledQueuedOnlyAndFailedRequests) {
  scheduler::RequestStats stats = FinishedRequest();
  stats.trace.sampled = false;
  EXPECT_TRUE(RequestSpans(stats, "m").empty());
  EXPECT_TRUE(RequestSpans(scheduler::RequestStats{}, "m").empty());

  // Cancelled while queued: the request and its queue span, which runs to the finish.
  stats = FinishedRequest();
  stats.started = stats.has_first_token = false;
  stats.compressions.clear();
  stats.reason = scheduler::FinishReason::kCancelled;
  std::vector<Span> spans = RequestSpans(stats, "m");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(Named(spans, "queue").end, stats.finish_time);

  stats = FinishedRequest();
  stats.has_first_token = false;
  stats.compressions.clear();
  stats.reason = scheduler::FinishReason::kError;
  stats.status = absl::InternalError("forward failed");
  spans = RequestSpans(stats, "m");
  ASSERT_EQ(spans.size(), 3u);  // request, queue, prefill (to the failure)
  EXPECT_TRUE(spans.front().error);
  EXPECT_EQ(spans.front().status_message, "forward failed");
  EXPECT_EQ(Named(spans, "prefill").end, stats.finish_time);
}

TEST(OtlpJsonTest, EncodesAnExportTraceServiceRequest) {
  const std::vector<Span> spans = RequestSpans(FinishedRequest(), "smollm2");
  const json doc = json::parse(EncodeOtlpJson(spans, {{"service.name", std::string("winnow")}}));
  const json& rs = doc["resourceSpans"][0];
  EXPECT_EQ(rs["resource"]["attributes"][0],
            json({{"key", "service.name"}, {"value", {{"stringValue", "winnow"}}}}));
  const json& out = rs["scopeSpans"][0]["spans"];
  ASSERT_EQ(out.size(), spans.size());
  const json& request = out[0];
  EXPECT_EQ(request["traceId"], kTraceId);
  EXPECT_EQ(request["parentSpanId"], kParentId);
  EXPECT_EQ(request["spanId"], base::ToHex(spans[0].span_id));
  EXPECT_EQ(request["kind"], 2);  // SPAN_KIND_SERVER
  EXPECT_EQ(request["traceState"], "k=v");
  // 64-bit integers are strings in OTLP/JSON.
  EXPECT_EQ(request["startTimeUnixNano"], "1700000000000000000");
  EXPECT_EQ(request["endTimeUnixNano"], "1700000000160000000");
  bool found = false;
  for (const json& a : request["attributes"]) {
    if (a["key"] == "gen_ai.usage.input_tokens") {
      EXPECT_EQ(a["value"], json({{"intValue", "100"}}));
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_FALSE(request.contains("status"));  // UNSET
  const json& decode = out[4];
  EXPECT_EQ(decode["name"], "decode");
  EXPECT_EQ(decode["kind"], 1);  // SPAN_KIND_INTERNAL
  EXPECT_EQ(decode["events"][0]["name"], "kv_eviction");
  EXPECT_EQ(decode["events"][0]["timeUnixNano"], "1700000000120000000");
}

TEST(OtlpEndpointTest, BaseUrlsGetTheTracesPath) {
  auto u = ParseOtlpEndpoint("http://collector:4318");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->origin, "http://collector:4318");
  EXPECT_EQ(u->path, "/v1/traces");
  EXPECT_EQ(ParseOtlpEndpoint("https://c.example/")->path, "/v1/traces");
  EXPECT_EQ(ParseOtlpEndpoint("HTTPS://c.example/otlp/v1/traces")->path, "/otlp/v1/traces");
  EXPECT_EQ(ParseOtlpEndpoint("HTTPS://c.example/otlp/v1/traces")->origin, "https://c.example");
  for (const char* bad : {"collector:4318", "grpc://c:4317", "http://", "http:///v1/traces"}) {
    EXPECT_FALSE(ParseOtlpEndpoint(bad).ok()) << bad;
  }
}

// An OTLP/HTTP receiver on loopback that records every POST.
class Receiver {
 public:
  explicit Receiver(int status = 200) {
    server_.Post("/v1/traces", [this, status](const httplib::Request& req,
                                              httplib::Response& res) {
      base::MutexLock lock(&mu_);
      bodies_.push_back(req.body);
      content_types_.push_back(req.get_header_value("Content-Type"));
      tokens_.push_back(req.get_header_value("x-token"));
      res.status = status;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) absl::SleepFor(absl::Milliseconds(1));
  }
  ~Receiver() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Spans received so far.
  size_t spans() {
    base::MutexLock lock(&mu_);
    size_t n = 0;
    for (const std::string& body : bodies_) {
      n += json::parse(body)["resourceSpans"][0]["scopeSpans"][0]["spans"].size();
    }
    return n;
  }
  size_t posts() {
    base::MutexLock lock(&mu_);
    return bodies_.size();
  }
  std::string content_type(size_t i) {
    base::MutexLock lock(&mu_);
    return content_types_.at(i);
  }
  std::string token(size_t i) {
    base::MutexLock lock(&mu_);
    return tokens_.at(i);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  base::Mutex mu_;
  std::vector<std::string> bodies_, content_types_, tokens_;
};

struct Counts {
  std::atomic<int64_t> exported{0}, queue_full{0}, export_failed{0};
  ExportCounters counters() {
    return {[this](int64_t n) { exported += n; },
            [this](std::string_view reason, int64_t n) {
              (reason == "queue_full" ? queue_full : export_failed) += n;
            }};
  }
};

template <typename Cond>
bool WaitFor(Cond cond) {
  for (int i = 0; i < 500 && !cond(); ++i) absl::SleepFor(absl::Milliseconds(10));
  return cond();
}

std::vector<Span> SomeSpans(int n) {
  std::vector<Span> spans(n);
  for (Span& s : spans) {
    s.trace_id = NewTraceId();
    s.span_id = NewSpanId();
    s.name = "s";
    s.start = s.end = absl::Now();
  }
  return spans;
}

TEST(OtlpExporterTest, SendsBatchesWithTheConfiguredHeaders) {
  Receiver receiver;
  Counts counts;
  OtlpOptions options;
  options.endpoint = receiver.url();
  options.headers = {{"x-token", "secret"}};
  options.max_batch_spans = 4;
  options.flush_interval = absl::Milliseconds(50);
  auto exporter = OtlpExporter::Create(options, counts.counters());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  for (int i = 0; i < 5; ++i) (*exporter)->Export(SomeSpans(2));
  ASSERT_TRUE(WaitFor([&] { return receiver.spans() == 10; })) << receiver.spans();
  EXPECT_GE(receiver.posts(), 3u);  // batches of at most 4
  EXPECT_EQ(receiver.content_type(0), "application/json");
  EXPECT_EQ(receiver.token(0), "secret");
  EXPECT_TRUE(WaitFor([&] { return counts.exported == 10; }));
  EXPECT_EQ(counts.queue_full + counts.export_failed, 0);
}

TEST(OtlpExporterTest, ShutdownFlushesWhatIsQueued) {
  Receiver receiver;
  Counts counts;
  OtlpOptions options;
  options.endpoint = receiver.url();
  options.flush_interval = absl::Hours(1);  // only Shutdown sends this partial batch
  auto exporter = OtlpExporter::Create(options, counts.counters());
  ASSERT_TRUE(exporter.ok());
  (*exporter)->Export(SomeSpans(3));
  (*exporter)->Shutdown(absl::Seconds(5));
  EXPECT_EQ(receiver.spans(), 3u);
  EXPECT_EQ(counts.exported, 3);
  (*exporter)->Export(SomeSpans(1));  // after Shutdown: dropped, not queued forever
  EXPECT_EQ(counts.queue_full, 1);
}

TEST(OtlpExporterTest, ACollectorThatIsDownCostsSpansNotTime) {
  int port = 0;
  {
    Receiver gone;  // a port that was just free: nothing listens on it afterwards
    port = std::stoi(gone.url().substr(gone.url().rfind(':') + 1));
  }
  Counts counts;
  OtlpOptions options;
  options.endpoint = "http://127.0.0.1:" + std::to_string(port);
  options.max_queue_spans = 8;
  options.flush_interval = absl::Milliseconds(20);
  options.timeout = absl::Milliseconds(500);
  auto exporter = OtlpExporter::Create(options, counts.counters());
  ASSERT_TRUE(exporter.ok());
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100; ++i) (*exporter)->Export(SomeSpans(2));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200));  // Export never waits on the network
  EXPECT_GT(counts.queue_full, 0);
  EXPECT_TRUE(WaitFor([&] { return counts.queue_full + counts.export_failed == 200; }))
      << counts.queue_full << " " << counts.export_failed;
  EXPECT_EQ(counts.exported, 0);
}

TEST(OtlpExporterTest, ARefusingCollectorCountsDroppedSpans) {
  Receiver receiver(/*status=*/503);
  Counts counts;
  OtlpOptions options;
  options.endpoint = receiver.url();
  options.flush_interval = absl::Milliseconds(20);
  auto exporter = OtlpExporter::Create(options, counts.counters());
  ASSERT_TRUE(exporter.ok());
  (*exporter)->Export(SomeSpans(3));
  EXPECT_TRUE(WaitFor([&] { return counts.export_failed == 3; }));
  EXPECT_EQ(counts.exported, 0);
}

}  // namespace
}  // namespace winnow::server::tracing
