#include "server/logging.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace winnow::server {
namespace {

// Routes the default logger into a string for one test, then back to stderr.
class LoggingTest : public ::testing::Test {
 protected:
  void Use(const std::string& format) {
    out_.str("");
    ASSERT_TRUE(
        ConfigureLogging(format, "info", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_))
            .ok());
  }
  std::vector<std::string> Lines() {
    std::vector<std::string> lines;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  void TearDown() override { ASSERT_TRUE(ConfigureLogging("text", "info").ok()); }

  std::ostringstream out_;
};

TEST_F(LoggingTest, JsonEventKeepsFieldOrderAndTypes) {
  Use("json");
  LogEvent(spdlog::level::warn, "request finished",
           {{"request_id", "req-1"},
            {"engine_id", "7"},
            {"ttft_ms", "70.5"},
            {"tpot_ms", "-1"},
            {"error", "bad \"x\"\nline\x01 \xff"},
            {"version", "+1"},
            {"range", "1-2"}});
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u) << out_.str();
  const auto j = nlohmann::ordered_json::parse(lines[0]);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ts", "level", "msg", "request_id", "engine_id",
                                            "ttft_ms", "tpot_ms", "error", "version", "range"}));
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["msg"], "request finished");
  EXPECT_EQ(j["request_id"], "req-1");
  EXPECT_TRUE(j["engine_id"].is_number_integer());
  EXPECT_EQ(j["engine_id"], 7);
  EXPECT_TRUE(j["ttft_ms"].is_number_float());
  EXPECT_DOUBLE_EQ(j["ttft_ms"].get<double>(), 70.5);
  EXPECT_EQ(j["tpot_ms"], -1);
  // Escapes survive the round trip; an invalid UTF-8 byte becomes U+FFFD instead of an error.
  EXPECT_EQ(j["error"], "bad \"x\"\nline\x01 \xEF\xBF\xBD");
  EXPECT_EQ(j["version"], "+1");  // not numbers: stay strings
  EXPECT_EQ(j["range"], "1-2");
  EXPECT_EQ(j["ts"].get<std::string>().size(), std::string("2026-01-01T10:40:06.521Z").size());
}

TEST_F(LoggingTest, JsonPlainMessageIsQuoted) {
  Use("json");
  spdlog::info("engine: {} \"blocks\"", 12);
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u) << out_.str();
  const auto j = nlohmann::ordered_json::parse(lines[0]);
  EXPECT_EQ(j.size(), 3u);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["msg"], "engine: 12 \"blocks\"");
}

TEST_F(LoggingTest, TextQuotesOnlyValuesThatNeedIt) {
  Use("text");
  LogEvent(spdlog::level::info, "stopped", {{"drained", "true"}, {"why", "a b"}, {"x", ""}});
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u) << out_.str();
  EXPECT_NE(lines[0].find(" I stopped drained=true why=\"a b\" x=\"\""), std::string::npos)
      << lines[0];
}

TEST_F(LoggingTest, LevelFiltersEvents) {
  Use("json");
  LogEvent(spdlog::level::debug, "hidden", {});
  EXPECT_TRUE(Lines().empty());
}

TEST(ConfigureLoggingTest, RejectsUnknownFormatAndLevel) {
  EXPECT_FALSE(ConfigureLogging("xml", "info").ok());
  EXPECT_FALSE(ConfigureLogging("json", "loud").ok());
}

}  // namespace
}  // namespace winnow::server

namespace winnow::server {
namespace {

// Records which hooks reached it.
class HookRecorder : public scheduler::EngineObserver {
 public:
  void OnRequestQueued(uint64_t, int32_t) override { hooks.push_back("queued"); }
  void OnRequestStarted(uint64_t, absl::Duration) override { hooks.push_back("started"); }
  void OnFirstToken(uint64_t, absl::Duration) override { hooks.push_back("first_token"); }
  void OnToken(uint64_t, absl::Duration) override { hooks.push_back("token"); }
  void OnPreemption(uint64_t) override { hooks.push_back("preemption"); }
  void OnPrefixCacheLookup(int32_t, int32_t) override { hooks.push_back("prefix_lookup"); }
  void OnCompressedContextLookup(int32_t, int32_t, int64_t) override {
    hooks.push_back("context_lookup");
  }
  void OnFatalError(const absl::Status&) override { hooks.push_back("fatal"); }
  void OnCompression(const scheduler::CompressionEvent&) override {
    hooks.push_back("compression");
  }
  void OnRequestFinished(const scheduler::RequestStats&) override { hooks.push_back("finished"); }
  void OnIteration(const scheduler::IterationStats&) override { hooks.push_back("iteration"); }
  void OnSchedulerState(const scheduler::SchedulerState&) override { hooks.push_back("state"); }
  std::vector<std::string> hooks;
};

// Every EngineObserver hook reaches every observer (the prefix-cache metrics once stayed at 0
// because the fan-out dropped their hook).
TEST(FanoutObserverTest, ForwardsEveryHook) {
  HookRecorder a, b;
  FanoutObserver fanout({&a, &b});
  fanout.OnRequestQueued(1, 2);
  fanout.OnRequestStarted(1, absl::ZeroDuration());
  fanout.OnFirstToken(1, absl::ZeroDuration());
  fanout.OnToken(1, absl::ZeroDuration());
  fanout.OnPreemption(1);
  fanout.OnPrefixCacheLookup(32, 16);
  fanout.OnCompressedContextLookup(64, 64, 1024);
  fanout.OnFatalError(absl::InternalError("x"));
  fanout.OnCompression({});
  fanout.OnRequestFinished({});
  fanout.OnIteration({});
  fanout.OnSchedulerState({});
  const std::vector<std::string> all = {"queued", "started", "first_token", "token",
                                        "preemption", "prefix_lookup", "context_lookup", "fatal",
                                        "compression",
                                        "finished", "iteration", "state"};
  EXPECT_EQ(a.hooks, all);
  EXPECT_EQ(b.hooks, all);
}

}  // namespace
}  // namespace winnow::server
