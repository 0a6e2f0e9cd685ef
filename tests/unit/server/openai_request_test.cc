// The OpenAI body -> v1::GenerateRequest mapping and the renaming of request_builder's field
// names back to the OpenAI ones. No model needed: values are request_builder's to check.
#include "server/http/openai_request.h"

#include <string>

#include "gtest/gtest.h"

namespace winnow::server::http {
namespace {

OpenAiRequest ParseOk(Endpoint e, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(e, body);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest{};
}

std::string ParseError(Endpoint e, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(e, body);
  EXPECT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(OpenAiRequestTest, CompletionFieldsMapOntoTheWireRequest) {
  OpenAiRequest r = ParseOk(Endpoint::kCompletions, R"({
      "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "top_k": -1, "min_p": 0.1, "seed": 3, "stop": "x", "logprobs": 2, "presence_penalty": 1,
      "frequency_penalty": -1, "repetition_penalty": 1.2, "priority": 4, "stream": true,
      "stream_options": {"include_usage": true}, "ignore_eos": true, "n": 1, "user": "u",
      "cache_salt": "tenant-a",
      "kv_compression": {"policy": "xkv", "budget": 0.2, "params": {"category": 1048576,
                         "flag": true}, "options": {"pooling": "max"}}})");
  const v1::GenerateRequest& g = r.generate;
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(g.prompt(), "hi");
  EXPECT_EQ(g.stopping().max_tokens(), 7);
  EXPECT_EQ(g.stopping().stop(0), "x");
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 0);  // vLLM's -1 is winnow's 0: off
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.1f);
  EXPECT_EQ(g.sampling().seed(), 3u);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.2f);
  EXPECT_TRUE(g.logprobs());
  EXPECT_EQ(g.top_logprobs(), 2);
  EXPECT_EQ(g.priority(), 4);
  EXPECT_EQ(g.cache_salt(), "tenant-a");
  EXPECT_EQ(g.compression().policy(), "xkv");
  EXPECT_DOUBLE_EQ(g.compression().params().at("category"), 1048576.0);
  EXPECT_DOUBLE_EQ(g.compression().params().at("flag"), 1.0);
  EXPECT_EQ(g.compression().options().at("pooling"), "max");
}

TEST(OpenAiRequestTest, KvCompressionTakesAContextScope) {
  OpenAiRequest r = ParseOk(Endpoint::kChat, R"({
      "messages": [{"role": "user", "content": "doc"}, {"role": "user", "content": "q?"}],
      "kv_compression": {"policy": "snapkv", "budget": 0.2, "scope": "context",
                         "context_messages": 1}})");
  EXPECT_EQ(r.generate.compression().scope(), "context");
  EXPECT_EQ(r.generate.compression().context_messages(), 1);
  r = ParseOk(Endpoint::kCompletions, R"({"prompt": "hi", "kv_compression": {
      "policy": "snapkv", "budget": 0.2, "scope": "context", "context_tokens": 1}})");
  EXPECT_EQ(r.generate.compression().context_tokens(), 1);
  r = ParseOk(Endpoint::kChat, R"({
      "messages": [{"role": "user", "content": "doc"}, {"role": "user", "content": "q?"}],
      "kv_compression": {"policy": "kvzip", "budget": 0.2, "scope": "history",
                         "stage_tokens": 256}})");
  EXPECT_EQ(r.generate.compression().scope(), "history");
  EXPECT_EQ(r.generate.compression().stage_tokens(), 256);
  for (const char* bad : {R"({"prompt": "x", "kv_compression": {"policy": "snapkv", "scope": 1}})",
                          R"({"prompt": "x", "kv_compression": {"policy": "snapkv",
                              "stage_tokens": 1.5}})",
                          R"({"prompt": "x", "kv_compression": {"policy": "snapkv",
                              "context_tokens": -2}})",
                          R"({"prompt": "x", "kv_compression": {"policy": "snapkv",
                              "context_messages": "two"}})"}) {
    const absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(Endpoint::kCompletions, bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("kv_compression."), std::string::npos)
        << parsed.status();
  }
}

TEST(OpenAiRequestTest, OpenAiDefaults) {
  OpenAiRequest c = ParseOk(Endpoint::kCompletions, R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(c.generate.token_ids().ids_size(), 3);
  EXPECT_EQ(c.generate.stopping().max_tokens(), 16);  // OpenAI's completions default
  // Unset: the handler gives the model's default, else OpenAI's 1.
  EXPECT_FALSE(c.generate.sampling().has_temperature());
  EXPECT_FALSE(c.generate.sampling().has_seed());
  OpenAiRequest chat = ParseOk(Endpoint::kChat, R"({"messages": [
      {"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null}], "max_completion_tokens": 5, "max_tokens": 9,
      "logprobs": true, "top_logprobs": 2, "temperature": null})");
  EXPECT_EQ(chat.generate.chat().messages_size(), 3);
  EXPECT_EQ(chat.generate.chat().messages(1).content(), "ab");
  EXPECT_EQ(chat.generate.chat().messages(2).content(), "");
  EXPECT_EQ(chat.generate.stopping().max_tokens(), 5);  // max_completion_tokens wins
  EXPECT_EQ(chat.max_tokens_field, "max_completion_tokens");
  EXPECT_FALSE(chat.generate.sampling().has_temperature());  // null means unset
  EXPECT_EQ(chat.generate.top_logprobs(), 2);
  // Chat leaves the token limit to the server when none is given.
  OpenAiRequest bare = ParseOk(Endpoint::kChat, R"({"messages": [{"role":"user","content":"x"}]})");
  EXPECT_FALSE(bare.generate.stopping().has_max_tokens());
}

TEST(OpenAiRequestTest, ResponseFormatLogitBiasAndDeveloperRole) {
  OpenAiRequest r = ParseOk(Endpoint::kChat, R"({
      "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "x"}],
      "logit_bias": {"42": -100, "7": 3.5},
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"zeta": {"type": "string"},
                                                      "alpha": {"type": "integer"}}}}}})");
  const v1::GenerateRequest& g = r.generate;
  EXPECT_EQ(g.chat().messages(0).role(), "developer");  // the template decides
  EXPECT_EQ(g.sampling().logit_bias().at(42), -100.0f);
  EXPECT_EQ(g.sampling().logit_bias().at(7), 3.5f);
  // The schema's property order survives (it is the order properties are generated in).
  EXPECT_EQ(g.response_format().json_schema(),
            R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  EXPECT_TRUE(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "response_format":
      {"type": "json_object"}})").generate.response_format().json_object());
  EXPECT_EQ(ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "response_format":
      {"type": "text"}})").generate.response_format().format_case(),
            v1::ResponseFormat::FORMAT_NOT_SET);
  EXPECT_EQ(ParseError(Endpoint::kChat, R"({"messages": [], "response_format": {"type": "xml"}})"),
            "response_format.type: must be text, json_object or json_schema, got \"xml\"");
  EXPECT_EQ(ParseError(Endpoint::kChat, R"({"messages": [], "response_format":
      {"type": "json_schema", "json_schema": {"name": "n"}}})"),
            "response_format.json_schema.schema: is required");
  EXPECT_EQ(ParseError(Endpoint::kChat, R"({"messages": [], "logit_bias": {"x": 1}})"),
            "logit_bias[x]: the key must be a token id");
  OpenAiRequest chat = ParseOk(Endpoint::kChat, R"({"messages": [{"role":"u","content":"x"}]})");
  std::string param;
  EXPECT_EQ(OpenAiFieldMessage(chat, "response_format.json_schema: properties.a.pattern: no",
                               &param),
            "response_format.json_schema.schema: properties.a.pattern: no");
  EXPECT_EQ(param, "response_format.json_schema.schema");
  EXPECT_EQ(OpenAiFieldMessage(chat, "sampling.logit_bias[9]: must be in", &param),
            "logit_bias[9]: must be in");
}

TEST(OpenAiRequestTest, EchoAsksForPromptLogprobs) {
  OpenAiRequest r = ParseOk(Endpoint::kCompletions,
                            R"({"prompt": "x", "echo": true, "logprobs": 2, "max_tokens": 0})");
  EXPECT_TRUE(r.echo && r.echo_only);
  EXPECT_EQ(r.choices[0].prompt_logprobs(), 2);
  EXPECT_EQ(r.choices[0].stopping().max_tokens(), 1);  // generated, then left out
  OpenAiRequest plain = ParseOk(Endpoint::kCompletions, R"({"prompt": "x", "echo": true})");
  EXPECT_TRUE(plain.echo && !plain.echo_only);
  EXPECT_FALSE(plain.choices[0].has_prompt_logprobs());  // the text alone needs no scoring
}

TEST(OpenAiRequestTest, PromptListsAndNBecomeOneRequestPerChoice) {
  OpenAiRequest r = ParseOk(Endpoint::kCompletions, R"({"prompt": ["a", [5, 6]], "n": 3,
                                                       "seed": 10, "max_tokens": 4})");
  EXPECT_EQ(r.n, 3);
  ASSERT_EQ(r.choices.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const v1::GenerateRequest& c = r.choices[i];
    EXPECT_EQ(c.stopping().max_tokens(), 4);
    EXPECT_EQ(c.sampling().seed(), 10u + i % 3) << i;  // each choice its own seed stream
    if (i < 3) {
      EXPECT_EQ(c.prompt(), "a");
    } else {
      EXPECT_EQ(c.token_ids().ids_size(), 2);
    }
  }
  // Unseeded choices stay unseeded (the builder draws a seed for each).
  OpenAiRequest chat = ParseOk(Endpoint::kChat,
                               R"({"messages": [{"role": "user", "content": "x"}], "n": 2})");
  ASSERT_EQ(chat.choices.size(), 2u);
  EXPECT_FALSE(chat.choices[1].sampling().has_seed());
  EXPECT_EQ(chat.choices[1].chat().messages(0).content(), "x");
}

TEST(OpenAiRequestTest, ShapeErrorsNameTheOpenAiField) {
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{nope"), "body: not valid JSON");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "[1]"), "body: must be a JSON object");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "n": 17})"),
            "n: must be in [1, 16], got 17");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": ["a", "b", "c", "d", "e"], "n": 16})"),
            "n: n times the prompts must be at most 64, got 80");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "temperature": "1"})"),
            "temperature: must be a number");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 1.5})"),
            "max_tokens: must be an integer");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 1e12})"),
            "max_tokens: 1000000000000 is out of range");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "stop": ["a", 1]})"),
            "stop[1]: must be a string");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": ["a", 7]})"),
            "prompt[1]: must be a string or a list of token ids");
  EXPECT_EQ(ParseError(Endpoint::kChat, R"({"messages": [], "echo": true})"),
            "echo: is for /v1/completions");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, R"({"prompt": "x", "suffix": "y"})"),
            "suffix: is not supported: the served models have no fill-in-the-middle template");
  EXPECT_EQ(ParseError(Endpoint::kCompletions,
                       R"({"prompt": "x", "kv_compression": {"policy": "h2o", "params":
                          {"window": "8"}}})"),
            "kv_compression.params.window: must be a number (string values go in "
            "kv_compression.options)");
  EXPECT_EQ(ParseError(Endpoint::kCompletions,
                       R"({"prompt": "x", "kv_compression": {"policy": "h2o", "budgit": 1}})"),
            "kv_compression.budgit: unknown field (known: policy, budget, params, options, scope, "
            "context_tokens, context_messages, stage_tokens, probe)");
  EXPECT_EQ(ParseError(Endpoint::kChat, R"({"messages": [{"content": "x"}]})"),
            "messages[0].role: must be a string");
  EXPECT_EQ(ParseError(Endpoint::kChat,
                       R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0].type: only text parts are supported, got 'image_url'");
  EXPECT_EQ(ParseError(Endpoint::kChat,
                       R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"),
            "top_logprobs: needs logprobs: true");
}

TEST(OpenAiRequestTest, BuilderMessagesAreRenamed) {
  OpenAiRequest completion = ParseOk(Endpoint::kCompletions, R"({"prompt": "x"})");
  OpenAiRequest chat = ParseOk(Endpoint::kChat,
                               R"({"messages": [{"role":"u","content":"x"}],
                                   "max_completion_tokens": 3})");
  struct Case {
    const OpenAiRequest* request;
    std::string in, out, param;
  };
  const Case cases[] = {
      {&completion, "stopping.max_tokens: must be >= 1, got 0", "max_tokens: must be >= 1, got 0",
       "max_tokens"},
      {&chat, "stopping.max_tokens: must be >= 1, got 0",
       "max_completion_tokens: must be >= 1, got 0", "max_completion_tokens"},
      {&completion, "sampling.temperature = nan is invalid: must be a finite number >= 0",
       "temperature = nan is invalid: must be a finite number >= 0", "temperature"},
      {&completion, "stopping.stop[2]: must not be empty", "stop[2]: must not be empty", "stop[2]"},
      {&completion, "stopping.stop_token_ids[0]: token id 99 is outside",
       "stop_token_ids[0]: token id 99 is outside", "stop_token_ids[0]"},
      {&completion, "compression.policy: unknown policy 'x'",
       "kv_compression.policy: unknown policy 'x'", "kv_compression.policy"},
      {&chat, "chat.messages[1].role: must not be empty", "messages[1].role: must not be empty",
       "messages[1].role"},
      {&completion, "token_ids.ids[4]: token id -1 is outside",
       "prompt[4]: token id -1 is outside", "prompt[4]"},
      {&completion, "top_logprobs: must be in [0, 20], got 21",
       "logprobs: must be in [0, 20], got 21", "logprobs"},
      {&chat, "top_logprobs: must be in [0, 20], got 21",
       "top_logprobs: must be in [0, 20], got 21", "top_logprobs"},
      {&chat, "input: the prompt has 9 tokens", "messages: the prompt has 9 tokens", "messages"},
      {&completion, "prompt: must not be empty", "prompt: must not be empty", "prompt"},
  };
  for (const Case& c : cases) {
    std::string param;
    EXPECT_EQ(OpenAiFieldMessage(*c.request, c.in, &param), c.out);
    EXPECT_EQ(param, c.param) << c.in;
  }
}

}  // namespace
}  // namespace winnow::server::http
