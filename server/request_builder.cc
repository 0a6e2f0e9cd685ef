#include "server/request_builder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "cache/compression.h"
#include "nlohmann/json.hpp"
#include "structured/grammar_cache.h"

namespace winnow::server {
namespace {

// compression.stage_tokens unset: a stage as long as a repeat probe's segment.
constexpr int32_t kDefaultStageTokens = 512;

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids,
                           const std::string& field, int32_t vocab) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrFormat("token id %d is outside the vocabulary [0, %d)", ids[i],
                                     vocab));
    }
  }
  return absl::OkStatus();
}

// Adds the tokens of one text span of a segmented prompt (no BOS: that goes once, up front).
void AppendText(const model::Tokenizer& tok, const std::string& text, PromptInput* out) {
  std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/true);
  out->tokens.insert(out->tokens.end(), ids.begin(), ids.end());
}

absl::StatusOr<PromptInput> BuildSegments(const v1::Segments& segments,
                                          const model::Model& model, bool add_special) {
  if (segments.segments().empty()) {
    return Invalid("segments", "at least one segment is required");
  }
  const model::Tokenizer& tok = model.tokenizer();
  const int32_t hidden = model.config().hidden_size;
  PromptInput out;
  if (add_special && tok.add_bos() && tok.bos_id() >= 0) out.tokens.push_back(tok.bos_id());
  for (int i = 0; i < segments.segments_size(); ++i) {
    const v1::Segment& seg = segments.segments(i);
    const std::string field = absl::StrCat("segments[", i, "]");
    switch (seg.kind_case()) {
      case v1::Segment::kText:
        if (seg.text().text().empty()) return Invalid(field + ".text.text", "must not be empty");
        AppendText(tok, seg.text().text(), &out);
        break;
      case v1::Segment::kContext: {
        if (seg.context().text().empty()) {
          return Invalid(field + ".context.text", "must not be empty");
        }
        const int32_t begin = static_cast<int32_t>(out.tokens.size());
        AppendText(tok, seg.context().text(), &out);
        const int32_t end = static_cast<int32_t>(out.tokens.size());
        if (end > begin) out.spans.push_back({cache::policies::SpanKind::kContext, begin, end});
        break;
      }
      case v1::Segment::kEmbedding: {
        const v1::EmbeddingSpan& emb = seg.embedding();
        if (emb.rows() < 1) {
          return Invalid(field + ".embedding.rows", absl::StrCat("must be >= 1, got ", emb.rows()));
        }
        const int64_t want = int64_t{emb.rows()} * hidden;
        if (emb.values_size() != want) {
          return Invalid(field + ".embedding.values",
                         absl::StrFormat("expected rows x hidden_size = %d x %d = %d floats, got "
                                         "%d (the model's hidden size is %d)",
                                         emb.rows(), hidden, want, emb.values_size(), hidden));
        }
        for (int k = 0; k < emb.values_size(); ++k) {
          if (!std::isfinite(emb.values(k))) {
            return Invalid(absl::StrCat(field, ".embedding.values[", k, "]"),
                           "must be a finite number");
          }
        }
        // Every embedding span (whatever its modality tag) is what modality-aware policies
        // treat as visual: compressible, scored by the text after it.
        const int32_t begin = static_cast<int32_t>(out.tokens.size());
        out.spans.push_back({cache::policies::SpanKind::kImage, begin, begin + emb.rows()});
        out.tokens.insert(out.tokens.end(), emb.rows(), model::kEmbeddingInput);
        out.embeddings.insert(out.embeddings.end(), emb.values().begin(), emb.values().end());
        break;
      }
      case v1::Segment::KIND_NOT_SET:
        return Invalid(field, "one of text, embedding or context is required");
    }
  }
  return out;
}

absl::Status CheckStopping(const v1::StoppingCriteria& stopping, int32_t vocab,
                           const RequestLimits& limits) {
  if (stopping.has_max_tokens()) {
    if (stopping.max_tokens() < 1) {
      return Invalid("stopping.max_tokens",
                     absl::StrCat("must be >= 1, got ", stopping.max_tokens()));
    }
    if (limits.max_tokens_limit > 0 && stopping.max_tokens() > limits.max_tokens_limit) {
      return Invalid("stopping.max_tokens",
                     absl::StrFormat("%d exceeds the server limit of %d (--max-tokens-limit)",
                                     stopping.max_tokens(), limits.max_tokens_limit));
    }
  }
  if (stopping.stop_size() > static_cast<int>(kMaxStopStrings)) {
    return Invalid("stopping.stop", absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
  }
  for (int i = 0; i < stopping.stop_size(); ++i) {
    if (stopping.stop(i).empty()) {
      return Invalid(absl::StrCat("stopping.stop[", i, "]"), "must not be empty");
    }
  }
  return CheckTokenIds(stopping.stop_token_ids(), "stopping.stop_token_ids", vocab);
}

// The wire's unset optionals become the model's defaults (generation_config.json) or the
// documented ones; an unseeded request gets a random seed.
absl::StatusOr<model::SamplingParams> BuildSampling(const v1::GenerateRequest& request,
                                                   const model::GenerationDefaults& defaults,
                                                   int32_t vocab_size) {
  // top_logprobs is a top-level field of the request; check it under that name before
  // SamplingParams::Validate would call it sampling.top_logprobs.
  if (request.top_logprobs() < 0 || request.top_logprobs() > kMaxTopLogprobs) {
    return Invalid("top_logprobs", absl::StrCat("must be in [0, ", kMaxTopLogprobs, "], got ",
                                                request.top_logprobs()));
  }
  const v1::SamplingParams& s = request.sampling();
  model::SamplingParams out;
  out.temperature = s.has_temperature() ? s.temperature() : defaults.temperature.value_or(0.0f);
  out.top_p = s.has_top_p() ? s.top_p() : defaults.top_p.value_or(1.0f);
  out.top_k = s.has_top_k() ? s.top_k() : defaults.top_k.value_or(0);
  out.min_p = s.has_min_p() ? s.min_p() : defaults.min_p.value_or(0.0f);
  out.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty()
                                                      : defaults.repetition_penalty.value_or(1.0f);
  out.frequency_penalty = s.frequency_penalty();
  out.presence_penalty = s.presence_penalty();
  if (s.has_seed()) {
    out.seed = s.seed();
  } else {
    // Unseeded requests must differ from each other; thread_local keeps this lock-free.
    thread_local std::mt19937_64 seeder{std::random_device{}()};
    out.seed = seeder();
  }
  out.top_logprobs = request.top_logprobs();
  for (const auto& [id, bias] : s.logit_bias()) {
    const std::string field = absl::StrCat("sampling.logit_bias[", id, "]");
    if (id < 0 || id >= vocab_size) {
      return Invalid(field, absl::StrCat("token id outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (!std::isfinite(bias) || bias < -100.0f || bias > 100.0f) {
      return Invalid(field, absl::StrCat("must be in [-100, 100], got ", bias));
    }
    out.logit_bias.emplace_back(id, bias);
  }
  // Map order is unspecified; sorted, equal requests sample equally.
  std::sort(out.logit_bias.begin(), out.logit_bias.end());
  // The one definition of the ranges. Its errors read "sampling.<field> = <value> is invalid:
  // must be ...", and every <field> is the wire's name in v1.SamplingParams (the tests pin each).
  WINNOW_RETURN_IF_ERROR(out.Validate());
  return out;
}

// The grammar of a chat's tool_choice: required or a tool's name constrain the reply to tool
// calls in the syntax the model's template teaches (null for auto and none, which leave the
// reply free). Llama 3.x writes one call per turn, so its replies hold one.
absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> ToolChoiceGrammar(
    const v1::ChatMessages& chat, const model::Model& model) {
  const std::string& choice = chat.tool_choice();
  if (choice.empty() || choice == "auto" || choice == "none") return nullptr;
  if (chat.tools().empty()) return Invalid("chat.tool_choice", "needs chat.tools");
  std::vector<structured::ToolSpec> tools;
  for (const v1::Tool& tool : chat.tools()) {
    if (choice == "required" || tool.name() == choice) {
      tools.push_back({tool.name(), tool.parameters()});
    }
  }
  if (tools.empty()) {
    return Invalid("chat.tool_choice",
                   absl::StrCat("must be auto, none, required or a tool's name; no tool is "
                                "named '", choice, "'"));
  }
  const bool llama_json = model.tool_call_syntax() == model::ToolCallSyntax::kLlamaJson;
  const bool parallel =
      !llama_json && (chat.has_parallel_tool_calls() ? chat.parallel_tool_calls() : true);
  absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> grammar =
      structured::CompileToolCalls(
          tools, parallel,
          llama_json ? structured::ToolCallFormat::LlamaJson() : structured::ToolCallFormat{});
  if (!grammar.ok()) {
    // "tools[1].parameters: ..." -> "chat.tools[1].parameters: ...".
    return absl::InvalidArgumentError(absl::StrCat("chat.", grammar.status().message()));
  }
  return grammar;
}

// The grammar the reply must follow (null when free): response_format's, or the tool calls a
// chat's tool_choice requires. Compiled grammars are shared by schema text
// (structured/grammar_cache.h).
absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> BuildGrammar(
    const v1::GenerateRequest& request, const model::Model& model) {
  std::shared_ptr<const structured::CompiledGrammar> tool_calls;
  if (request.has_chat()) {
    WINNOW_ASSIGN_OR_RETURN(tool_calls, ToolChoiceGrammar(request.chat(), model));
  }
  const v1::ResponseFormat& format = request.response_format();
  const bool has_format = format.format_case() != v1::ResponseFormat::FORMAT_NOT_SET;
  if (!has_format && tool_calls == nullptr) return nullptr;
  if (request.stopping().ignore_eos()) {
    return Invalid(has_format ? "response_format" : "chat.tool_choice",
                   "cannot be combined with stopping.ignore_eos: a constrained reply ends where "
                   "its grammar does");
  }
  if (tool_calls != nullptr) {
    if (has_format) {
      return Invalid("response_format", "cannot be combined with a chat.tool_choice that "
                                        "requires a call (the reply is the call)");
    }
    return tool_calls;
  }
  if (format.format_case() == v1::ResponseFormat::kJsonObject) {
    if (!format.json_object()) return Invalid("response_format.json_object", "must be true");
    return structured::JsonObjectGrammar();
  }
  absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> grammar =
      structured::CompileJsonSchema(format.json_schema());
  if (!grammar.ok()) {
    return Invalid("response_format.json_schema", std::string(grammar.status().message()));
  }
  return grammar;
}

// scope and the context's extent, before the prompt exists.
absl::Status CheckCompressionScope(const v1::CompressionSpec& comp, bool no_policy) {
  const bool contextual = comp.scope() == "context" || comp.scope() == "history";
  if (comp.scope() != "" && comp.scope() != "prompt" && !contextual) {
    return Invalid("compression.scope",
                   absl::StrCat("must be \"prompt\", \"context\" or \"history\", got '",
                                comp.scope(), "'"));
  }
  if (comp.context_tokens() < 0 || comp.context_messages() < 0 || comp.stage_tokens() < 0) {
    return Invalid(comp.context_tokens() < 0     ? "compression.context_tokens"
                   : comp.context_messages() < 0 ? "compression.context_messages"
                                                 : "compression.stage_tokens",
                   "must not be negative");
  }
  if (comp.stage_tokens() > 0 && comp.scope() != "history") {
    return Invalid("compression.stage_tokens", "applies with scope \"history\" only");
  }
  if (comp.probe() != "" && comp.probe() != "none" && comp.probe() != "repeat") {
    return Invalid("compression.probe",
                   absl::StrCat("must be \"none\" or \"repeat\", got '", comp.probe(), "'"));
  }
  if (comp.probe() == "repeat" && !contextual) {
    return Invalid("compression.probe", "applies with scope \"context\" or \"history\" only");
  }
  const bool extent = comp.context_tokens() > 0 || comp.context_messages() > 0;
  if (!contextual) {
    if (extent) {
      return Invalid(comp.context_tokens() > 0 ? "compression.context_tokens"
                                               : "compression.context_messages",
                     "applies with scope \"context\" or \"history\" only");
    }
    return absl::OkStatus();
  }
  if (no_policy) {
    return Invalid("compression.scope", absl::StrCat("\"", comp.scope(), "\" needs a policy"));
  }
  if (comp.context_tokens() > 0 && comp.context_messages() > 0) {
    return Invalid("compression.context_messages", "give context_tokens or context_messages");
  }
  return absl::OkStatus();
}

// What can be checked before the prompt exists: the policy name, the budget, and that params
// are finite and not also given as options. The policy's own parameters need the prompt
// (BuildCompression).
absl::Status CheckCompressionSpec(const v1::CompressionSpec& comp) {
  const bool no_policy = comp.policy().empty() || comp.policy() == "none";
  if (!no_policy) {
    const std::vector<std::string> known = cache::policies::KnownPolicies();
    if (std::find(known.begin(), known.end(), comp.policy()) == known.end()) {
      return Invalid("compression.policy",
                     absl::StrCat("unknown policy '", comp.policy(), "' (available: ",
                                  absl::StrJoin(known, ", "), ")"));
    }
    if (!(comp.budget() > 0.0 && comp.budget() <= 1.0)) {
      return Invalid("compression.budget",
                     absl::StrCat("must be in (0, 1] (the fraction of the prompt's KV kept), "
                                  "got ", comp.budget()));
    }
  } else {
    if (comp.budget() != 0) return Invalid("compression.budget", "policy 'none' takes no budget");
    if (!comp.params().empty() || !comp.options().empty()) {
      return Invalid(comp.params().empty() ? "compression.options" : "compression.params",
                     "policy 'none' takes no parameters");
    }
  }
  WINNOW_RETURN_IF_ERROR(CheckCompressionScope(comp, no_policy));
  for (const auto& [k, v] : comp.params()) {
    if (!std::isfinite(v)) {
      return Invalid(absl::StrCat("compression.params.", k), "must be a finite number");
    }
    if (comp.options().contains(k)) {
      return Invalid(absl::StrCat("compression.params.", k),
                     "given both as a number (params) and as a string (options)");
    }
  }
  return absl::OkStatus();
}

// The engine's compression spec, validated by building the policy exactly as the engine will
// (scheduler/engine.cc, MakeCompressionSession: the model's dimensions, the engine's block size,
// this prompt's length and spans), so the policy's checks of its own parameters run here and
// name the field. Numbers stay doubles and strings stay strings (cache::policies::PolicyParam).
absl::StatusOr<scheduler::CompressionSpec> BuildCompression(const v1::CompressionSpec& wire,
                                                            const model::Model& model,
                                                            const RequestLimits& limits,
                                                            const PromptInput& prompt,
                                                            int32_t context_tokens) {
  scheduler::CompressionSpec spec;
  spec.policy = wire.policy();
  spec.budget = wire.budget();
  // "history": whole stages of the context; the policy is built for one stage's tokens.
  int32_t compressed_alone = context_tokens;
  if (wire.scope() == "history") {
    const int32_t stage = wire.stage_tokens() > 0 ? wire.stage_tokens() : kDefaultStageTokens;
    for (int32_t end = stage; end <= context_tokens; end += stage) spec.stage_ends.push_back(end);
    context_tokens = spec.stage_ends.empty() ? 0 : spec.stage_ends.back();
    compressed_alone = spec.stage_ends.empty() ? 0 : stage;
  }
  spec.context_tokens = context_tokens;
  spec.probe = wire.probe() == "repeat" ? scheduler::ContextProbe::kRepeat
                                        : scheduler::ContextProbe::kNone;
  for (const auto& [k, v] : wire.params()) spec.params[std::string(k)] = v;
  for (const auto& [k, v] : wire.options()) spec.params[std::string(k)] = v;
  if (limits.block_size < 1) {
    return absl::InternalError(
        absl::StrCat("request limits: block_size must be >= 1, got ", limits.block_size));
  }
  cache::policies::PolicyContext context;
  context.dims = model.PolicyDims(limits.block_size, limits.kv_logit_bias);
  context.layout.num_tokens = static_cast<int32_t>(prompt.tokens.size());
  context.layout.spans = prompt.spans;
  // As the engine builds it (MakeCompressionSession): over the context (or its first stage)
  // alone for "context" and "history".
  if (compressed_alone > 0) context.layout = context.layout.Leading(compressed_alone);
  WINNOW_ASSIGN_OR_RETURN(
      const std::unique_ptr<cache::policies::CompressionPolicy> policy,
      cache::policies::CreatePolicy(spec.policy,
                                    cache::policies::PolicyConfig(spec.budget, spec.params),
                                    context));
  if (wire.scope() == "history" && policy != nullptr) {
    WINNOW_ASSIGN_OR_RETURN(
        const std::unique_ptr<cache::CompressionSession> session,
        cache::CompressionSession::Create(
            spec.policy, cache::policies::PolicyConfig(spec.budget, spec.params), context));
    WINNOW_RETURN_IF_ERROR(session->CheckStaged());
    if (context_tokens == 0) {
      // No whole stage yet: nothing is compressed, the prompt runs whole.
      return scheduler::CompressionSpec{};
    }
  }
  if (spec.probe != scheduler::ContextProbe::kNone && policy != nullptr) {
    WINNOW_RETURN_IF_ERROR(
        cache::CheckProbeSupported(spec.policy, *policy, context.layout.num_tokens));
    const auto context_ids = std::span<const int32_t>(prompt.tokens).first(context_tokens);
    if (std::find(context_ids.begin(), context_ids.end(), model::kEmbeddingInput) !=
        context_ids.end()) {
      return Invalid("compression.probe",
                     "\"repeat\" repeats the context's tokens; this context has image "
                     "embeddings, which cannot be repeated");
    }
  }
  return spec;
}

// stopping.max_tokens when set (already checked against the limit); otherwise the default,
// capped by the limit and by the context left after the prompt.
int32_t MaxTokens(const v1::StoppingCriteria& stopping, const RequestLimits& limits,
                  int32_t prompt_len) {
  if (stopping.has_max_tokens()) return stopping.max_tokens();
  int32_t m = limits.default_max_tokens;
  if (limits.max_tokens_limit > 0) m = std::min(m, limits.max_tokens_limit);
  if (limits.context_length > 0) m = std::min(m, limits.context_length - prompt_len);
  return std::max(m, 1);  // a prompt filling the context fails in the engine (context fit)
}

}  // namespace

// Function names as OpenAI allows them: 1-64 of [A-Za-z0-9_-].
bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

// The chat's tools as the template renders them: OpenAI tool objects, as JSON text.
absl::StatusOr<std::vector<std::string>> ToolObjects(const v1::ChatMessages& chat,
                                                     const std::string& field) {
  using Json = nlohmann::ordered_json;
  std::vector<std::string> tools;
  for (int i = 0; i < chat.tools_size(); ++i) {
    const v1::Tool& tool = chat.tools(i);
    const std::string at = absl::StrCat(field, ".tools[", i, "]");
    if (!ValidToolName(tool.name())) {
      return Invalid(at + ".name", "must be 1-64 letters, digits, '_' or '-'");
    }
    Json function = {{"name", tool.name()}};
    if (!tool.description().empty()) function["description"] = tool.description();
    if (!tool.parameters().empty()) {
      Json parameters = Json::parse(tool.parameters(), nullptr, /*allow_exceptions=*/false);
      if (parameters.is_discarded() || !parameters.is_object()) {
        return Invalid(at + ".parameters", "must be a JSON Schema object");
      }
      function["parameters"] = std::move(parameters);
    }
    tools.push_back(Json{{"type", "function"}, {"function", std::move(function)}}.dump());
  }
  return tools;
}

absl::StatusOr<std::vector<int32_t>> TokenizeChat(const v1::ChatMessages& chat,
                                                  const model::Model& model, bool add_special,
                                                  const std::string& field) {
  if (chat.messages().empty()) return Invalid(field + ".messages", "must not be empty");
  const auto& tmpl = model.chat_template();
  if (!tmpl.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": ", tmpl.status().message()));
  }
  std::vector<model::ChatMessage> messages;
  messages.reserve(chat.messages_size());
  for (int i = 0; i < chat.messages_size(); ++i) {
    const auto& m = chat.messages(i);
    if (m.role().empty()) {
      return Invalid(absl::StrCat(field, ".messages[", i, "].role"), "must not be empty");
    }
    model::ChatMessage message{m.role(), m.content()};
    message.tool_call_id = m.tool_call_id();
    for (const v1::ToolCall& call : m.tool_calls()) {
      message.tool_calls.push_back({call.id(), call.name(), call.arguments()});
    }
    messages.push_back(std::move(message));
  }
  WINNOW_ASSIGN_OR_RETURN(const std::vector<std::string> tools, ToolObjects(chat, field));
  auto text = tmpl->Apply(messages,
                          chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true,
                          tools);
  if (!text.ok()) {
    // The template names a message as "[i].tool_calls[j]...", or speaks of them all.
    const std::string why(text.status().message());
    const bool names_a_message = absl::StartsWith(why, "[");
    return absl::Status(text.status().code(), absl::StrCat(field, ".messages",
                                                           names_a_message ? "" : ": ", why));
  }
  return model::EncodeRenderedChat(model.tokenizer(), *text, add_special);
}

absl::StatusOr<PromptInput> BuildPrompt(const v1::GenerateRequest& request,
                                        const model::Model& model) {
  const bool add_special =
      request.has_add_special_tokens() ? request.add_special_tokens() : true;
  const int32_t vocab = model.config().vocab_size;
  PromptInput out;
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      if (request.prompt().empty()) return Invalid("prompt", "must not be empty");
      out.tokens = model.tokenizer().Encode(request.prompt(), add_special,
                                            /*parse_special=*/true);
      break;
    case v1::GenerateRequest::kChat: {  // braces: the macro declares a variable
      WINNOW_ASSIGN_OR_RETURN(out.tokens,
                              TokenizeChat(request.chat(), model, add_special, "chat"));
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids().empty()) return Invalid("token_ids.ids", "must not be empty");
      WINNOW_RETURN_IF_ERROR(CheckTokenIds(request.token_ids().ids(), "token_ids.ids", vocab));
      out.tokens.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kSegments: {
      WINNOW_ASSIGN_OR_RETURN(out, BuildSegments(request.segments(), model, add_special));
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      return Invalid("input", "one of prompt, chat, token_ids or segments is required");
  }
  if (out.tokens.empty()) return Invalid("input", "the prompt tokenizes to no tokens");
  return out;
}

namespace {

// The first k messages of `request`'s chat as the template renders them without a generation
// prompt: their tokens must start the prompt.
absl::StatusOr<int32_t> ContextMessagesTokens(const v1::GenerateRequest& request,
                                              const model::Model& model,
                                              const PromptInput& prompt, int32_t k,
                                              const char* field) {
  if (request.input_case() != v1::GenerateRequest::kChat) {
    return Invalid(field, "needs chat input");
  }
  const v1::ChatMessages& chat = request.chat();
  if (k > chat.messages_size()) {
    return Invalid(field, absl::StrCat("is ", k, " but the chat has ", chat.messages_size(),
                                        " messages"));
  }
  v1::ChatMessages context = chat;
  context.mutable_messages()->DeleteSubrange(k, chat.messages_size() - k);
  context.set_add_generation_prompt(false);
  const bool add_special = request.has_add_special_tokens() ? request.add_special_tokens() : true;
  WINNOW_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                          TokenizeChat(context, model, add_special, "chat"));
  if (tokens.size() > prompt.tokens.size() ||
      !std::equal(tokens.begin(), tokens.end(), prompt.tokens.begin())) {
    return Invalid(field, absl::StrCat("the first ", k, " messages do not render as the start "
                                        "of the prompt under this model's chat template"));
  }
  return static_cast<int32_t>(tokens.size());
}

// CompressionSpec::context_tokens: 0 unless compression.scope is "context", else where the
// prompt's context ends (compression.scope's comment in the proto).
absl::StatusOr<int32_t> ContextTokens(const v1::GenerateRequest& request,
                                      const model::Model& model, const PromptInput& prompt) {
  const v1::CompressionSpec& comp = request.compression();
  if (comp.scope() != "context" && comp.scope() != "history") return 0;
  const int32_t prompt_len = static_cast<int32_t>(prompt.tokens.size());
  if (comp.context_tokens() > 0) {
    if (comp.context_tokens() > prompt_len) {
      return Invalid("compression.context_tokens",
                     absl::StrCat("is ", comp.context_tokens(), " but the prompt has ",
                                  prompt_len, " tokens"));
    }
    return comp.context_tokens();
  }
  if (comp.context_messages() > 0) {
    return ContextMessagesTokens(request, model, prompt, comp.context_messages(),
                                 "compression.context_messages");
  }
  if (comp.scope() == "history" && request.input_case() == v1::GenerateRequest::kChat) {
    // A chat's history: every message but the last.
    const int32_t k = request.chat().messages_size() - 1;
    return k > 0 ? ContextMessagesTokens(request, model, prompt, k, "compression.scope") : 0;
  }
  int32_t end = 0;
  for (const cache::policies::PromptSpan& span : prompt.spans) {
    if (span.kind == cache::policies::SpanKind::kContext) end = std::max(end, span.end);
  }
  if (end == 0) {
    return Invalid("compression.scope",
                   absl::StrCat("\"", comp.scope(),
                                "\" needs context_tokens, chat input (context_messages, or for "
                                "\"history\" every message but the last) or a ContextSpan "
                                "(segments input)"));
  }
  return end;
}

}  // namespace

RequestLimits LimitsFor(const scheduler::EngineLimits& engine) {
  RequestLimits limits;
  limits.max_prompt_tokens = engine.max_prompt_tokens;
  limits.max_tokens_limit = engine.max_tokens_limit;
  limits.context_length = engine.context_length;
  limits.block_size = engine.block_size;
  limits.kv_logit_bias = engine.kv_logit_bias;
  return limits;
}

absl::StatusOr<scheduler::GenerationRequest> BuildGenerationRequest(
    const v1::GenerateRequest& request, const model::Model& model, const RequestLimits& limits) {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid("request_id", absl::StrCat("longer than ", kMaxRequestIdBytes, " bytes"));
  }
  if (request.cache_salt().size() > kMaxCacheSaltBytes) {
    return Invalid("cache_salt", absl::StrCat("longer than ", kMaxCacheSaltBytes, " bytes"));
  }
  if (request.has_prompt_logprobs() &&
      (request.prompt_logprobs() < 0 || request.prompt_logprobs() > kMaxTopLogprobs)) {
    return Invalid("prompt_logprobs", absl::StrCat("must be in [0, ", kMaxTopLogprobs, "], got ",
                                                   request.prompt_logprobs()));
  }
  // Cheap checks first: a bad parameter should not cost a tokenization of a long prompt.
  const v1::StoppingCriteria& stopping = request.stopping();
  WINNOW_RETURN_IF_ERROR(CheckStopping(stopping, model.config().vocab_size, limits));
  WINNOW_ASSIGN_OR_RETURN(model::SamplingParams sampling,
                          BuildSampling(request, model.generation_defaults(),
                                        model.config().vocab_size));
  WINNOW_RETURN_IF_ERROR(CheckCompressionSpec(request.compression()));
  WINNOW_ASSIGN_OR_RETURN(std::shared_ptr<const structured::CompiledGrammar> grammar,
                          BuildGrammar(request, model));

  WINNOW_ASSIGN_OR_RETURN(PromptInput prompt, BuildPrompt(request, model));
  const int32_t prompt_len = static_cast<int32_t>(prompt.tokens.size());
  if (limits.max_prompt_tokens > 0 && prompt_len > limits.max_prompt_tokens) {
    return Invalid("input", absl::StrFormat("the prompt has %d tokens, more than the server "
                                            "limit of %d (--max-prompt-tokens)",
                                            prompt_len, limits.max_prompt_tokens));
  }
  // Needs the prompt: a policy is built against the prompt's length and spans.
  WINNOW_ASSIGN_OR_RETURN(const int32_t context_tokens, ContextTokens(request, model, prompt));
  WINNOW_ASSIGN_OR_RETURN(
      scheduler::CompressionSpec compression,
      BuildCompression(request.compression(), model, limits, prompt, context_tokens));

  scheduler::GenerationRequest out;
  out.request_id = request.request_id();
  out.cache_salt = request.cache_salt();
  out.prompt_tokens = std::move(prompt.tokens);
  out.embeddings = std::move(prompt.embeddings);
  out.prompt_spans = std::move(prompt.spans);
  out.sampling = sampling;
  out.logprobs = request.logprobs() || request.top_logprobs() > 0;
  out.prompt_logprobs = request.has_prompt_logprobs() ? request.prompt_logprobs() : -1;
  out.max_tokens = MaxTokens(stopping, limits, prompt_len);
  out.stop_strings.assign(stopping.stop().begin(), stopping.stop().end());
  out.stop_token_ids.assign(stopping.stop_token_ids().begin(), stopping.stop_token_ids().end());
  out.ignore_eos = stopping.ignore_eos();
  out.priority = request.priority();
  out.compression = std::move(compression);
  out.grammar = std::move(grammar);
  return out;
}

absl::StatusOr<std::vector<scheduler::GenerationRequest>> BuildSamples(
    const v1::GenerateRequest& request, const model::Model& model, const RequestLimits& limits) {
  if (request.n() < 0 || request.n() > kMaxSamples) {
    return Invalid("n", absl::StrCat("must be in [0, ", kMaxSamples, "], got ", request.n()));
  }
  WINNOW_ASSIGN_OR_RETURN(scheduler::GenerationRequest first,
                          BuildGenerationRequest(request, model, limits));
  std::vector<scheduler::GenerationRequest> samples(std::max(1, request.n()), first);
  samples.front() = std::move(first);
  for (int32_t i = 1; i < request.n(); ++i) {
    scheduler::GenerationRequest& sample = samples[i];
    sample.sampling.seed = SampleSeed(sample.sampling.seed, i);
    sample.prompt_logprobs = -1;
  }
  return samples;
}

}  // namespace winnow::server
