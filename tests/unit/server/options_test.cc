#include "server/options.h"

#include <map>
#include <string>
#include <vector>

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
  EXPECT_EQ(o->http_port, 8000);     // OpenAI API, /health and /metrics
  EXPECT_EQ(o->metrics_port, -1);    // no separate metrics port
  EXPECT_EQ(o->served_model_name, "");
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

TEST(ServeOptionsTest, SecurityAndConnectionLimits) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->max_concurrent_streams, 256);
  EXPECT_EQ(d->max_connection_age, absl::ZeroDuration());  // no limit
  EXPECT_EQ(d->max_connection_age_grace, absl::Minutes(5));
  EXPECT_TRUE(d->tls_cert.empty() && d->tls_key.empty() && d->tls_client_ca.empty());
  EXPECT_TRUE(d->api_key_file.empty());

  auto o = Parse({"--tls-cert", "/tls/tls.crt", "--tls-key=/tls/tls.key",
                  "--max-connection-age", "30m"},
                 {{"WINNOW_TLS_CLIENT_CA", "/tls/ca.crt"},
                  {"WINNOW_CONFIG", "/etc/winnow.yaml"}},
                 "api_key_file: /keys/api-keys\nmax-concurrent-streams: 16\n"
                 "max_connection_age_grace: 10s\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tls_cert, "/tls/tls.crt");
  EXPECT_EQ(o->tls_key, "/tls/tls.key");
  EXPECT_EQ(o->tls_client_ca, "/tls/ca.crt");
  EXPECT_EQ(o->api_key_file, "/keys/api-keys");
  EXPECT_EQ(o->max_concurrent_streams, 16);
  EXPECT_EQ(o->max_connection_age, absl::Minutes(30));
  EXPECT_EQ(o->max_connection_age_grace, absl::Seconds(10));
  EXPECT_EQ(Parse({}, {{"WINNOW_API_KEY", "client-side"}})->unknown_env.size(), 0u);

  auto bad = Parse({"--max-concurrent-streams", "0"});
  EXPECT_NE(bad.status().message().find("--max-concurrent-streams"), std::string::npos);
  bad = Parse({"--max-connection-age", "soon"});
  EXPECT_NE(bad.status().message().find("--max-connection-age must be a duration"),
            std::string::npos);
}

TEST(ServeOptionsTest, PrefixCachingIsOnByDefaultAndTakesABoolean) {
  EXPECT_TRUE(Parse({})->enable_prefix_caching);
  EXPECT_FALSE(Parse({"--enable-prefix-caching=false"})->enable_prefix_caching);
  EXPECT_FALSE(Parse({}, {{"WINNOW_ENABLE_PREFIX_CACHING", "0"}})->enable_prefix_caching);
  EXPECT_FALSE(Parse({"--config", "/etc/winnow.yaml"}, {}, "enable_prefix_caching: off\n")
                   ->enable_prefix_caching);
  auto bad = Parse({"--enable-prefix-caching", "maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--enable-prefix-caching"), std::string::npos);
}

TEST(ServeOptionsTest, GpuMemoryUtilizationIsAFractionDefaulting90Percent) {
  EXPECT_DOUBLE_EQ(Parse({})->gpu_memory_utilization, 0.9);
  EXPECT_DOUBLE_EQ(Parse({"--gpu-memory-utilization", "0.5"})->gpu_memory_utilization, 0.5);
  EXPECT_DOUBLE_EQ(Parse({}, {{"WINNOW_GPU_MEMORY_UTILIZATION", "1"}})->gpu_memory_utilization,
                   1.0);
  for (const char* bad : {"0", "1.5", "-0.1", "most", "nan"}) {
    auto o = Parse({"--gpu-memory-utilization", bad});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("gpu-memory-utilization"), std::string::npos)
        << o.status();
  }
}

TEST(ServeOptionsTest, MaxSeqsIsAutoUnlessANumberIsGiven) {
  EXPECT_EQ(Parse({})->max_seqs, 0);  // auto
  EXPECT_EQ(Parse({"--max-seqs", "auto"})->max_seqs, 0);
  EXPECT_EQ(Parse({}, {{"WINNOW_MAX_SEQS", "12"}})->max_seqs, 12);
  EXPECT_NE(Parse({"--max-seqs", "7"})->DebugString().find("max_seqs=7"), std::string::npos);
  EXPECT_NE(Parse({})->DebugString().find("max_seqs=auto"), std::string::npos);
  for (const char* bad : {"0", "-3", "lots"}) {
    auto o = Parse({"--max-seqs", bad});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("must be auto or an integer in [1, "), std::string::npos)
        << o.status();
  }
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

TEST(ServeOptionsTest, MetricsLabelsAreNameValuePairs) {
  auto o = Parse({}, {}, "");
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->metrics_labels.empty());
  o = Parse({"--config", "/etc/winnow.yaml"}, {},
            "metrics-labels: \"winnow_release=prod/winnow, zone=eu-1\"\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->metrics_labels, (std::map<std::string, std::string>{
                                   {"winnow_release", "prod/winnow"}, {"zone", "eu-1"}}));
  for (const char* bad : {"novalue", "model_name=x", "__x=1", "1abc=2", "a-b=3", "=v"}) {
    auto r = Parse({"--metrics-labels", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--metrics-labels"), std::string::npos)
        << r.status().message();
  }
}

TEST(ServeOptionsTest, TracingSettings) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->otlp_endpoint, "");  // no export
  EXPECT_EQ(d->otlp_service_name, "winnow");
  EXPECT_EQ(d->trace_sample_ratio, 1.0);
  auto o = Parse({"--otlp-endpoint", "http://collector:4318", "--trace-sample-ratio", "0.25",
                  "--otlp-headers", "authorization=Bearer abc==, x-team=ml"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->otlp_endpoint, "http://collector:4318");
  EXPECT_EQ(o->trace_sample_ratio, 0.25);
  EXPECT_EQ(o->otlp_headers, (std::map<std::string, std::string>{
                                 {"authorization", "Bearer abc=="}, {"x-team", "ml"}}));
  // The startup log shows header names, never their values (often credentials).
  EXPECT_NE(o->DebugString().find("otlp_headers=authorization,x-team"), std::string::npos);
  EXPECT_EQ(o->DebugString().find("abc=="), std::string::npos);
  for (auto [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--otlp-endpoint", "collector:4318"},
           {"--otlp-endpoint", "grpc://collector:4317"},
           {"--otlp-endpoint", "http:///v1/traces"},
           {"--otlp-headers", "novalue"},
           {"--otlp-headers", "bad header=1"},
           {"--trace-sample-ratio", "1.5"},
           {"--trace-sample-ratio", "-0.1"}}) {
    auto r = Parse({flag, value});
    ASSERT_FALSE(r.ok()) << flag << " " << value;
    EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status().message();
  }
}

TEST(ServeOptionsTest, FlagSyntax) {
  auto o = Parse({"--metrics-port", "-1", "--threads=3", "--threads", "4", "--log-format=json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->metrics_port, -1);  // a negative number is a value, not a flag
  EXPECT_EQ(o->threads, 4);        // a repeated flag keeps its last value
  EXPECT_EQ(o->log_format, "json");
  auto typo = Parse({"--max-seq", "3"});
  EXPECT_EQ(typo.status().message(), "unknown flag --max-seq (did you mean --max-seqs?)");
  EXPECT_EQ(Parse({"--bogus=1"}).status().message(), "unknown flag --bogus");
  EXPECT_EQ(Parse({"50051"}).status().message(), "unexpected argument '50051'");
  EXPECT_NE(Parse({"--port"}).status().message().find("--port"), std::string::npos);
  EXPECT_FALSE(Parse({"--help"}).ok());  // RunServe prints the usage before parsing
}

TEST(ServeOptionsTest, UnknownWinnowVariablesWarnWithTheClosestSetting) {
  const std::map<std::string, std::string> env = {
      {"WINNOW_MAX_SEQ", "4"},                           // a typo
      {"WINNOW_WINNOW_SERVICE_PORT", "50051"},           // a Kubernetes service link
      {"WINNOW_MAX_SEQS", "4"},                          // settings
      {"WINNOW_PORT", "7000"},
      {"WINNOW_BIN", "build/winnow"},                    // read on purpose by other tools
      {"WINNOW_TEST_MODEL", "m.gguf"},
      {"WINNOW_MODEL_DIR", "/models"},
      {"WINNOW_TARGET", "localhost:50051"},
      {"WINNOW_STUBS_DIR", "/tmp/stubs"},
      {"WINNOW_PROTO_ROOT", "proto"},
      {"WINNOW_QUALITY_BENCH", "build/quality_bench"},
      {"HOME", "/root"},
  };
  const std::vector<UnknownVariable> unknown = UnknownWinnowVariables(env);
  ASSERT_EQ(unknown.size(), 2u);
  EXPECT_EQ(unknown[0].name, "WINNOW_MAX_SEQ");
  EXPECT_EQ(unknown[0].closest, "WINNOW_MAX_SEQS");
  EXPECT_EQ(unknown[0].flag, "--max-seqs");
  EXPECT_EQ(unknown[1].name, "WINNOW_WINNOW_SERVICE_PORT");
  EXPECT_FALSE(unknown[1].closest.empty());
  EXPECT_EQ(unknown[1].flag.rfind("--", 0), 0u);

  // Only a warning: the options still parse, and carry the unknown variables for the log.
  auto o = Parse({}, env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_seqs, 4);
  ASSERT_EQ(o->unknown_env.size(), 2u);
  EXPECT_EQ(o->unknown_env[0].name, "WINNOW_MAX_SEQ");
  EXPECT_TRUE(Parse({}, {{"WINNOW_PORT", "7000"}})->unknown_env.empty());
}

TEST(ServeOptionsTest, CpuWeightTypeFromEveryLayerAndErrorsNameTheSource) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->cpu_weight_type.has_value());  // none: the weights as stored
  auto flag = Parse({"--cpu-weight-type", "q4_0"}, {{"WINNOW_CPU_WEIGHT_TYPE", "q8_0"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->cpu_weight_type, kernels::GgmlType::kQ4_0);
  auto env = Parse({}, {{"WINNOW_CPU_WEIGHT_TYPE", "q5_1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->cpu_weight_type, kernels::GgmlType::kQ5_1);
  EXPECT_NE(env->DebugString().find("cpu_weight_type=q5_1"), std::string::npos);
  auto none = Parse({"--cpu-weight-type=none"});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->cpu_weight_type.has_value());
  auto bad = Parse({"--cpu-weight-type", "q4_k"});
  EXPECT_EQ(bad.status().message(),
            "--cpu-weight-type must be one of none, q8_0, q4_0, q4_1, q5_0, q5_1; got 'q4_k'");
}

TEST(ServeOptionsTest, UsageListsEverySetting) {
  const std::string usage = ServeUsage();
  for (const char* flag : {"--model", "--max-seqs", "--kv-cache-bytes", "--drain-timeout",
                           "--log-level", "--config"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(usage.find("flag > environment > config"), std::string::npos);
}

TEST(ServeOptionsTest, DeviceDefaultsToWhatThisMachineHas) {
  auto o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, scheduler::DefaultDevice());
  // The KV dtype follows the device unless one was given: bf16 is the CUDA worker's only one.
  EXPECT_EQ(o->kv_cache_dtype,
            o->device.is_cuda() ? kernels::KvDtype::kBF16 : kernels::KvDtype::kF16);
  EXPECT_NE(o->DebugString().find("device=" + o->device.ToString()), std::string::npos);
}

TEST(ServeOptionsTest, DeviceFromEveryLayer) {
  auto flag = Parse({"--device", "cpu"}, {{"WINNOW_DEVICE", "cuda:1"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->device, scheduler::Device{});
  EXPECT_EQ(flag->kv_cache_dtype, kernels::KvDtype::kF16);
  EXPECT_TRUE(Parse({"--config", "/etc/winnow.yaml"}, {}, "device: cpu\nkv_cache_dtype: q8_0\n")
                  .ok());
  if (!scheduler::BuiltWithCuda()) GTEST_SKIP() << "built without CUDA: cuda values are errors";
  auto env = Parse({}, {{"WINNOW_DEVICE", "cuda:1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->device, (scheduler::Device{scheduler::Device::Kind::kCuda, 1}));
  EXPECT_EQ(env->kv_cache_dtype, kernels::KvDtype::kBF16);
  auto config = Parse({"--config", "/etc/winnow.yaml"}, {}, "device: cuda\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->device, (scheduler::Device{scheduler::Device::Kind::kCuda, 0}));
  EXPECT_TRUE(Parse({"--device=cuda:0", "--kv-cache-dtype=bf16"}).ok());
}

TEST(ServeOptionsTest, DeviceErrorsNameTheSource) {
  auto bad = Parse({"--device", "gpu"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--device"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("'gpu'"), std::string::npos) << bad.status();
  auto env = Parse({}, {{"WINNOW_DEVICE", "cuda:-1"}});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("WINNOW_DEVICE"), std::string::npos) << env.status();
  if (!scheduler::BuiltWithCuda()) {
    auto cuda = Parse({"--device", "cuda"});
    ASSERT_FALSE(cuda.ok());
    EXPECT_NE(cuda.status().message().find("--device 'cuda:0': this winnow was built "
                                           "without CUDA"),
              std::string::npos)
        << cuda.status();
    return;
  }
  // The CUDA worker stores K/V as bf16 only: another dtype is an error naming its source.
  auto dtype = Parse({"--device", "cuda:0"}, {{"WINNOW_KV_CACHE_DTYPE", "f16"}});
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.status().message().find("WINNOW_KV_CACHE_DTYPE f16 does not run on device "
                                          "cuda:0"),
            std::string::npos)
      << dtype.status();
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
