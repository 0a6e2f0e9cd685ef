#include "server/options.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace winnow::server {
namespace {

std::string g_config_text;
std::string FakeRead(const std::string& path, std::string* error) {
  if (path != "/etc/winnow.yaml") *error = "cannot be read";
  return g_config_text;
}

absl::StatusOr<ServeOptions> Parse(std::vector<std::string> args,
                                   std::map<std::string, std::string> env = {},
                                   std::string config = "") {
  g_config_text = std::move(config);
  OptionSources sources;
  sources.args = std::move(args);
  sources.env = std::move(env);
  sources.read_file = &FakeRead;
  return ParseServeOptions(sources);
}

TEST(ServeOptionsTest, Defaults) {
  auto o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 50051);
  EXPECT_EQ(o->metrics_port, 9090);
  EXPECT_EQ(o->block_size, 16);
  EXPECT_EQ(o->drain_timeout, absl::Seconds(30));
  EXPECT_EQ(o->log_format, "text");
}

TEST(ServeOptionsTest, FlagBeatsEnvBeatsConfig) {
  auto o = Parse({"--max-seqs", "5", "--port=7000"},
                 {{"WINNOW_MAX_SEQS", "4"}, {"WINNOW_MAX_QUEUE", "9"},
                  {"WINNOW_CONFIG", "/etc/winnow.yaml"}, {"WINNOW_BIN", "ignored"}},
                 "max_seqs: 3\nmax-queue: 7\nblock_size: 32\ndrain-timeout: 500ms\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_seqs, 5);     // flag
  EXPECT_EQ(o->max_queue, 9);    // env
  EXPECT_EQ(o->block_size, 32);  // config
  EXPECT_EQ(o->port, 7000);
  EXPECT_EQ(o->drain_timeout, absl::Milliseconds(500));
  EXPECT_EQ(o->config, "/etc/winnow.yaml");
}

TEST(ServeOptionsTest, ErrorsNameTheSource) {
  auto bad_flag = Parse({"--max-seqs", "many"});
  EXPECT_NE(bad_flag.status().message().find("--max-seqs"), std::string::npos);
  auto bad_env = Parse({}, {{"WINNOW_PORT", "70000"}});
  EXPECT_NE(bad_env.status().message().find("WINNOW_PORT"), std::string::npos);
  auto bad_key = Parse({"--config", "/etc/winnow.yaml"}, {}, "max-sequences: 3\n");
  EXPECT_NE(bad_key.status().message().find("unknown key 'max-sequences'"), std::string::npos);
  auto bad_yaml = Parse({"--config", "/etc/winnow.yaml"}, {}, "port: [1, 2\n");
  EXPECT_FALSE(bad_yaml.ok());
  auto missing = Parse({"--config", "/nope.yaml"});
  EXPECT_NE(missing.status().message().find("/nope.yaml"), std::string::npos);
  EXPECT_FALSE(Parse({"--bogus", "1"}).ok());
  EXPECT_FALSE(Parse({"--port"}).ok());
  EXPECT_FALSE(Parse({"--log-format", "xml"}).ok());
}

TEST(ServeOptionsTest, BytesAndDurations) {
  EXPECT_EQ(*ParseBytes("1024"), 1024);
  EXPECT_EQ(*ParseBytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("2G"), int64_t{2} << 30);
  EXPECT_EQ(*ParseBytes("1.5k"), 1536);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("5 parsecs").ok());
  EXPECT_EQ(*ParseDurationFlag("30"), absl::Seconds(30));
  EXPECT_EQ(*ParseDurationFlag("2m"), absl::Minutes(2));
  EXPECT_FALSE(ParseDurationFlag("-1s").ok());
  EXPECT_FALSE(ParseDurationFlag("soon").ok());
}

}  // namespace
}  // namespace winnow::server
