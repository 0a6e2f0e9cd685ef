// Hugging Face checkpoints: safetensors parsing (every offset checked, errors naming the
// tensor) and config.json into ModelConfig (both rope spellings, the errors naming the field).
// tests/python/test_hf_model.py loads whole directories against transformers.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

using nlohmann::json;

// A safetensors image: the 8-byte length, the header, the data.
std::string Image(const json& header, const std::string& data) {
  const std::string text = header.dump();
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST(SafetensorsTest, ReadsTensorsInPlace) {
  const std::string data = Floats({1, 2, 3, 4, 5, 6}) + std::string("\x80\x3f\x00\x40", 4);
  const json header = {
      {"__metadata__", {{"format", "pt"}}},
      {"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
      {"b", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {24, 28}}}},
  };
  auto file = SafetensorsFile::FromBytes(Image(header, data), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 2u);
  for (const SafetensorsTensor& t : (*file)->tensors()) {
    kernels::GgmlType type;
    ASSERT_TRUE(t.KernelType(&type));
    if (t.name == "w") {
      EXPECT_EQ(type, kernels::GgmlType::kF32);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
      float third;
      std::memcpy(&third, t.data + 8, 4);
      EXPECT_EQ(third, 3.0f);
    } else {
      EXPECT_EQ(type, kernels::GgmlType::kBF16);
      EXPECT_EQ(t.nbytes, 4u);
    }
  }
}

TEST(SafetensorsTest, MalformedFilesAreErrorsNamingTheTensor) {
  const std::string data = Floats({1, 2, 3, 4});
  auto entry = [](json dtype, json shape, json offsets) {
    return json{{"t", {{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}}}};
  };
  struct Case {
    std::string bytes, needle;
  };
  const std::vector<Case> cases = {
      {"abc", "shorter than a header"},
      {std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}", "does not fit the file"},
      {Image("not json", data), "not a JSON object"},
      {Image(entry("F32", {2, 2}, {0, 32}), data), "outside the 16 bytes"},
      {Image(entry("F32", {3}, {0, 16}), data), "16 bytes for 3 F32 elements"},
      {Image(entry("Q4", {4}, {0, 16}), data), "unknown dtype Q4"},
      {Image(entry("F32", {-1}, {0, 16}), data), "bad shape"},
      {Image(entry("F32", {4}, {8, 4}), data), "outside"},
      {Image(json{{"t", {{"dtype", "F32"}}}}, data), "tensor t: needs dtype, shape"},
  };
  for (const Case& c : cases) {
    auto file = SafetensorsFile::FromBytes(c.bytes, "x.safetensors");
    ASSERT_FALSE(file.ok()) << c.needle;
    EXPECT_NE(file.status().message().find(c.needle), std::string::npos) << file.status();
    EXPECT_NE(file.status().message().find("x.safetensors"), std::string::npos);
  }
  // Integer tensors parse; only the loader refuses them as weights.
  auto ints = SafetensorsFile::FromBytes(Image(entry("I64", {2}, {0, 16}), data), "i");
  ASSERT_TRUE(ints.ok());
  kernels::GgmlType type;
  EXPECT_FALSE((*ints)->tensors()[0].KernelType(&type));
}

json Qwen3Config() {
  return {{"model_type", "qwen3"},         {"hidden_size", 1024},
          {"intermediate_size", 3072},     {"num_hidden_layers", 28},
          {"num_attention_heads", 16},     {"num_key_value_heads", 8},
          {"head_dim", 128},               {"max_position_embeddings", 40960},
          {"vocab_size", 151936},          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},       {"rope_scaling", nullptr},
          {"sliding_window", 4096},        {"use_sliding_window", false},
          {"tie_word_embeddings", true},   {"hidden_act", "silu"}};
}

TEST(HfConfigTest, ReadsAQwen3Config) {
  auto c = ModelConfig::FromHfConfig(Qwen3Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen3");
  EXPECT_EQ(c->num_layers, 28);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->context_length, 40960);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_TRUE(c->rope_halves);  // transformers' rotate_half
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
}

TEST(HfConfigTest, RopeParametersOfTransformers5AndLlama3Factors) {
  json config = Qwen3Config();
  config["model_type"] = "llama";
  config["head_dim"] = 32;
  config.erase("rope_theta");
  config.erase("rope_scaling");
  config.erase("sliding_window");  // Qwen's; a llama config with one would use it
  config["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0},
                               {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 8192}};
  auto c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_context_length, 8192);
  // transformers' ROPE_INIT_FUNCTIONS["llama3"] for this config: base / scaled frequencies.
  const std::vector<float> expected = {1, 1, 1, 1, 1, 1, 1, 1, 2.69453f, 8, 8, 8, 8, 8, 8, 8};
  const std::vector<float> factors = RopeFrequencyFactors(*c);
  ASSERT_EQ(factors.size(), expected.size());
  for (size_t i = 0; i < factors.size(); ++i) EXPECT_NEAR(factors[i], expected[i], 1e-4) << i;

  config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 2.0f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);  // neither spelling gives a theta: the default
}

TEST(HfConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"model_type", "gemma2", "config.json: model_type 'gemma2' is not supported"},
      {"model_type", "gemma3", "config.json: model_type 'gemma3' is Gemma 3's vision-language"},
      {"model_type", 7, "config.json: model_type '' is not supported"},
      {"hidden_act", "gelu", "config.json: hidden_act 'gelu' is not supported"},
      {"num_hidden_layers", nullptr, "config.json: num_hidden_layers is missing"},
      {"hidden_size", -4, "config.json: hidden_size must be a positive integer"},
      {"num_key_value_heads", 5, "not a multiple of the KV head count (5)"},
      {"rms_norm_eps", "small", "config.json: rms_norm_eps must be a number"},
      {"rope_scaling", json{{"rope_type", "dynamic"}, {"factor", 2.0}},
       "config.json: rope_scaling.rope_type 'dynamic' is not supported"},
      {"layer_types", json::array({"full_attention"}),
       "config.json: layer_types has 1 entries for 28 layers"},
  };
  for (const Case& c : cases) {
    json config = Qwen3Config();
    config[c.field] = c.value;
    auto parsed = ModelConfig::FromHfConfig(config);
    ASSERT_FALSE(parsed.ok()) << c.field;
    EXPECT_NE(parsed.status().message().find(c.needle), std::string::npos) << parsed.status();
  }
  EXPECT_FALSE(ModelConfig::FromHfConfig(json::array()).ok());
}

TEST(HfConfigTest, SlidingLayersAsEachFamilyWritesThem) {
  json config = Qwen3Config();
  config["num_hidden_layers"] = 4;
  auto c = ModelConfig::FromHfConfig(config);  // use_sliding_window false: no window
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sliding_layers.empty());
  EXPECT_EQ(c->WindowOf(3), 0);
  config["use_sliding_window"] = true;  // Qwen, no layer_types: from max_window_layers on
  config["max_window_layers"] = 1;
  c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_layers, (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(c->WindowOf(0), 0);
  EXPECT_EQ(c->WindowOf(1), 4096);
  config["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                           "full_attention"};  // transformers 5 lists them
  c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_layers, (std::vector<bool>{true, false, true, false}));
  config["layer_types"][2] = "chunked_attention";
  EXPECT_NE(ModelConfig::FromHfConfig(config).status().message().find(
                "config.json: layer_types[2] \"chunked_attention\" is not"),
            std::string::npos);
  config.erase("layer_types");
  config["model_type"] = "mistral";  // every layer
  c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->sliding_layers, std::vector<bool>(4, true));
  config["sliding_window"] = 40960;  // as long as the context: every layer global
  c = ModelConfig::FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sliding_layers.empty());
}

json Gemma3Config() {
  return {{"model_type", "gemma3_text"}, {"hidden_size", 640},
          {"intermediate_size", 2048},   {"num_hidden_layers", 7},
          {"num_attention_heads", 4},    {"num_key_value_heads", 1},
          {"head_dim", 256},             {"max_position_embeddings", 32768},
          {"vocab_size", 262144},        {"rms_norm_eps", 1e-6},
          {"query_pre_attn_scalar", 256}, {"sliding_window", 512},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"attn_logit_softcapping", nullptr}, {"final_logit_softcapping", nullptr},
          {"rope_parameters",
           {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0},
                                {"rope_theta", 1000000.0}}},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}};
}

TEST(HfConfigTest, ReadsAGemma3TextConfig) {
  auto c = ModelConfig::FromHfConfig(Gemma3Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "gemma3");
  EXPECT_FLOAT_EQ(c->embedding_scale, std::sqrt(640.0f));
  EXPECT_TRUE(c->post_norms);
  EXPECT_EQ(c->ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c->rope_theta_sliding, 10000.0f);
  // No layer_types: the pattern of 6, the sixth layer global.
  EXPECT_EQ(c->sliding_layers,
            (std::vector<bool>{true, true, true, true, true, false, true}));
  EXPECT_EQ(c->WindowOf(0), 512);
  EXPECT_EQ(c->WindowOf(5), 0);
  json unbounded = Gemma3Config();  // a window past the context: the rope bases still differ
  unbounded["sliding_window"] = 65536;
  c = ModelConfig::FromHfConfig(unbounded);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsSliding(0));
  EXPECT_FALSE(c->IsSliding(5));

  json older = Gemma3Config();  // transformers 4: rope_theta, rope_scaling, rope_local_base_freq
  older.erase("rope_parameters");
  older["rope_theta"] = 1000000.0;
  older["rope_local_base_freq"] = 20000.0;
  older["sliding_window_pattern"] = 2;
  c = ModelConfig::FromHfConfig(older);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta_sliding, 20000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c->sliding_layers,
            (std::vector<bool>{true, false, true, false, true, false, true}));

  using Case = std::tuple<std::string, json, std::string>;
  for (const auto& [field, value, needle] : std::vector<Case>{
           {"final_logit_softcapping", 30.0, "config.json: final_logit_softcapping is not"},
           {"hidden_activation", "gelu", "config.json: hidden_activation 'gelu' is not"},
           {"query_pre_attn_scalar", -1, "config.json: query_pre_attn_scalar must be positive"},
           {"use_bidirectional_attention", true, "use_bidirectional_attention is not"}}) {
    json config = Gemma3Config();
    config[field] = value;
    auto parsed = ModelConfig::FromHfConfig(config);
    EXPECT_NE(parsed.status().message().find(needle), std::string::npos) << parsed.status();
  }
}

}  // namespace
}  // namespace winnow::model
