#include "server/logging.h"

#include <cmath>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/trace_context.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace winnow::server {
namespace {

// Insertion-ordered, so every line reads ts, level, msg, then the fields in the caller's order.
using Json = nlohmann::ordered_json;

// Set once at start-up, before any other thread logs.
bool g_json = false;

// Invalid UTF-8 (a prompt fragment, a path) becomes U+FFFD instead of an exception.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string Timestamp(spdlog::log_clock::time_point t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromChrono(t), absl::UTCTimeZone());
}

// LogEvent's payloads start with this marker and carry a dumped JSON object ({"msg":...,
// "k":v}); the formatter splices its members after ts and level instead of quoting them.
constexpr char kFieldsMarker = '\x1e';

class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    Json head;
    head["ts"] = Timestamp(msg.time);
    auto level = spdlog::level::to_string_view(msg.level);
    head["level"] = std::string(level.data(), level.size());
    std::string_view payload(msg.payload.data(), msg.payload.size());
    std::string line;
    if (!payload.empty() && payload.front() == kFieldsMarker) {
      // Both parts are objects dumped by nlohmann: drop head's '}' and the payload's '{'.
      line = Dump(head);
      line.back() = ',';
      line.append(payload.substr(2));
    } else {
      head["msg"] = std::string(payload);
      line = Dump(head);
    }
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// Fields that identify something stay strings even when they look like numbers: a client's
// request id "42", a hex trace id of decimal digits.
bool IsIdentifier(const std::string& key) {
  return key == "request_id" || key == "trace_id" || key == "span_id";
}

// A field value as JSON: numbers stay numbers (so collectors can aggregate them), the rest are
// strings.
Json FieldValue(const std::string& key, const std::string& v) {
  if (IsIdentifier(key) || v.empty() ||
      v.find_first_not_of("0123456789.-eE+") != std::string::npos || v.front() == '+') {
    return v;
  }
  int64_t i;
  if (absl::SimpleAtoi(v, &i)) return i;
  double d;
  if (absl::SimpleAtod(v, &d) && std::isfinite(d)) return d;
  return v;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::Status ConfigureLogging(const std::string& format, const std::string& level,
                              spdlog::sink_ptr sink) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format must be text or json, got '", format, "'"));
  }
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--log-level: unknown level '", level, "'"));
  }
  if (sink == nullptr) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("winnow", std::move(sink));
  g_json = format == "json";
  if (g_json) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

void LogEvent(int spdlog_level, const std::string& message,
              const std::vector<std::pair<std::string, std::string>>& fields) {
  auto level = static_cast<spdlog::level::level_enum>(spdlog_level);
  if (!spdlog::default_logger_raw()->should_log(level)) return;
  std::string line;
  if (g_json) {
    Json object;
    object["msg"] = message;
    for (const auto& [k, v] : fields) object[k] = FieldValue(k, v);
    line = kFieldsMarker + Dump(object);
  } else {
    line = message;
    for (const auto& [k, v] : fields) {
      // Quoted (JSON string syntax) only when the value would not read back as one token.
      const bool quote = v.empty() || v.find_first_of(" \"=") != std::string::npos;
      absl::StrAppend(&line, " ", k, "=", quote ? Dump(Json(v)) : v);
    }
  }
  spdlog::log(level, "{}", line);
}

void RequestLogger::OnRequestFinished(const scheduler::RequestStats& s) {
  std::vector<std::pair<std::string, std::string>> fields = {
      {"request_id", s.request_id},
      {"engine_id", absl::StrCat(s.id)},
      {"reason", scheduler::FinishReasonName(s.reason)},
      {"prompt_tokens", absl::StrCat(s.prompt_tokens)},
      {"completion_tokens", absl::StrCat(s.completion_tokens)},
      {"queue_ms", absl::StrFormat("%.1f", Ms(s.queue_time))},
      {"ttft_ms", s.has_first_token ? absl::StrFormat("%.1f", Ms(s.ttft)) : "-1"},
      {"e2e_ms", absl::StrFormat("%.1f", Ms(s.e2e))},
  };
  if (s.completion_tokens > 1 && s.has_first_token) {
    fields.emplace_back("tpot_ms", absl::StrFormat("%.2f", Ms(s.e2e - s.ttft) /
                                                               (s.completion_tokens - 1)));
  }
  fields.emplace_back("preemptions", absl::StrCat(s.preemptions));
  fields.emplace_back("kv_blocks_peak", absl::StrCat(s.kv_blocks_peak));
  if (!s.compression_policy.empty()) {
    fields.emplace_back("compression", s.compression_policy);
    fields.emplace_back("kv_blocks_freed", absl::StrCat(s.kv_blocks_freed_by_compression));
  }
  if (!s.status.ok()) fields.emplace_back("error", std::string(s.status.message()));
  if (s.trace.valid()) {
    fields.emplace_back("trace_id", base::ToHex(s.trace.trace_id));
    fields.emplace_back("span_id", base::ToHex(s.trace.span_id));
  }
  LogEvent(s.reason == scheduler::FinishReason::kError ? spdlog::level::warn
                                                        : spdlog::level::info,
           "request finished", fields);
}

void FanoutObserver::OnRequestQueued(uint64_t id, int32_t prompt_tokens) {
  for (auto* o : observers_) o->OnRequestQueued(id, prompt_tokens);
}
void FanoutObserver::OnRequestStarted(uint64_t id, absl::Duration queue_time) {
  for (auto* o : observers_) o->OnRequestStarted(id, queue_time);
}
void FanoutObserver::OnFirstToken(uint64_t id, absl::Duration ttft) {
  for (auto* o : observers_) o->OnFirstToken(id, ttft);
}
void FanoutObserver::OnToken(uint64_t id, absl::Duration inter_token_latency) {
  for (auto* o : observers_) o->OnToken(id, inter_token_latency);
}
void FanoutObserver::OnPreemption(uint64_t id) {
  for (auto* o : observers_) o->OnPreemption(id);
}
void FanoutObserver::OnPrefixCacheLookup(int32_t queried_tokens, int32_t hit_tokens) {
  for (auto* o : observers_) o->OnPrefixCacheLookup(queried_tokens, hit_tokens);
}
void FanoutObserver::OnCompressedContextLookup(int32_t queried_tokens, int32_t hit_tokens,
                                               int64_t hit_kv_bytes) {
  for (auto* o : observers_) o->OnCompressedContextLookup(queried_tokens, hit_tokens, hit_kv_bytes);
}
void FanoutObserver::OnCompression(const scheduler::CompressionEvent& event) {
  for (auto* o : observers_) o->OnCompression(event);
}

void FanoutObserver::OnFatalError(const absl::Status& status) {
  for (auto* o : observers_) o->OnFatalError(status);
}
void FanoutObserver::OnRequestFinished(const scheduler::RequestStats& stats) {
  for (auto* o : observers_) o->OnRequestFinished(stats);
}
void FanoutObserver::OnIteration(const scheduler::IterationStats& stats) {
  for (auto* o : observers_) o->OnIteration(stats);
}
void FanoutObserver::OnSchedulerState(const scheduler::SchedulerState& state) {
  for (auto* o : observers_) o->OnSchedulerState(state);
}

}  // namespace winnow::server
