// Process logging for the daemon: spdlog on stderr, as human-readable text or as one JSON object
// per line for log collectors, and one line per finished request.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/engine_observer.h"
#include "spdlog/common.h"

namespace winnow::server {

// Replaces spdlog's default logger. format: "text" | "json"; level: spdlog level names. The
// logger writes to `sink` (tests), stderr when null.
absl::Status ConfigureLogging(const std::string& format, const std::string& level,
                              spdlog::sink_ptr sink = nullptr);

// A structured log line: `message` plus key/value fields. Text format renders
// "message k=v k=v"; JSON renders {"ts":...,"level":...,"msg":message,"k":"v",...}. Values
// that look like numbers are emitted as JSON numbers.
void LogEvent(int spdlog_level, const std::string& message,
              const std::vector<std::pair<std::string, std::string>>& fields);

// Logs one line per finished request from the engine's RequestStats.
class RequestLogger : public scheduler::EngineObserver {
 public:
  void OnRequestFinished(const scheduler::RequestStats& stats) override;
};

// Forwards every hook to several observers (the engine takes one).
class FanoutObserver : public scheduler::EngineObserver {
 public:
  explicit FanoutObserver(std::vector<scheduler::EngineObserver*> observers)
      : observers_(std::move(observers)) {}

  void OnRequestQueued(uint64_t id, int32_t prompt_tokens) override;
  void OnRequestStarted(uint64_t id, absl::Duration queue_time) override;
  void OnFirstToken(uint64_t id, absl::Duration ttft) override;
  void OnToken(uint64_t id, absl::Duration inter_token_latency) override;
  void OnPreemption(uint64_t id) override;
  void OnPrefixCacheLookup(int32_t queried_tokens, int32_t hit_tokens) override;
  void OnCompressedContextLookup(int32_t queried_tokens, int32_t hit_tokens,
                                 int64_t hit_kv_bytes) override;
  void OnCompression(const scheduler::CompressionEvent& event) override;
  void OnFatalError(const absl::Status& status) override;
  void OnRequestFinished(const scheduler::RequestStats& stats) override;
  void OnIteration(const scheduler::IterationStats& stats) override;
  void OnSchedulerState(const scheduler::SchedulerState& state) override;

 private:
  std::vector<scheduler::EngineObserver*> observers_;
};

}  // namespace winnow::server
