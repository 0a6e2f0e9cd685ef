// Structured output against the real model: token masks equal a brute-force check of every
// token, and constrained generation through the engine gives JSON of the schema, greedy and
// sampled, alone and batched.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "nlohmann/json.hpp"
#include "scheduler/engine.h"
#include "structured/grammar_cache.h"
#include "tests/unit/scheduler/engine_test_util.h"

namespace winnow::structured {
namespace {

using Json = nlohmann::json;
using testing_util::CollectingSink;

constexpr char kPersonSchema[] = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Lima", "Oslo"]},
    "skills": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3}},
  "required": ["name", "age", "city"]})";

class StructuredEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("WINNOW_TEST_MODEL");
    if (path == nullptr) return;
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(path);
    if (!m.ok()) return;
    model_ = std::move(*m).release();
    const model::Tokenizer& tok = model_->tokenizer();
    vocab_ = new std::shared_ptr<const TokenVocabulary>(std::make_shared<const TokenVocabulary>(
        tok.Pieces(/*render_special=*/false), tok.end_of_generation_ids()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete vocab_;
    model_ = nullptr;
    vocab_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "WINNOW_TEST_MODEL not set or not loadable";
  }

  static std::vector<int32_t> ChatPrompt(const std::string& user) {
    const auto rendered = model_->chat_template()->Apply({{"user", user}}, true);
    return model::EncodeRenderedChat(model_->tokenizer(), *rendered, true);
  }

  static scheduler::GenerationRequest PersonRequest(float temperature, uint64_t seed) {
    scheduler::GenerationRequest r;
    r.prompt_tokens = ChatPrompt("Describe a person as JSON with name, age, city and skills.");
    r.max_tokens = 200;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.grammar = *CompileJsonSchema(kPersonSchema);
    return r;
  }

  static void ExpectPerson(const std::string& text) {
    const Json j = Json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j["name"].is_string()) << text;
    EXPECT_LE(j["name"].get<std::string>().size(), 20u * 4) << text;
    ASSERT_TRUE(j["age"].is_number_integer()) << text;
    EXPECT_GE(j["age"].get<int>(), 0);
    EXPECT_LE(j["age"].get<int>(), 120);
    EXPECT_TRUE(j["city"] == "Paris" || j["city"] == "Lima" || j["city"] == "Oslo") << text;
    if (j.contains("skills")) {
      EXPECT_LE(j["skills"].size(), 3u) << text;
    }
    for (const auto& [key, value] : j.items()) {
      EXPECT_TRUE(key == "name" || key == "age" || key == "city" || key == "skills") << text;
    }
  }

  static model::Model* model_;
  static std::shared_ptr<const TokenVocabulary>* vocab_;
};

model::Model* StructuredEngineTest::model_ = nullptr;
std::shared_ptr<const TokenVocabulary>* StructuredEngineTest::vocab_ = nullptr;

TEST_F(StructuredEngineTest, MasksEqualABruteForceCheckOfEveryToken) {
  const auto grammar = *CompileJsonSchema(kPersonSchema);
  const JsonMatcher& m = grammar->matcher;
  const TokenVocabulary& vocab = **vocab_;
  for (const char* prefix : {"", "{", "{\"name\": \"Al", "{\"name\": \"A\", \"age\": 1",
                             "{\"name\": \"A\", \"age\": 12, \"city\": \"", "{\"name\": \"A\", "
                             "\"age\": 1, \"city\": \"Oslo\", \"skills\": [\"x\"]"}) {
    MatchState state = m.Initial();
    ASSERT_TRUE(m.FeedAll(state, prefix)) << prefix;
    const TokenMask mask = ComputeTokenMask(m, vocab, state);
    int allowed = 0;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      bool expect = false;
      if (vocab.IsEnd(id)) {
        expect = m.CanEnd(state);
      } else if (!vocab.piece(id).empty()) {
        MatchState s = state;
        expect = m.FeedAll(s, vocab.piece(id));
      }
      ASSERT_EQ(Allows(mask, id), expect) << "prefix " << prefix << " token " << id << " "
                                          << Json(vocab.piece(id)).dump();
      allowed += expect;
    }
    EXPECT_GT(allowed, 0) << prefix;
  }
}

TEST_F(StructuredEngineTest, GreedyAndSampledOutputsAreValidAndBatchingChangesNothing) {
  scheduler::EngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  auto engine = scheduler::Engine::Create(model_, options, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<scheduler::GenerationRequest> requests = {PersonRequest(0.0f, 0)};
  for (uint64_t seed = 1; seed <= 4; ++seed) requests.push_back(PersonRequest(1.0f, seed));
  // Alone, then all at once: the same tokens (each sampled request has its own seed stream).
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) {
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE((*engine)->Submit(r, sink).ok());
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->finish().reason, scheduler::FinishReason::kStop) << sink->text();
    ExpectPerson(sink->text());
    alone.push_back(sink->tokens());
  }
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const auto& r : requests) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(r, sinks.back()).ok());
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitDone());
    EXPECT_EQ(sinks[i]->tokens(), alone[i]) << i;
  }
  ASSERT_TRUE((*engine)->WaitForIdle(absl::Seconds(10)));
  const auto snap = (*engine)->Snapshot();
  EXPECT_EQ(snap.kv_blocks_free, snap.kv_blocks_total);
}

TEST_F(StructuredEngineTest, JsonObjectModeGivesAnObject) {
  auto engine = scheduler::Engine::Create(model_, {}, nullptr);
  ASSERT_TRUE(engine.ok());
  scheduler::GenerationRequest r;
  r.prompt_tokens = ChatPrompt("List three colours.");
  r.max_tokens = 200;
  r.grammar = JsonObjectGrammar();
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE((*engine)->Submit(r, sink).ok());
  ASSERT_TRUE(sink->WaitDone());
  if (sink->finish().reason == scheduler::FinishReason::kStop) {
    const Json j = Json::parse(sink->text(), nullptr, false);
    EXPECT_TRUE(j.is_object()) << sink->text();
  } else {
    // Cut by max_tokens: still a prefix of an object.
    EXPECT_EQ(sink->text().front(), '{') << sink->text();
  }
}

}  // namespace
}  // namespace winnow::structured
