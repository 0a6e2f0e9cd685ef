#include "model/hf_loader.h"

#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "kernels/cpu/dequantize.h"
#include "model/safetensors.h"
#include "model/sampler.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

namespace fs = std::filesystem;
using kernels::WeightMatrix;
using nlohmann::json;

// The JSON file `name` in `dir`; null when it is absent and optional.
absl::StatusOr<json> ReadJson(const fs::path& dir, const std::string& name, bool required) {
  const std::optional<std::string> text = base::ReadWholeFile((dir / name).string());
  if (!text.has_value()) {
    if (!required) return json();
    return absl::NotFoundError(absl::StrCat((dir / name).string(), " is missing"));
  }
  json parsed = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat((dir / name).string(), ": not valid JSON"));
  }
  return parsed;
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Tensor lookups that check shape and dtype, naming the tensor and its shard in errors.
class Tensors {
 public:
  explicit Tensors(const SafetensorsCheckpoint& checkpoint) : checkpoint_(checkpoint) {}

  bool Has(const std::string& name) const { return checkpoint_.Find(name) != nullptr; }

  // `shape` outermost first (torch's order): a linear layer's weight is [out, in].
  absl::StatusOr<const SafetensorsTensor*> Get(const std::string& name,
                                               const std::vector<int64_t>& shape,
                                               kernels::GgmlType* type) const {
    const SafetensorsTensor* t = checkpoint_.Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
    }
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(*t->file, ": tensor ", name, " has shape ",
                                                     Shape(t->shape), ", expected ",
                                                     Shape(shape)));
    }
    if (!t->KernelType(type)) {
      return absl::InvalidArgumentError(absl::StrCat(*t->file, ": tensor ", name, " is ",
                                                     t->dtype, "; weights must be F32, F16 or "
                                                     "BF16"));
    }
    return t;
  }

  absl::StatusOr<WeightMatrix> Matrix(const std::string& name, int64_t rows,
                                      int64_t cols) const {
    kernels::GgmlType type;
    WINNOW_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, {rows, cols}, &type));
    return WeightMatrix{type, rows, cols, static_cast<int64_t>(t->nbytes) / rows, t->data};
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) const {
    kernels::GgmlType type;
    WINNOW_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, {n}, &type));
    std::vector<float> out(n);
    WINNOW_RETURN_IF_ERROR(kernels::DequantizeRow(type, t->data, n, out.data()));
    return out;
  }

 private:
  const SafetensorsCheckpoint& checkpoint_;
};

// An RMSNorm weight as the forward multiplies by it: Gemma's norms scale by (1 + weight), which
// llama.cpp's converter stores as such and transformers does not.
absl::StatusOr<std::vector<float>> NormWeight(const Tensors& t, const ModelConfig& c,
                                              const std::string& name, int64_t n) {
  WINNOW_ASSIGN_OR_RETURN(std::vector<float> w, t.Vector(name, n));
  if (c.architecture == "gemma3") {
    for (float& x : w) x += 1.0f;
  }
  return w;
}

// One decoder layer's tensors, named as transformers' Llama / Qwen2 / Qwen3 / Gemma 3 modules
// name them (Gemma's post_attention_layernorm follows the attention; its MLP's norm is
// pre_feedforward_layernorm).
absl::StatusOr<LayerWeights> LoadLayer(const Tensors& t, const ModelConfig& c, int32_t layer) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  LayerWeights L;
  WINNOW_ASSIGN_OR_RETURN(L.attn_norm, NormWeight(t, c, p + "input_layernorm.weight", hidden));
  WINNOW_ASSIGN_OR_RETURN(L.wq, t.Matrix(p + "self_attn.q_proj.weight", q_dim, hidden));
  WINNOW_ASSIGN_OR_RETURN(L.wk, t.Matrix(p + "self_attn.k_proj.weight", kv_dim, hidden));
  WINNOW_ASSIGN_OR_RETURN(L.wv, t.Matrix(p + "self_attn.v_proj.weight", kv_dim, hidden));
  WINNOW_ASSIGN_OR_RETURN(L.wo, t.Matrix(p + "self_attn.o_proj.weight", hidden, q_dim));
  if (c.qkv_bias) {
    WINNOW_ASSIGN_OR_RETURN(L.bq, t.Vector(p + "self_attn.q_proj.bias", q_dim));
    WINNOW_ASSIGN_OR_RETURN(L.bk, t.Vector(p + "self_attn.k_proj.bias", kv_dim));
    WINNOW_ASSIGN_OR_RETURN(L.bv, t.Vector(p + "self_attn.v_proj.bias", kv_dim));
  }
  if (c.qk_norm) {
    WINNOW_ASSIGN_OR_RETURN(L.q_norm,
                            NormWeight(t, c, p + "self_attn.q_norm.weight", c.head_dim));
    WINNOW_ASSIGN_OR_RETURN(L.k_norm,
                            NormWeight(t, c, p + "self_attn.k_norm.weight", c.head_dim));
  }
  if (c.post_norms) {
    WINNOW_ASSIGN_OR_RETURN(L.post_attn_norm,
                            NormWeight(t, c, p + "post_attention_layernorm.weight", hidden));
    WINNOW_ASSIGN_OR_RETURN(L.ffn_norm,
                            NormWeight(t, c, p + "pre_feedforward_layernorm.weight", hidden));
    WINNOW_ASSIGN_OR_RETURN(L.post_ffn_norm,
                            NormWeight(t, c, p + "post_feedforward_layernorm.weight", hidden));
  } else {
    WINNOW_ASSIGN_OR_RETURN(L.ffn_norm,
                            NormWeight(t, c, p + "post_attention_layernorm.weight", hidden));
  }
  WINNOW_ASSIGN_OR_RETURN(L.w_gate, t.Matrix(p + "mlp.gate_proj.weight", c.ffn_size, hidden));
  WINNOW_ASSIGN_OR_RETURN(L.w_up, t.Matrix(p + "mlp.up_proj.weight", c.ffn_size, hidden));
  WINNOW_ASSIGN_OR_RETURN(L.w_down, t.Matrix(p + "mlp.down_proj.weight", hidden, c.ffn_size));
  return L;
}

// Every weight; completes the config with what only the tensors say (QKV biases, QK-norm) and
// what config.json says of the output (tied embeddings).
absl::StatusOr<ModelWeights> LoadWeights(const Tensors& t, const json& config, ModelConfig& c) {
  ModelWeights w;
  WINNOW_ASSIGN_OR_RETURN(w.token_embd,
                          t.Matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size));
  WINNOW_ASSIGN_OR_RETURN(w.output_norm, NormWeight(t, c, "model.norm.weight", c.hidden_size));
  // transformers does not save a tied lm_head.
  const json& tie = config.contains("tie_word_embeddings") ? config["tie_word_embeddings"] : json();
  c.tied_embeddings = !t.Has("lm_head.weight") && (!tie.is_boolean() || tie.get<bool>());
  if (c.tied_embeddings) {
    w.output = w.token_embd;
  } else {
    WINNOW_ASSIGN_OR_RETURN(w.output, t.Matrix("lm_head.weight", c.vocab_size, c.hidden_size));
  }
  c.qkv_bias = t.Has("model.layers.0.self_attn.q_proj.bias");
  c.qk_norm = t.Has("model.layers.0.self_attn.q_norm.weight");
  w.layers.reserve(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    WINNOW_ASSIGN_OR_RETURN(LayerWeights layer, LoadLayer(t, c, l));
    w.layers.push_back(std::move(layer));
  }
  if (c.rope_scaling.type == RopeScalingType::kLlama3) {
    w.rope_freq_factors = RopeFrequencyFactors(c);
  }
  return w;
}

// A special token as tokenizer_config.json writes it: a string, or {"content": ...}.
std::string TokenContent(const json& tokenizer_config, const char* key) {
  if (!tokenizer_config.is_object() || !tokenizer_config.contains(key)) return "";
  const json& v = tokenizer_config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// eos_token_id of config.json or generation_config.json: a number or a list of them.
std::vector<int32_t> TokenIds(const json& obj, const char* key) {
  std::vector<int32_t> ids;
  if (!obj.is_object() || !obj.contains(key)) return ids;
  const json& v = obj[key];
  for (const json& id : v.is_array() ? v : json::array({v})) {
    if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// BOS, EOS and the end-of-generation ids from the directory's configs, over the tokenizer's own
// guesses: generation_config.json's eos_token_id list is what transformers' generate stops on.
void ApplySpecialTokens(Tokenizer& tokenizer, const json& config, const json& generation,
                        const json& tokenizer_config) {
  auto id_of = [&](const std::string& text) {
    return text.empty() ? -1 : tokenizer.FindSpecial(text);
  };
  int32_t bos = id_of(TokenContent(tokenizer_config, "bos_token"));
  const std::vector<int32_t> config_bos = TokenIds(config, "bos_token_id");
  if (bos < 0 && !config_bos.empty()) bos = config_bos[0];
  std::vector<int32_t> eog = TokenIds(generation, "eos_token_id");
  for (int32_t id : TokenIds(config, "eos_token_id")) eog.push_back(id);
  int32_t eos = id_of(TokenContent(tokenizer_config, "eos_token"));
  if (eos < 0 && !eog.empty()) eos = eog[0];
  tokenizer.SetSpecialIds(bos, eos, eog);
}

// generation_config.json's sampling fields; others (do_sample, max_new_tokens) are not read.
GenerationDefaults ReadGenerationDefaults(const json& generation) {
  GenerationDefaults d;
  if (!generation.is_object()) return d;
  auto number = [&](const char* key) -> std::optional<float> {
    if (!generation.contains(key) || !generation[key].is_number()) return std::nullopt;
    return generation[key].get<float>();
  };
  d.temperature = number("temperature");
  d.top_p = number("top_p");
  d.min_p = number("min_p");
  d.repetition_penalty = number("repetition_penalty");
  if (generation.contains("top_k") && generation["top_k"].is_number_integer()) {
    d.top_k = generation["top_k"].get<int32_t>();
  }
  return d;
}

// The defaults must be valid sampling parameters, or every request leaving one unset would fail.
absl::Status CheckGenerationDefaults(const GenerationDefaults& d, const fs::path& dir) {
  SamplingParams p;
  p.temperature = d.temperature.value_or(p.temperature);
  p.top_p = d.top_p.value_or(p.top_p);
  p.top_k = d.top_k.value_or(p.top_k);
  p.min_p = d.min_p.value_or(p.min_p);
  p.repetition_penalty = d.repetition_penalty.value_or(p.repetition_penalty);
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat((dir / "generation_config.json").string(), ": ", s.message()));
  }
  return absl::OkStatus();
}

// The template: --chat-template's file, else chat_template.jinja (transformers 5), else
// tokenizer_config.json's chat_template (a string, or named templates: "default").
absl::StatusOr<ChatTemplate> LoadChatTemplate(const fs::path& dir, const json& tokenizer_config,
                                              const std::string& template_path) {
  std::optional<std::string> text;
  std::string source;
  if (!template_path.empty()) {
    text = base::ReadWholeFile(template_path);
    source = "--chat-template " + template_path;
    if (!text.has_value()) return absl::NotFoundError(absl::StrCat(source, ": cannot be read"));
  } else if ((text = base::ReadWholeFile((dir / "chat_template.jinja").string()))) {
    source = (dir / "chat_template.jinja").string();
  } else if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template")) {
    source = (dir / "tokenizer_config.json").string() + ": chat_template";
    const json& stored = tokenizer_config["chat_template"];
    if (stored.is_string()) text = stored.get<std::string>();
    for (const json& named : stored.is_array() ? stored : json::array()) {
      if (named.is_object() && named.contains("name") && named["name"] == "default" &&
          named.contains("template") && named["template"].is_string()) {
        text = named["template"].get<std::string>();
      }
    }
  }
  if (!text.has_value()) {
    return absl::FailedPreconditionError(
        "model has no chat template (chat_template.jinja or tokenizer_config.json's "
        "chat_template); send a raw prompt instead, or serve with --chat-template FILE");
  }
  SpecialTokens special{TokenContent(tokenizer_config, "bos_token"),
                        TokenContent(tokenizer_config, "eos_token"),
                        TokenContent(tokenizer_config, "unk_token"),
                        TokenContent(tokenizer_config, "pad_token")};
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::FromTemplateText(*text, std::move(special));
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat(source, ": ", tmpl.status().message()));
  }
  return tmpl;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadHfModel(const std::string& dir,
                                                   const std::string& chat_template_path) {
  const fs::path root(dir);
  WINNOW_ASSIGN_OR_RETURN(const json config, ReadJson(root, "config.json", true));
  WINNOW_ASSIGN_OR_RETURN(const json generation, ReadJson(root, "generation_config.json", false));
  WINNOW_ASSIGN_OR_RETURN(const json tokenizer_config,
                          ReadJson(root, "tokenizer_config.json", false));
  Model::Parts parts;
  WINNOW_ASSIGN_OR_RETURN(parts.config, ModelConfig::FromHfConfig(config));
  parts.config.name = root.filename().empty() ? root.parent_path().filename().string()
                                              : root.filename().string();

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromTokenizerJsonFile((root / "tokenizer.json").string());
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat((root / "tokenizer.json").string(), ": ",
                                     tokenizer.status().message()));
  }
  parts.tokenizer = *std::move(tokenizer);
  // Embedding tables are often padded past the tokenizer (Qwen: 151,936 rows for 151,665
  // tokens); ids past the tokenizer decode to nothing.
  if (parts.tokenizer->vocab_size() > parts.config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json has ", parts.tokenizer->vocab_size(),
                     " tokens but config.json's vocab_size is ", parts.config.vocab_size));
  }
  ApplySpecialTokens(*parts.tokenizer, config, generation, tokenizer_config);
  parts.generation_defaults = ReadGenerationDefaults(generation);
  WINNOW_RETURN_IF_ERROR(CheckGenerationDefaults(parts.generation_defaults, root));
  parts.chat_template = LoadChatTemplate(root, tokenizer_config, chat_template_path);
  // The operator's own template must work; a model's may fail (chat is then refused, saying why).
  if (!chat_template_path.empty() && !parts.chat_template.ok()) return parts.chat_template.status();

  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                          SafetensorsCheckpoint::Open(dir));
  absl::StatusOr<ModelWeights> weights = LoadWeights(Tensors(*checkpoint), config, parts.config);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(),
                        absl::StrCat(dir, ": ", weights.status().message()));
  }
  parts.weights = *std::move(weights);
  parts.storage = std::shared_ptr<const void>(std::move(checkpoint));
  return std::make_unique<Model>(std::move(parts));
}

}  // namespace winnow::model
