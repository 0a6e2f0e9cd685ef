#include "server/http/openai_request.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/request_builder.h"

namespace winnow::server::http {
namespace {

// ordered_json keeps a JSON schema's property order: structured output generates in it.
using Json = nlohmann::ordered_json;

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// A present, non-null member, or nullptr: clients (and the OpenAI SDK) send null for unset.
const Json* Member(const Json& body, const std::string& key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<double>> Number(const Json& body, const std::string& key) {
  const Json* v = Member(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return Bad(key, "must be a number");
  return v->get<double>();
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& v, const std::string& field) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(field, "is out of range");
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return Bad(field, "must be an integer");
}

absl::StatusOr<std::optional<int64_t>> IntegerMember(const Json& body, const std::string& key) {
  const Json* v = Member(body, key);
  if (v == nullptr) return std::nullopt;
  return Integer(*v, key);
}

// An integer that must fit the proto's int32; its own range is request_builder's business.
absl::StatusOr<std::optional<int32_t>> Int32(const Json& body, const std::string& key) {
  WINNOW_ASSIGN_OR_RETURN(std::optional<int64_t> v, IntegerMember(body, key));
  if (!v.has_value()) return std::nullopt;
  if (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()) {
    return Bad(key, absl::StrCat(*v, " is out of range"));
  }
  return static_cast<int32_t>(*v);
}

absl::StatusOr<std::optional<bool>> Bool(const Json& body, const std::string& key) {
  const Json* v = Member(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return Bad(key, "must be true or false");
  return v->get<bool>();
}

absl::StatusOr<std::optional<std::string>> String(const Json& body, const std::string& key) {
  const Json* v = Member(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return Bad(key, "must be a string");
  return v->get<std::string>();
}

absl::StatusOr<std::vector<int32_t>> TokenIdArray(const Json& v, const std::string& field) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    WINNOW_ASSIGN_OR_RETURN(std::optional<int64_t> id, Integer(v[i], f));
    if (*id < std::numeric_limits<int32_t>::min() || *id > std::numeric_limits<int32_t>::max()) {
      return Bad(f, absl::StrCat("token id ", *id, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

bool AllIntegers(const Json& v) {
  for (const Json& e : v) {
    if (!e.is_number()) return false;
  }
  return true;
}

// prompt: a string, a list of token ids, or a list holding exactly one of either.
// One prompt (a string or a list of token ids) into `out`'s input.
absl::Status ParseOnePrompt(const Json& p, const std::string& field, v1::GenerateRequest* out) {
  if (p.is_string()) {
    out->set_prompt(p.get<std::string>());
    return absl::OkStatus();
  }
  if (p.is_array() && AllIntegers(p)) {
    if (p.empty()) return Bad(field, "must not be empty");
    WINNOW_ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIdArray(p, field));
    out->mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    return absl::OkStatus();
  }
  return Bad(field, "must be a string or a list of token ids");
}

// prompt: a string, a list of token ids, or a list of either (a batch: each prompt is its own
// choice, or n of them). `inputs` gets one request per prompt with only its input set.
absl::Status ParsePrompts(const Json& body, std::vector<v1::GenerateRequest>* inputs) {
  const Json* p = Member(body, "prompt");
  if (p == nullptr) return Bad("prompt", "is required");
  if (p->is_array() && p->empty()) return Bad("prompt", "must not be empty");
  if (p->is_string() || (p->is_array() && AllIntegers(*p))) {
    return ParseOnePrompt(*p, "prompt", &inputs->emplace_back());
  }
  if (!p->is_array()) return Bad("prompt", "must be a string or a list of token ids");
  if (p->size() > static_cast<size_t>(kMaxChoicesPerRequest)) {
    return Bad("prompt", absl::StrCat("at most ", kMaxChoicesPerRequest, " prompts"));
  }
  for (size_t i = 0; i < p->size(); ++i) {
    WINNOW_RETURN_IF_ERROR(
        ParseOnePrompt((*p)[i], absl::StrCat("prompt[", i, "]"), &inputs->emplace_back()));
  }
  return absl::OkStatus();
}

// One request per choice (see OpenAiRequest::choices).
absl::Status BuildChoices(const std::vector<v1::GenerateRequest>& inputs, OpenAiRequest* out) {
  const size_t count = inputs.empty() ? out->n : inputs.size() * out->n;
  if (count > static_cast<size_t>(kMaxChoicesPerRequest)) {
    return Bad("n", absl::StrCat("n times the prompts must be at most ", kMaxChoicesPerRequest,
                                 ", got ", count));
  }
  const size_t prompts = std::max<size_t>(inputs.size(), 1);
  for (size_t p = 0; p < prompts; ++p) {
    for (int j = 0; j < out->n; ++j) {
      v1::GenerateRequest& choice = out->choices.emplace_back(out->generate);
      if (!inputs.empty()) {
        if (inputs[p].has_token_ids()) {
          *choice.mutable_token_ids() = inputs[p].token_ids();
        } else {
          choice.set_prompt(inputs[p].prompt());
        }
      }
      v1::SamplingParams* s = choice.mutable_sampling();
      if (j > 0 && s->has_seed()) s->set_seed(SampleSeed(s->seed(), j));
    }
  }
  return absl::OkStatus();
}

// content: a string, null (an assistant turn without text), or a list of text parts.
absl::StatusOr<std::string> MessageContent(const Json& msg, const std::string& field) {
  const Json* c = Member(msg, "content");
  if (c == nullptr) return std::string();
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) return Bad(field, "must be a string or a list of content parts");
  std::string text;
  for (size_t j = 0; j < c->size(); ++j) {
    const Json& part = (*c)[j];
    const std::string pf = absl::StrCat(field, "[", j, "]");
    if (!part.is_object()) return Bad(pf, "must be an object");
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> type, String(part, "type"));
    if (type.value_or("") != "text") {
      return Bad(pf + ".type", absl::StrCat("only text parts are supported, got '",
                                            type.value_or(""), "'"));
    }
    const Json* t = Member(part, "text");
    if (t == nullptr || !t->is_string()) return Bad(pf + ".text", "must be a string");
    text += t->get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": "<JSON text>"}}], as the SDK sends its earlier replies back.
absl::Status ParseToolCalls(const Json& msg, const std::string& field, v1::ChatMessage* out) {
  const Json* calls = Member(msg, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (!calls->is_array()) return Bad(field, "must be a list of tool calls");
  for (size_t j = 0; j < calls->size(); ++j) {
    const Json& call = (*calls)[j];
    const std::string at = absl::StrCat(field, "[", j, "]");
    const Json* function = call.is_object() ? Member(call, "function") : nullptr;
    if (function == nullptr || !function->is_object()) {
      return Bad(at + ".function", "must be an object with name and arguments");
    }
    v1::ToolCall* out_call = out->add_tool_calls();
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> id, String(call, "id"));
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> name, String(*function, "name"));
    if (!name) return Bad(at + ".function.name", "is required");
    out_call->set_id(id.value_or(""));
    out_call->set_name(*name);
    const Json* arguments = Member(*function, "arguments");
    // The SDK sends a JSON string; an object is taken as is.
    out_call->set_arguments(arguments == nullptr ? "{}"
                            : arguments->is_string() ? arguments->get<std::string>()
                                                     : arguments->dump());
  }
  return absl::OkStatus();
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}].
absl::Status ParseToolList(const Json& body, v1::ChatMessages* chat) {
  const Json* tools = Member(body, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return Bad("tools", "must be a list of tools");
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) return Bad(at, "must be an object");
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> type, String(tool, "type"));
    if (type.value_or("function") != "function") {
      return Bad(at + ".type", absl::StrCat("only function tools are supported, got '",
                                            *type, "'"));
    }
    const Json* function = Member(tool, "function");
    if (function == nullptr || !function->is_object()) {
      return Bad(at + ".function", "must be an object with a name");
    }
    v1::Tool* out = chat->add_tools();
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> name, String(*function, "name"));
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> description,
                            String(*function, "description"));
    out->set_name(name.value_or(""));
    out->set_description(description.value_or(""));
    if (const Json* parameters = Member(*function, "parameters"); parameters != nullptr) {
      out->set_parameters(parameters->dump());
    }
  }
  return absl::OkStatus();
}

// tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name"}};
// parallel_tool_calls. Values are checked against the tools by the request builder.
absl::Status ParseToolChoice(const Json& body, v1::ChatMessages* chat) {
  if (const Json* choice = Member(body, "tool_choice"); choice != nullptr) {
    if (choice->is_string()) {
      chat->set_tool_choice(choice->get<std::string>());
    } else {
      const Json* function = choice->is_object() ? Member(*choice, "function") : nullptr;
      const Json* name = function != nullptr && function->is_object()
                             ? Member(*function, "name") : nullptr;
      if (name != nullptr && name->is_string()) chat->set_tool_choice(name->get<std::string>());
    }
    if (chat->tool_choice().empty()) {
      return Bad("tool_choice", "must be auto, none, required or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}");
    }
  }
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> parallel, Bool(body, "parallel_tool_calls"));
  if (parallel) chat->set_parallel_tool_calls(*parallel);
  return absl::OkStatus();
}

absl::Status ParseMessages(const Json& body, v1::GenerateRequest* out) {
  const Json* m = Member(body, "messages");
  if (m == nullptr) return Bad("messages", "is required");
  if (!m->is_array()) return Bad("messages", "must be a list of messages");
  v1::ChatMessages* chat = out->mutable_chat();
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return Bad(field, "must be an object with role and content");
    const Json* role = Member(msg, "role");
    if (role == nullptr || !role->is_string()) return Bad(field + ".role", "must be a string");
    WINNOW_ASSIGN_OR_RETURN(std::string content, MessageContent(msg, field + ".content"));
    v1::ChatMessage* out_msg = chat->add_messages();
    // "developer" passes through: templates that do not know it render it as "system"
    // (model::ChatTemplate::Apply).
    out_msg->set_role(role->get_ref<const std::string&>());
    out_msg->set_content(std::move(content));
    WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> tool_call_id, String(msg, "tool_call_id"));
    if (tool_call_id) out_msg->set_tool_call_id(*tool_call_id);
    WINNOW_RETURN_IF_ERROR(ParseToolCalls(msg, field + ".tool_calls", out_msg));
  }
  WINNOW_RETURN_IF_ERROR(ParseToolList(body, chat));
  return ParseToolChoice(body, chat);
}

absl::Status ParseStop(const Json& body, v1::StoppingCriteria* stopping) {
  if (const Json* stop = Member(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      stopping->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return Bad(absl::StrCat("stop[", i, "]"), "must be a string");
        stopping->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  }
  if (const Json* ids = Member(body, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return Bad("stop_token_ids", "must be a list of token ids");
    WINNOW_ASSIGN_OR_RETURN(std::vector<int32_t> v, TokenIdArray(*ids, "stop_token_ids"));
    stopping->mutable_stop_token_ids()->Add(v.begin(), v.end());
  }
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, Bool(body, "ignore_eos"));
  stopping->set_ignore_eos(ignore_eos.value_or(false));
  return absl::OkStatus();
}

// logit_bias: {"<token id>": bias}; the ids are strings in JSON. Ranges are checked by the
// request builder.
absl::Status ParseLogitBias(const Json& body, v1::SamplingParams* s) {
  const Json* bias = Member(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) return Bad("logit_bias", "must be an object of token id: bias");
  for (const auto& [key, value] : bias->items()) {
    const std::string field = absl::StrCat("logit_bias[", key, "]");
    int32_t id = 0;
    if (!absl::SimpleAtoi(key, &id)) return Bad(field, "the key must be a token id");
    if (!value.is_number()) return Bad(field, "must be a number");
    (*s->mutable_logit_bias())[id] = value.get<float>();
  }
  return absl::OkStatus();
}

// response_format: text (the default), json_object, or json_schema with the schema under
// json_schema.schema (OpenAI's shape; name, description and strict are accepted: the output
// always follows the schema strictly).
absl::Status ParseResponseFormat(const Json& body, v1::ResponseFormat* out) {
  const Json* rf = Member(body, "response_format");
  if (rf == nullptr) return absl::OkStatus();
  if (!rf->is_object()) return Bad("response_format", "must be an object");
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> type, String(*rf, "type"));
  if (!type || *type == "text") return absl::OkStatus();
  if (*type == "json_object") {
    out->set_json_object(true);
    return absl::OkStatus();
  }
  if (*type != "json_schema") {
    return Bad("response_format.type",
               absl::StrCat("must be text, json_object or json_schema, got \"", *type, "\""));
  }
  const Json* js = Member(*rf, "json_schema");
  if (js == nullptr || !js->is_object()) {
    return Bad("response_format.json_schema", "must be an object with a \"schema\"");
  }
  const Json* schema = Member(*js, "schema");
  if (schema == nullptr) return Bad("response_format.json_schema.schema", "is required");
  out->set_json_schema(schema->dump());
  return absl::OkStatus();
}

absl::Status ParseSampling(const Json& body, v1::SamplingParams* s) {
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> temperature, Number(body, "temperature"));
  // Unset, the handler gives the model's default, else OpenAI's 1 (gRPC's is greedy).
  if (temperature) s->set_temperature(static_cast<float>(*temperature));
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> top_p, Number(body, "top_p"));
  if (top_p) s->set_top_p(static_cast<float>(*top_p));
  WINNOW_ASSIGN_OR_RETURN(std::optional<int32_t> top_k, Int32(body, "top_k"));
  // vLLM spells "off" as -1; winnow as 0.
  if (top_k) s->set_top_k(*top_k == -1 ? 0 : *top_k);
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> min_p, Number(body, "min_p"));
  if (min_p) s->set_min_p(static_cast<float>(*min_p));
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> rep, Number(body, "repetition_penalty"));
  if (rep) s->set_repetition_penalty(static_cast<float>(*rep));
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> freq, Number(body, "frequency_penalty"));
  if (freq) s->set_frequency_penalty(static_cast<float>(*freq));
  WINNOW_ASSIGN_OR_RETURN(std::optional<double> pres, Number(body, "presence_penalty"));
  if (pres) s->set_presence_penalty(static_cast<float>(*pres));
  WINNOW_ASSIGN_OR_RETURN(std::optional<int64_t> seed, IntegerMember(body, "seed"));
  if (seed) s->set_seed(static_cast<uint64_t>(*seed));  // negative seeds wrap; still fixed
  return ParseLogitBias(body, s);
}

// kv_compression's scope, context_tokens, context_messages, stage_tokens and probe
// (CompressionSpec's).
absl::Status ParseCompressionScope(const Json& c, v1::CompressionSpec* out) {
  if (const Json* scope = Member(c, "scope"); scope != nullptr) {
    if (!scope->is_string()) return Bad("kv_compression.scope", "must be a string");
    out->set_scope(scope->get<std::string>());
  }
  if (const Json* probe = Member(c, "probe"); probe != nullptr) {
    if (!probe->is_string()) return Bad("kv_compression.probe", "must be a string");
    out->set_probe(probe->get<std::string>());
  }
  for (const char* key : {"context_tokens", "context_messages", "stage_tokens"}) {
    const Json* v = Member(c, key);
    if (v == nullptr) continue;
    const std::string field = absl::StrCat("kv_compression.", key);
    WINNOW_ASSIGN_OR_RETURN(const std::optional<int64_t> n, Integer(*v, field));
    if (*n < 0 || *n > std::numeric_limits<int32_t>::max()) {
      return Bad(field, absl::StrCat(*n, " is out of range"));
    }
    if (std::string(key) == "context_tokens") {
      out->set_context_tokens(static_cast<int32_t>(*n));
    } else if (std::string(key) == "context_messages") {
      out->set_context_messages(static_cast<int32_t>(*n));
    } else {
      out->set_stage_tokens(static_cast<int32_t>(*n));
    }
  }
  return absl::OkStatus();
}

// kv_compression: {policy, budget, params: {name: number}, options: {name: string}, scope,
// context_tokens, context_messages, stage_tokens, probe}, winnow's CompressionSpec under an
// extension name (extra body fields, as vLLM takes them).
absl::Status ParseCompression(const Json& body, v1::CompressionSpec* out) {
  const Json* c = Member(body, "kv_compression");
  if (c == nullptr) return absl::OkStatus();
  if (!c->is_object()) return Bad("kv_compression", "must be an object");
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> policy, String(*c, "policy"));
  if (!policy) return Bad("kv_compression.policy", "is required");
  out->set_policy(*policy);
  const Json* budget = Member(*c, "budget");
  if (budget != nullptr) {
    if (!budget->is_number()) return Bad("kv_compression.budget", "must be a number");
    out->set_budget(budget->get<double>());
  }
  if (const Json* params = Member(*c, "params"); params != nullptr) {
    if (!params->is_object()) return Bad("kv_compression.params", "must be an object");
    for (const auto& [k, v] : params->items()) {
      if (v.is_boolean()) {
        (*out->mutable_params())[k] = v.get<bool>() ? 1.0 : 0.0;
      } else if (v.is_number()) {
        (*out->mutable_params())[k] = v.get<double>();
      } else {
        return Bad(absl::StrCat("kv_compression.params.", k),
                   "must be a number (string values go in kv_compression.options)");
      }
    }
  }
  if (const Json* options = Member(*c, "options"); options != nullptr) {
    if (!options->is_object()) return Bad("kv_compression.options", "must be an object");
    for (const auto& [k, v] : options->items()) {
      if (!v.is_string()) {
        return Bad(absl::StrCat("kv_compression.options.", k),
                   "must be a string (numbers go in kv_compression.params)");
      }
      (*out->mutable_options())[k] = v.get<std::string>();
    }
  }
  WINNOW_RETURN_IF_ERROR(ParseCompressionScope(*c, out));
  for (const auto& [k, v] : c->items()) {
    if (k != "policy" && k != "budget" && k != "params" && k != "options" && k != "scope" &&
        k != "context_tokens" && k != "context_messages" && k != "stage_tokens" &&
        k != "probe") {
      return Bad(absl::StrCat("kv_compression.", k),
                 "unknown field (known: policy, budget, params, options, scope, context_tokens, "
                 "context_messages, stage_tokens, probe)");
    }
  }
  return absl::OkStatus();
}

// OpenAI features winnow does not have. Sending one with a non-default value is a 400 naming
// it, rather than a silently different answer.
absl::Status RejectUnsupported(const Json& body) {
  WINNOW_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, IntegerMember(body, "best_of"));
  if (best_of && *best_of != 1) {
    return Bad("best_of", absl::StrCat("only best_of = 1 is supported, got ", *best_of));
  }
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> suffix, String(body, "suffix"));
  if (suffix && !suffix->empty()) {
    return Bad("suffix", "is not supported: the served models have no fill-in-the-middle "
                         "template");
  }
  for (const char* key : {"functions", "function_call"}) {
    if (Member(body, key) != nullptr) {
      return Bad(key, "is not supported: send tools and tool_choice instead");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLogprobs(const Json& body, OpenAiRequest* out) {
  v1::GenerateRequest& g = out->generate;
  if (out->endpoint == Endpoint::kCompletions) {
    // Completions: logprobs is the number of alternatives per token (0: only the chosen one).
    WINNOW_ASSIGN_OR_RETURN(std::optional<int32_t> n, Int32(body, "logprobs"));
    if (n) {
      out->logprobs = true;
      g.set_logprobs(true);
      g.set_top_logprobs(*n);
      // Echo returns the prompt's tokens with theirs.
      if (out->echo) g.set_prompt_logprobs(*n);
    }
    return absl::OkStatus();
  }
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> lp, Bool(body, "logprobs"));
  WINNOW_ASSIGN_OR_RETURN(std::optional<int32_t> top, Int32(body, "top_logprobs"));
  out->logprobs = lp.value_or(false);
  if (top && *top > 0 && !out->logprobs) {
    return Bad("top_logprobs", "needs logprobs: true");
  }
  g.set_logprobs(out->logprobs);
  if (top) g.set_top_logprobs(*top);
  return absl::OkStatus();
}

absl::Status ParseLimits(const Json& body, OpenAiRequest* out) {
  v1::StoppingCriteria* stopping = out->generate.mutable_stopping();
  std::optional<int32_t> max_tokens;
  if (out->endpoint == Endpoint::kChat) {
    WINNOW_ASSIGN_OR_RETURN(max_tokens, Int32(body, "max_completion_tokens"));
    if (max_tokens) out->max_tokens_field = "max_completion_tokens";
  }
  if (!max_tokens) {
    WINNOW_ASSIGN_OR_RETURN(max_tokens, Int32(body, "max_tokens"));
  }
  // OpenAI's completions default is 16 tokens; chat leaves it to the server (winnow's default).
  if (!max_tokens && out->endpoint == Endpoint::kCompletions) max_tokens = 16;
  // Echo with max_tokens 0 scores the prompt only (loglikelihood evaluations): the engine
  // generates one token, which the response leaves out.
  if (max_tokens == 0 && out->echo) {
    out->echo_only = true;
    max_tokens = 1;
  }
  if (max_tokens) stopping->set_max_tokens(*max_tokens);
  return ParseStop(body, stopping);
}

absl::Status ParseBody(const Json& body, OpenAiRequest* out) {
  if (!body.is_object()) return Bad("body", "must be a JSON object");
  WINNOW_RETURN_IF_ERROR(RejectUnsupported(body));
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> model, String(body, "model"));
  out->model = model.value_or("");
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> stream, Bool(body, "stream"));
  out->stream = stream.value_or(false);
  if (const Json* so = Member(body, "stream_options"); so != nullptr) {
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    const Json* usage = Member(*so, "include_usage");
    if (usage != nullptr && !usage->is_boolean()) {
      return Bad("stream_options.include_usage", "must be true or false");
    }
    out->include_usage = usage != nullptr && usage->get<bool>();
  }
  v1::GenerateRequest& g = out->generate;
  std::vector<v1::GenerateRequest> inputs;  // completions: one per prompt
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> echo, Bool(body, "echo"));
  if (echo.value_or(false) && out->endpoint == Endpoint::kChat) {
    return Bad("echo", "is for /v1/completions");
  }
  out->echo = echo.value_or(false);
  if (out->endpoint == Endpoint::kChat) {
    WINNOW_RETURN_IF_ERROR(ParseMessages(body, &g));
  } else {
    for (const char* key : {"tools", "tool_choice"}) {
      if (Member(body, key) != nullptr) return Bad(key, "is for /v1/chat/completions");
    }
    WINNOW_RETURN_IF_ERROR(ParsePrompts(body, &inputs));
    g.set_prompt(inputs[0].prompt());
    if (inputs[0].has_token_ids()) *g.mutable_token_ids() = inputs[0].token_ids();
  }
  WINNOW_ASSIGN_OR_RETURN(std::optional<int64_t> n, IntegerMember(body, "n"));
  if (n && (*n < 1 || *n > kMaxChoicesPerPrompt)) {
    return Bad("n", absl::StrCat("must be in [1, ", kMaxChoicesPerPrompt, "], got ", *n));
  }
  out->n = static_cast<int>(n.value_or(1));
  out->tools = g.has_chat() && g.chat().tools_size() > 0 && g.chat().tool_choice() != "none";
  WINNOW_ASSIGN_OR_RETURN(std::optional<bool> add_special, Bool(body, "add_special_tokens"));
  if (add_special) g.set_add_special_tokens(*add_special);
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> request_id, String(body, "request_id"));
  if (request_id) g.set_request_id(*request_id);
  // vLLM's prefix-cache isolation: requests share cached prompt blocks only with the same salt.
  WINNOW_ASSIGN_OR_RETURN(std::optional<std::string> cache_salt, String(body, "cache_salt"));
  if (cache_salt) g.set_cache_salt(*cache_salt);
  WINNOW_ASSIGN_OR_RETURN(std::optional<int32_t> priority, Int32(body, "priority"));
  g.set_priority(priority.value_or(0));
  WINNOW_RETURN_IF_ERROR(ParseSampling(body, g.mutable_sampling()));
  WINNOW_RETURN_IF_ERROR(ParseLimits(body, out));
  WINNOW_RETURN_IF_ERROR(ParseLogprobs(body, out));
  WINNOW_RETURN_IF_ERROR(ParseResponseFormat(body, g.mutable_response_format()));
  WINNOW_RETURN_IF_ERROR(ParseCompression(body, g.mutable_compression()));
  return BuildChoices(inputs, out);
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, const std::string& body) {
  Json json = Json::parse(body, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError("body: not valid JSON");
  }
  OpenAiRequest out;
  out.endpoint = endpoint;
  WINNOW_RETURN_IF_ERROR(ParseBody(json, &out));
  return out;
}

std::string OpenAiFieldMessage(const OpenAiRequest& request, const std::string& message,
                               std::string* param) {
  const bool chat = request.endpoint == Endpoint::kChat;
  // Most specific first: "stopping.stop_token_ids" before "stopping.stop".
  const std::vector<std::pair<std::string, std::string>> renames = {
      {"stopping.max_tokens", request.max_tokens_field},
      {"stopping.stop_token_ids", "stop_token_ids"},
      {"stopping.stop", "stop"},
      {"stopping.ignore_eos", "ignore_eos"},
      {"response_format.json_schema", "response_format.json_schema.schema"},
      {"sampling.top_logprobs", chat ? "top_logprobs" : "logprobs"},
      {"top_logprobs", chat ? "top_logprobs" : "logprobs"},
      {"prompt_logprobs", "echo"},
      {"sampling.", ""},
      {"compression", "kv_compression"},
      {"chat.messages", "messages"},
      {"chat.tools", "tools"},
      {"chat.tool_choice", "tool_choice"},
      {"chat", "messages"},
      {"token_ids.ids", "prompt"},
      {"input", chat ? "messages" : "prompt"},
  };
  std::string out = message;
  for (const auto& [wire, openai] : renames) {
    if (out.rfind(wire, 0) != 0) continue;
    const bool prefix_only = wire.back() == '.';
    const char next = out.size() > wire.size() ? out[wire.size()] : '\0';
    if (!prefix_only && next != '\0' && next != '.' && next != '[' && next != ':' &&
        next != ' ') {
      continue;
    }
    out = openai + out.substr(wire.size());
    break;
  }
  const size_t end = out.find_first_of(": ");
  *param = end == std::string::npos ? "" : out.substr(0, end);
  return out;
}

}  // namespace winnow::server::http
