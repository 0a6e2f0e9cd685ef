// BuildGenerationRequest, the one place a request is validated: every rejected field is named
// at the start of the error, and a valid request comes out typed as the engine expects it.
// Needs the default model (WINNOW_TEST_MODEL); skipped without it.
#include "server/request_builder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "cache/policies/policy.h"
#include "cache/policies/xkv.h"
#include "model/model.h"

namespace winnow::server {
namespace {

using cache::policies::PolicyParam;
using cache::policies::SpanKind;

class RequestBuilderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("WINNOW_TEST_MODEL");
    if (path == nullptr || !std::filesystem::exists(path)) return;
    auto loaded = model::Model::Load(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = loaded->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) {
      GTEST_SKIP() << "the model file is missing: set WINNOW_TEST_MODEL to a GGUF file "
                      "(scripts/fetch-model.sh fetches the default one)";
    }
  }

  static RequestLimits Limits() {
    RequestLimits limits;
    limits.max_prompt_tokens = 64;
    limits.max_tokens_limit = 100;
    limits.context_length = model_->config().context_length;
    limits.block_size = 16;
    return limits;
  }
  static v1::GenerateRequest Valid() {
    v1::GenerateRequest r;
    r.set_prompt("The capital of France is");
    return r;
  }
  static absl::StatusOr<scheduler::GenerationRequest> Build(const v1::GenerateRequest& r) {
    return BuildGenerationRequest(r, *model_, Limits());
  }
  // A chat request of (role, content) messages.
  static v1::GenerateRequest Chat(
      const std::vector<std::pair<std::string, std::string>>& messages) {
    v1::GenerateRequest chat;
    for (const auto& [role, content] : messages) {
      v1::ChatMessage* m = chat.mutable_chat()->add_messages();
      m->set_role(role);
      m->set_content(content);
    }
    return chat;
  }
  // The tokens of `chat` without its last message, as the template renders them with no
  // generation prompt.
  static int32_t TokensBeforeLastMessage(const v1::GenerateRequest& chat) {
    v1::GenerateRequest leading = chat;
    leading.mutable_chat()->mutable_messages()->RemoveLast();
    leading.mutable_chat()->set_add_generation_prompt(false);
    leading.clear_compression();
    absl::StatusOr<scheduler::GenerationRequest> built = Build(leading);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? static_cast<int32_t>(built->prompt_tokens.size()) : -1;
  }
  static int32_t Vocab() { return model_->config().vocab_size; }
  static int32_t Hidden() { return model_->config().hidden_size; }

  static model::Model* model_;
};

model::Model* RequestBuilderTest::model_ = nullptr;

struct RejectCase {
  std::string field;  // the error must start with it
  std::function<void(v1::GenerateRequest&)> mutate;
};

void ExpectRejected(const std::vector<RejectCase>& cases, const RequestLimits& limits,
                    const model::Model& model) {
  for (const RejectCase& c : cases) {
    v1::GenerateRequest r;
    r.set_prompt("The capital of France is");
    c.mutate(r);
    absl::StatusOr<scheduler::GenerationRequest> out = BuildGenerationRequest(r, model, limits);
    ASSERT_FALSE(out.ok()) << c.field << " accepted";
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
    EXPECT_TRUE(absl::StartsWith(out.status().message(), c.field))
        << "expected the error to name " << c.field << ", got: " << out.status().message();
  }
}

v1::EmbeddingSpan* AddEmbedding(v1::GenerateRequest& r, int32_t rows, int32_t width) {
  v1::EmbeddingSpan* e = r.mutable_segments()->add_segments()->mutable_embedding();
  e->set_rows(rows);
  for (int32_t i = 0; i < rows * width; ++i) e->add_values(0.01f * (i % 7));
  return e;
}

TEST_F(RequestBuilderTest, RejectsEveryBadInputNamingItsField) {
  const int32_t vocab = Vocab();
  const int32_t hidden = Hidden();
  ExpectRejected(
      {
          {"request_id", [](auto& r) { r.set_request_id(std::string(257, 'x')); }},
          {"input", [](auto& r) { r.clear_input(); }},
          {"prompt", [](auto& r) { r.set_prompt(""); }},
          {"token_ids.ids", [](auto& r) { r.mutable_token_ids(); }},
          // Ported from the engine's InvalidRequestsNameTheField: out of range either side.
          {"token_ids.ids[1]",
           [&](auto& r) {
             r.mutable_token_ids()->add_ids(1);
             r.mutable_token_ids()->add_ids(vocab);
           }},
          {"token_ids.ids[1]",
           [](auto& r) {
             r.mutable_token_ids()->add_ids(1);
             r.mutable_token_ids()->add_ids(-7);
           }},
          {"chat.messages", [](auto& r) { r.mutable_chat(); }},
          {"chat.messages[0].role",
           [](auto& r) { r.mutable_chat()->add_messages()->set_content("hi"); }},
          {"segments", [](auto& r) { r.mutable_segments(); }},
          {"segments[0]", [](auto& r) { r.mutable_segments()->add_segments(); }},
          {"segments[0].text.text",
           [](auto& r) { r.mutable_segments()->add_segments()->mutable_text(); }},
          {"segments[1].context.text",
           [](auto& r) {
             r.mutable_segments()->add_segments()->mutable_text()->set_text("Read:");
             r.mutable_segments()->add_segments()->mutable_context();
           }},
          {"segments[0].embedding.rows", [&](auto& r) { AddEmbedding(r, 0, hidden); }},
          {"segments[0].embedding.values", [&](auto& r) { AddEmbedding(r, 2, hidden - 1); }},
          {"segments[0].embedding.values[3]",
           [&](auto& r) { AddEmbedding(r, 1, hidden)->set_values(3, std::nanf("")); }},
          {"input",  // longer than max_prompt_tokens (64)
           [](auto& r) {
             for (int i = 0; i < 65; ++i) r.mutable_token_ids()->add_ids(1);
           }},
      },
      Limits(), *model_);
}

TEST_F(RequestBuilderTest, RejectsEveryBadParameterNamingItsField) {
  const float nan = std::nanf("");
  ExpectRejected(
      {
          {"stopping.max_tokens", [](auto& r) { r.mutable_stopping()->set_max_tokens(0); }},
          {"stopping.max_tokens", [](auto& r) { r.mutable_stopping()->set_max_tokens(101); }},
          {"stopping.stop",
           [](auto& r) {
             for (int i = 0; i < 65; ++i) r.mutable_stopping()->add_stop(std::string("x"));
           }},
          {"stopping.stop[2]",
           [](auto& r) {
             for (std::string stop : {"a", "b", ""}) r.mutable_stopping()->add_stop(stop);
           }},
          {"stopping.stop_token_ids[0]",
           [](auto& r) { r.mutable_stopping()->add_stop_token_ids(-1); }},
          {"top_logprobs", [](auto& r) { r.set_top_logprobs(21); }},
          {"cache_salt", [](auto& r) { r.set_cache_salt(std::string(257, 's')); }},
          {"top_logprobs", [](auto& r) { r.set_top_logprobs(-1); }},
          {"sampling.temperature", [&](auto& r) { r.mutable_sampling()->set_temperature(nan); }},
          {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); }},
          {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(0); }},
          {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }},
          {"sampling.top_k", [](auto& r) { r.mutable_sampling()->set_top_k(-1); }},
          {"sampling.min_p", [](auto& r) { r.mutable_sampling()->set_min_p(1.5f); }},
          {"sampling.repetition_penalty",
           [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0); }},
          {"sampling.frequency_penalty",
           [](auto& r) { r.mutable_sampling()->set_frequency_penalty(3); }},
          {"sampling.presence_penalty",
           [&](auto& r) { r.mutable_sampling()->set_presence_penalty(nan); }},
          {"sampling.logit_bias[-1]",
           [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[-1] = 1; }},
          {"sampling.logit_bias[5]",
           [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = 101; }},
          {"sampling.logit_bias[5]",
           [&](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = nan; }},
          {"response_format.json_schema: properties.a.pattern",
           [](auto& r) {
             r.mutable_response_format()->set_json_schema(
                 R"({"properties": {"a": {"type": "string", "pattern": "x"}}})");
           }},
          {"response_format.json_schema: the schema is not valid JSON",
           [](auto& r) { r.mutable_response_format()->set_json_schema("{"); }},
          {"response_format.json_object",
           [](auto& r) { r.mutable_response_format()->set_json_object(false); }},
          {"response_format: cannot be combined with stopping.ignore_eos",
           [](auto& r) {
             r.mutable_response_format()->set_json_object(true);
             r.mutable_stopping()->set_ignore_eos(true);
           }},
      },
      Limits(), *model_);
}

TEST_F(RequestBuilderTest, ResponseFormatAndLogitBiasComeOutTyped) {
  v1::GenerateRequest r = Valid();
  (*r.mutable_sampling()->mutable_logit_bias())[7] = -100;
  (*r.mutable_sampling()->mutable_logit_bias())[3] = 2.5f;
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}})";
  r.mutable_response_format()->set_json_schema(schema);
  absl::StatusOr<scheduler::GenerationRequest> out = Build(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {7, -100.0f}}));
  ASSERT_NE(out->grammar, nullptr);
  // The same schema text shares one compiled grammar (and its cached masks).
  absl::StatusOr<scheduler::GenerationRequest> again = Build(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->grammar, out->grammar);
  EXPECT_EQ(Build(Valid())->grammar, nullptr);
}

// Everything about compression, including what only the policy itself knows about its params.
TEST_F(RequestBuilderTest, RejectsEveryBadCompressionFieldNamingIt) {
  auto spec = [](v1::GenerateRequest& r, const std::string& policy, double budget) {
    r.mutable_compression()->set_policy(policy);
    r.mutable_compression()->set_budget(budget);
    return r.mutable_compression();
  };
  auto params = [&](const std::string& policy, const std::string& key, double value) {
    return [=](v1::GenerateRequest& r) { (*spec(r, policy, 0.5)->mutable_params())[key] = value; };
  };
  auto options = [&](const std::string& policy, const std::string& key, const std::string& v) {
    return [=](v1::GenerateRequest& r) { (*spec(r, policy, 0.5)->mutable_options())[key] = v; };
  };
  ExpectRejected(
      {
          {"compression.policy", [&](auto& r) { spec(r, "snapkv-typo", 0.5); }},
          {"compression.budget", [&](auto& r) { spec(r, "snapkv", 0.0); }},
          {"compression.budget", [&](auto& r) { spec(r, "snapkv", 1.5); }},
          {"compression.budget", [&](auto& r) { spec(r, "snapkv", std::nan("")); }},
          {"compression.budget", [&](auto& r) { spec(r, "none", 0.5); }},
          {"compression.params",
           [&](auto& r) { (*spec(r, "none", 0)->mutable_params())["window"] = 8; }},
          {"compression.params", [&](auto& r) { (*spec(r, "", 0)->mutable_params())["w"] = 8; }},
          {"compression.options", [&](auto& r) {
             (*spec(r, "none", 0)->mutable_options())["pooling"] = "max";
           }},
          {"compression.params.window", params("snapkv", "window", std::nan(""))},
          {"compression.params.window",
           [&](auto& r) {
             (*spec(r, "snapkv", 0.5)->mutable_params())["window"] = 8;
             (*r.mutable_compression()->mutable_options())["window"] = "8";
           }},
          // Only the policy knows these: checked by building it as the engine will.
          {"compression.params.kernal", params("snapkv", "kernal", 5)},
          {"compression.params.window", params("snapkv", "window", 0)},
          {"compression.params.window", params("snapkv", "window", 1e9)},
          {"compression.params.category", params("xkv", "category", 2.5)},
          {"compression.params.category", params("xkv", "category", -1)},
          {"compression.params.alpha", params("aircache", "alpha", 1.5)},
          {"compression.params.pooling", params("snapkv", "pooling", 1)},
          {"compression.params.redistribute", params("vl_cache", "redistribute", 2)},
          {"compression.options.pooling", options("snapkv", "pooling", "median")},
          {"compression.options.poolin", options("snapkv", "poolin", "max")},
          {"compression.options.window", options("snapkv", "window", "8")},
          {"compression.options.mode", options("xkv", "mode", "offline")},
          // A context's scope and extent.
          {"compression.scope", [&](auto& r) { spec(r, "snapkv", 0.5)->set_scope("question"); }},
          {"compression.scope", [&](auto& r) { spec(r, "none", 0)->set_scope("context"); }},
          {"compression.scope",  // a prompt without a ContextSpan gives no extent
           [&](auto& r) { spec(r, "snapkv", 0.5)->set_scope("context"); }},
          {"compression.context_tokens",
           [&](auto& r) { spec(r, "snapkv", 0.5)->set_context_tokens(3); }},
          {"compression.context_tokens",
           [&](auto& r) {
             spec(r, "snapkv", 0.5)->set_scope("context");
             r.mutable_compression()->set_context_tokens(10000);
           }},
          {"compression.context_tokens",
           [&](auto& r) {
             spec(r, "snapkv", 0.5)->set_scope("context");
             r.mutable_compression()->set_context_tokens(-1);
           }},
          {"compression.context_messages",
           [&](auto& r) {
             spec(r, "snapkv", 0.5)->set_scope("context");
             r.mutable_compression()->set_context_messages(1);  // prompt input, not chat
           }},
          {"compression.stage_tokens",  // stages are "history"'s
           [&](auto& r) {
             spec(r, "snapkv", 0.5)->set_scope("context");
             r.mutable_compression()->set_context_tokens(3);
             r.mutable_compression()->set_stage_tokens(2);
           }},
          {"compression.stage_tokens",
           [&](auto& r) {
             spec(r, "snapkv", 0.5)->set_scope("history");
             r.mutable_compression()->set_context_tokens(3);
             r.mutable_compression()->set_stage_tokens(-2);
           }},
          {"compression.scope",  // reads rows one by one: cannot plan a stage alone
           [&](auto& r) {
             spec(r, "vl_cache", 0.5)->set_scope("history");
             r.mutable_compression()->set_context_tokens(3);
           }},
      },
      Limits(), *model_);
}

// compression.scope "context": where the context ends, from context_tokens, from the first
// messages of a chat as the template renders them, or from the last ContextSpan.
TEST_F(RequestBuilderTest, AContextScopeEndsWhereTheRequestSays) {
  v1::GenerateRequest r = Valid();
  v1::CompressionSpec* c = r.mutable_compression();
  c->set_policy("snapkv");
  c->set_budget(0.5);
  c->set_scope("context");
  c->set_context_tokens(3);
  absl::StatusOr<scheduler::GenerationRequest> out = Build(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->compression.context_tokens, 3);

  v1::GenerateRequest chat = Chat({{"system", "Answer from the document."},
                                   {"user", "Document: Paris is the capital of France."},
                                   {"user", "What is the capital of France?"}});
  *chat.mutable_compression() = *c;
  chat.mutable_compression()->set_context_tokens(0);
  chat.mutable_compression()->set_context_messages(2);
  out = Build(chat);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->compression.context_tokens, TokensBeforeLastMessage(chat));  // the first two
  EXPECT_LT(out->compression.context_tokens, static_cast<int32_t>(out->prompt_tokens.size()));
  chat.mutable_compression()->set_context_messages(4);
  EXPECT_NE(Build(chat).status().message().find("compression.context_messages"),
            std::string::npos);

  v1::GenerateRequest segments;
  segments.mutable_segments()->add_segments()->mutable_context()->set_text("Paris is in France.");
  segments.mutable_segments()->add_segments()->mutable_text()->set_text(" Where is Paris?");
  *segments.mutable_compression() = *c;
  segments.mutable_compression()->set_context_tokens(0);
  out = Build(segments);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->prompt_spans.size(), 1u);
  EXPECT_EQ(out->compression.context_tokens, out->prompt_spans[0].end);
}

// compression.scope "history": a chat's messages but the last (or the extent given), in whole
// stages of stage_tokens; a history short of one stage is not compressed at all.
TEST_F(RequestBuilderTest, AHistoryScopeCompressesWholeStagesOfEveryMessageButTheLast) {
  v1::GenerateRequest chat =
      Chat({{"system", "Answer from the conversation."},
            {"user", "Paris is the capital of France, and Rome is the capital of Italy."},
            {"assistant", "Noted: Paris for France and Rome for Italy."},
            {"user", "What is the capital of Italy?"}});
  v1::CompressionSpec* c = chat.mutable_compression();
  c->set_policy("kvzip");
  c->set_budget(0.5);
  c->set_scope("history");
  c->set_stage_tokens(8);
  absl::StatusOr<scheduler::GenerationRequest> out = Build(chat);
  ASSERT_TRUE(out.ok()) << out.status();
  const int32_t history_tokens = TokensBeforeLastMessage(chat);
  const int32_t stages = history_tokens / 8;
  ASSERT_GE(stages, 2);
  std::vector<int32_t> ends;
  for (int32_t i = 1; i <= stages; ++i) ends.push_back(8 * i);
  EXPECT_EQ(out->compression.stage_ends, ends);
  EXPECT_EQ(out->compression.context_tokens, 8 * stages);

  c->set_stage_tokens(history_tokens + 1);  // not one whole stage yet: the prompt runs whole
  out = Build(chat);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->compression.enabled());
  EXPECT_EQ(out->compression.context_tokens, 0);
}

TEST_F(RequestBuilderTest, ValidRequestComesOutTyped) {
  v1::GenerateRequest r = Valid();
  r.set_request_id("abc");
  r.set_cache_salt("tenant-7");
  r.set_priority(3);
  r.set_logprobs(false);
  r.set_top_logprobs(2);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(0.7f);
  s->set_top_k(5);
  s->set_min_p(0.05f);
  s->set_frequency_penalty(0.5f);
  s->set_presence_penalty(-0.5f);
  s->set_seed(42);
  v1::StoppingCriteria* stop = r.mutable_stopping();
  stop->set_max_tokens(8);
  stop->add_stop("\n");
  stop->add_stop_token_ids(2);
  stop->set_ignore_eos(true);
  v1::CompressionSpec* c = r.mutable_compression();
  c->set_policy("snapkv");
  c->set_budget(0.5);
  (*c->mutable_params())["window"] = 4;
  (*c->mutable_options())["pooling"] = "max";

  absl::StatusOr<scheduler::GenerationRequest> out = Build(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->request_id, "abc");
  EXPECT_EQ(out->cache_salt, "tenant-7");
  EXPECT_EQ(out->prompt_tokens, model_->tokenizer().Encode("The capital of France is", true, true));
  EXPECT_TRUE(out->embeddings.empty());
  EXPECT_TRUE(out->prompt_spans.empty());
  EXPECT_FLOAT_EQ(out->sampling.temperature, 0.7f);
  EXPECT_EQ(out->sampling.top_k, 5);
  EXPECT_EQ(out->sampling.top_p, 1.0f);               // unset: off
  EXPECT_EQ(out->sampling.repetition_penalty, 1.0f);  // unset: off
  EXPECT_FLOAT_EQ(out->sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(out->sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(out->sampling.presence_penalty, -0.5f);
  EXPECT_EQ(out->sampling.seed, 42u);
  EXPECT_EQ(out->sampling.top_logprobs, 2);
  EXPECT_TRUE(out->logprobs);  // top_logprobs implies it
  EXPECT_EQ(out->max_tokens, 8);
  EXPECT_EQ(out->stop_strings, std::vector<std::string>{"\n"});
  EXPECT_EQ(out->stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(out->ignore_eos);
  EXPECT_EQ(out->priority, 3);
  EXPECT_EQ(out->compression.policy, "snapkv");
  EXPECT_EQ(out->compression.budget, 0.5);
  ASSERT_EQ(out->compression.params.size(), 2u);
  EXPECT_EQ(out->compression.params.at("window"), PolicyParam(4.0));
  EXPECT_EQ(out->compression.params.at("pooling"), PolicyParam(std::string("max")));
}

TEST_F(RequestBuilderTest, SamplesDrawFromSuccessiveSeedsAndOnlyTheFirstScoresThePrompt) {
  v1::GenerateRequest r = Valid();
  r.mutable_sampling()->set_seed(42);
  r.set_prompt_logprobs(2);
  r.set_n(3);
  absl::StatusOr<std::vector<scheduler::GenerationRequest>> samples =
      BuildSamples(r, *model_, Limits());
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 3u);
  for (size_t i = 0; i < samples->size(); ++i) {
    const scheduler::GenerationRequest& sample = (*samples)[i];
    EXPECT_EQ(sample.sampling.seed, 42u + i);
    EXPECT_EQ(sample.prompt_logprobs, i == 0 ? 2 : -1);
    EXPECT_EQ(sample.prompt_tokens, (*samples)[0].prompt_tokens);
  }
  for (int32_t n : {0, 1}) {
    r.set_n(n);
    samples = BuildSamples(r, *model_, Limits());
    ASSERT_TRUE(samples.ok()) << samples.status();
    EXPECT_EQ(samples->size(), 1u);
  }
  for (int32_t n : {-1, kMaxSamples + 1}) {
    r.set_n(n);
    samples = BuildSamples(r, *model_, Limits());
    EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(samples.status().message(), "n: ")) << samples.status();
  }
}

TEST_F(RequestBuilderTest, DefaultMaxTokensIsCappedByLimitAndContext) {
  v1::GenerateRequest r = Valid();
  RequestLimits limits = Limits();
  limits.default_max_tokens = 256;
  limits.max_tokens_limit = 100;
  absl::StatusOr<scheduler::GenerationRequest> out = BuildGenerationRequest(r, *model_, limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->max_tokens, 100);
  limits.max_tokens_limit = 0;
  limits.context_length = static_cast<int32_t>(out->prompt_tokens.size()) + 10;
  out = BuildGenerationRequest(r, *model_, limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->max_tokens, 10);
  // Unseeded requests get different seeds.
  EXPECT_NE(Build(r)->sampling.seed, Build(r)->sampling.seed);
}

TEST_F(RequestBuilderTest, SegmentsBecomeValidSpans) {
  v1::GenerateRequest r;
  v1::Segments* segs = r.mutable_segments();
  segs->add_segments()->mutable_text()->set_text("Look:");
  AddEmbedding(r, 3, Hidden());
  segs->add_segments()->mutable_context()->set_text("Paris is the capital of France.");
  segs->add_segments()->mutable_text()->set_text(" What is the capital?");
  r.mutable_compression()->set_policy("vl_cache");
  r.mutable_compression()->set_budget(0.5);
  absl::StatusOr<scheduler::GenerationRequest> out = Build(r);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->prompt_spans.size(), 2u);
  const auto& image = out->prompt_spans[0];
  const auto& context = out->prompt_spans[1];
  EXPECT_EQ(image.kind, SpanKind::kImage);
  EXPECT_EQ(context.kind, SpanKind::kContext);
  EXPECT_EQ(image.end - image.begin, 3);
  EXPECT_EQ(context.begin, image.end);
  EXPECT_LT(context.end, static_cast<int32_t>(out->prompt_tokens.size()));
  for (int32_t p = image.begin; p < image.end; ++p) {
    EXPECT_EQ(out->prompt_tokens[p], model::kEmbeddingInput);
  }
  EXPECT_EQ(out->embeddings.size(), static_cast<size_t>(3 * Hidden()));
  cache::policies::PromptLayout layout;
  layout.num_tokens = static_cast<int32_t>(out->prompt_tokens.size());
  layout.spans = out->prompt_spans;
  EXPECT_TRUE(layout.Validate().ok());
}

// Issue 9: params were turned into text with six significant digits, so this was refused as
// "not an integer". Numbers now reach the policy as the doubles the client sent.
TEST_F(RequestBuilderTest, XkvCategoryAndDoublesReachThePolicyExactly) {
  v1::GenerateRequest r = Valid();
  v1::CompressionSpec* c = r.mutable_compression();
  c->set_policy("xkv");
  c->set_budget(0.5);
  (*c->mutable_params())["category"] = 1048576;
  (*c->mutable_params())["r_target"] = 0.1234567891;
  (*c->mutable_options())["mode"] = "profile";
  absl::StatusOr<scheduler::GenerationRequest> out = Build(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->compression.params.at("category"), PolicyParam(1048576.0));
  EXPECT_EQ(out->compression.params.at("r_target"), PolicyParam(0.1234567891));
  // What the engine's policy will parse from the typed request.
  absl::StatusOr<cache::policies::XkvOptions> parsed = cache::policies::ParseXkvOptions(
      cache::policies::PolicyConfig(out->compression.budget, out->compression.params));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->category, 1048576);
  EXPECT_EQ(parsed->r_target, 0.1234567891);
  EXPECT_TRUE(parsed->profile);
}

// Needs no model.
TEST(RequestLimitsTest, LimitsForCopiesTheEngineLimits) {
  scheduler::EngineLimits engine;
  engine.max_prompt_tokens = 100;
  engine.max_tokens_limit = 50;
  engine.context_length = 2048;
  engine.block_size = 32;
  const RequestLimits limits = LimitsFor(engine);
  EXPECT_EQ(limits.max_prompt_tokens, 100);
  EXPECT_EQ(limits.max_tokens_limit, 50);
  EXPECT_EQ(limits.context_length, 2048);
  EXPECT_EQ(limits.block_size, 32);
}

}  // namespace
}  // namespace winnow::server
