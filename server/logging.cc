#include "server/logging.h"

#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace winnow::server {
namespace {

// Set once at start-up, before any other thread logs.
bool g_json = false;

std::string LevelName(spdlog::level::level_enum level) {
  auto sv = spdlog::level::to_string_view(level);
  return std::string(sv.data(), sv.size());
}

std::string Timestamp(spdlog::log_clock::time_point t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromChrono(t), absl::UTCTimeZone());
}

// One JSON object per line. Payloads that start with the field marker carry pre-rendered
// `"k":v` members (from LogEvent) and are spliced in rather than quoted.
constexpr char kFieldsMarker = '\x1e';

class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string line = "{\"ts\":\"";
    absl::StrAppend(&line, Timestamp(msg.time), "\",\"level\":\"", LevelName(msg.level), "\"");
    std::string_view payload(msg.payload.data(), msg.payload.size());
    if (!payload.empty() && payload.front() == kFieldsMarker) {
      line += ",";
      line.append(payload.substr(1));
    } else {
      line += ",\"msg\":";
      AppendJsonString(payload, &line);
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

bool LooksNumeric(const std::string& v) {
  double d;
  return !v.empty() && v.find_first_not_of("0123456789.-eE+") == std::string::npos &&
         absl::SimpleAtod(v, &d) && v != "-" && v.front() != '+';
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

void AppendJsonString(std::string_view text, std::string* out) {
  out->push_back('"');
  for (unsigned char c : text) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

absl::Status ConfigureLogging(const std::string& format, const std::string& level) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format must be text or json, got '", format, "'"));
  }
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--log-level: unknown level '", level, "'"));
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("winnow", sink);
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
    line.push_back(kFieldsMarker);
    line += "\"msg\":";
    AppendJsonString(message, &line);
    for (const auto& [k, v] : fields) {
      line.push_back(',');
      AppendJsonString(k, &line);
      line.push_back(':');
      if (LooksNumeric(v)) {
        line += v;
      } else {
        AppendJsonString(v, &line);
      }
    }
  } else {
    line = message;
    for (const auto& [k, v] : fields) {
      bool quote = v.empty() || v.find_first_of(" \"=") != std::string::npos;
      absl::StrAppend(&line, " ", k, "=");
      if (quote) {
        AppendJsonString(v, &line);
      } else {
        line += v;
      }
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
void FanoutObserver::OnCompression(const scheduler::CompressionEvent& event) {
  for (auto* o : observers_) o->OnCompression(event);
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
