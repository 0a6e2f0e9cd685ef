#include "structured/json_matcher.h"

#include <gtest/gtest.h>

#include <string>

#include "structured/grammar.h"

namespace winnow::structured {
namespace {

JsonMatcher Matcher(std::string_view schema) {
  auto grammar = Grammar::FromJsonSchema(schema);
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  return JsonMatcher(*grammar);
}

// Whether `text` is a complete output of the grammar.
bool Accepts(const JsonMatcher& m, std::string_view text) {
  MatchState s = m.Initial();
  return m.FeedAll(s, text) && m.CanEnd(s);
}

// Whether `text` can still be continued into an output.
bool IsPrefix(const JsonMatcher& m, std::string_view text) {
  MatchState s = m.Initial();
  return m.FeedAll(s, text);
}

TEST(JsonMatcherTest, ObjectWithRequiredAndOptionalPropertiesInOrder) {
  const JsonMatcher m = Matcher(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["name", "tags"]})");
  EXPECT_TRUE(Accepts(m, R"({"name": "Ada", "age": 36, "tags": []})"));
  EXPECT_TRUE(Accepts(m, R"({"name":"Ada","tags":["x","y"]})"));
  EXPECT_TRUE(Accepts(m, "{\n  \"name\": \"A\",\n  \"tags\": [ \"b\" ]\n}"));
  EXPECT_FALSE(Accepts(m, R"({"name": "Ada"})"));                  // tags required
  EXPECT_FALSE(IsPrefix(m, R"({"age": 3)"));                        // name first
  EXPECT_FALSE(IsPrefix(m, R"({"name": "Ada", "nick")"));           // undeclared
  EXPECT_FALSE(IsPrefix(m, R"({"name": "Ada", "tags": [], "age")"));  // declared order
  EXPECT_FALSE(IsPrefix(m, R"({"name": 3)"));
  EXPECT_FALSE(Accepts(m, R"({"name": "Ada", "tags": []} )"));     // nothing after the value
}

TEST(JsonMatcherTest, PropertyOrderIsTheSchemasNotAlphabetical) {
  const JsonMatcher m = Matcher(R"({"properties": {"zeta": {"type": "null"},
      "alpha": {"type": "boolean"}}, "required": ["zeta", "alpha"]})");
  EXPECT_TRUE(Accepts(m, R"({"zeta": null, "alpha": true})"));
  EXPECT_FALSE(IsPrefix(m, R"({"alpha")"));
}

TEST(JsonMatcherTest, AdditionalPropertiesSchemaAndFreeObjects) {
  const JsonMatcher dict = Matcher(R"({"type": "object",
      "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Accepts(dict, R"({"a": 1, "b\n": -2})"));
  EXPECT_TRUE(Accepts(dict, "{}"));
  EXPECT_FALSE(IsPrefix(dict, R"({"a": "x)"));
  const JsonMatcher any = Matcher(R"({"type": "object"})");
  EXPECT_TRUE(Accepts(any, R"({"a": [1, {"b": null}, "c", true, -0.5e3]})"));
  EXPECT_FALSE(Accepts(any, "[]"));
}

TEST(JsonMatcherTest, StringsEscapesUtf8AndLengths) {
  const JsonMatcher m = Matcher(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(Accepts(m, R"("ab")"));
  EXPECT_TRUE(Accepts(m, "\"\xC3\xA9t\xC3\xA9\""));   // 3 code points, 5 bytes
  EXPECT_TRUE(Accepts(m, R"("\n\u00e9")"));
  EXPECT_FALSE(Accepts(m, R"("a")"));
  EXPECT_FALSE(IsPrefix(m, R"("abcd)"));
  EXPECT_FALSE(IsPrefix(m, "\"a\xC3("));        // broken UTF-8
  EXPECT_FALSE(IsPrefix(m, "\"\xED\xA0"));      // a surrogate encoded in UTF-8
  EXPECT_FALSE(IsPrefix(m, R"("\uD8)"));        // an escaped surrogate
  EXPECT_FALSE(IsPrefix(m, "\"a\nb"));          // raw control character
  EXPECT_FALSE(IsPrefix(m, R"("\x)"));
}

TEST(JsonMatcherTest, IntegerBoundsPruneEveryDeadPrefix) {
  const JsonMatcher m = Matcher(R"({"type": "integer", "minimum": 10, "maximum": 250})");
  EXPECT_TRUE(Accepts(m, "10"));
  EXPECT_TRUE(Accepts(m, "250"));
  EXPECT_FALSE(Accepts(m, "9"));        // a prefix of 90..99, but not an answer itself
  EXPECT_TRUE(IsPrefix(m, "9"));
  EXPECT_TRUE(Accepts(m, "26"));
  EXPECT_FALSE(IsPrefix(m, "251"));     // 251, 2510.. all out of range
  EXPECT_FALSE(IsPrefix(m, "-"));
  EXPECT_FALSE(IsPrefix(m, "0"));
  EXPECT_FALSE(IsPrefix(m, "1."));
  EXPECT_FALSE(IsPrefix(m, "1e"));
  EXPECT_FALSE(IsPrefix(m, "2500"));
}

TEST(JsonMatcherTest, NumberBoundsWithExclusiveEnds) {
  const JsonMatcher m = Matcher(R"({"type": "number", "exclusiveMinimum": 0,
      "exclusiveMaximum": 1})");
  EXPECT_TRUE(Accepts(m, "0.5"));
  EXPECT_TRUE(Accepts(m, "0.999"));
  EXPECT_FALSE(Accepts(m, "0"));
  EXPECT_FALSE(Accepts(m, "0.0"));
  EXPECT_TRUE(IsPrefix(m, "0.0"));      // 0.01 is inside
  EXPECT_FALSE(IsPrefix(m, "1"));       // 1 and 1.x are all >= 1
  EXPECT_FALSE(IsPrefix(m, "-"));
  const JsonMatcher neg = Matcher(R"({"type": "number", "maximum": -2.5})");
  EXPECT_TRUE(Accepts(neg, "-2.5"));
  EXPECT_TRUE(Accepts(neg, "-300"));
  EXPECT_FALSE(Accepts(neg, "-2.4"));
  EXPECT_FALSE(IsPrefix(neg, "2"));
}

TEST(JsonMatcherTest, UnboundedNumbersFollowJsonSyntax) {
  const JsonMatcher m = Matcher(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "12.5", "1e5", "-3.25E-2", "7e+10", "1e99"}) {
    EXPECT_TRUE(Accepts(m, ok)) << ok;
  }
  EXPECT_FALSE(IsPrefix(m, "1e100"));  // 1e400 would overflow a double
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.e3"}) {
    EXPECT_FALSE(Accepts(m, bad)) << bad;
  }
}

TEST(JsonMatcherTest, EnumConstAndLiteralPrefixes) {
  const JsonMatcher m = Matcher(R"({"enum": [1, 12, "red", null, {"a": [true]}]})");
  for (const char* ok : {"1", "12", "\"red\"", "null", "{\"a\":[true]}"}) {
    EXPECT_TRUE(Accepts(m, ok)) << ok;
  }
  EXPECT_FALSE(Accepts(m, "123"));
  EXPECT_FALSE(IsPrefix(m, "\"blue"));
  const JsonMatcher typed = Matcher(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_FALSE(Accepts(typed, "1"));    // enum values of another type are dropped
  const JsonMatcher c = Matcher(R"({"const": "x"})");
  EXPECT_TRUE(Accepts(c, "\"x\""));
  EXPECT_FALSE(IsPrefix(c, "\"y"));
}

TEST(JsonMatcherTest, AnyOfSharesPrefixesUntilTheyPart) {
  const JsonMatcher m = Matcher(R"({"anyOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
      {"type": ["string", "null"]}]})");
  EXPECT_TRUE(Accepts(m, R"({"a": 1})"));
  EXPECT_TRUE(Accepts(m, R"({"b": "x"})"));
  EXPECT_TRUE(Accepts(m, "null"));
  EXPECT_TRUE(Accepts(m, R"("s")"));
  EXPECT_FALSE(IsPrefix(m, R"({"a": "x)"));
  EXPECT_FALSE(IsPrefix(m, R"({"c")"));
}

TEST(JsonMatcherTest, ArraysCountItems) {
  const JsonMatcher m = Matcher(R"({"type": "array", "items": {"type": "boolean"},
      "minItems": 1, "maxItems": 2})");
  EXPECT_TRUE(Accepts(m, "[true]"));
  EXPECT_TRUE(Accepts(m, "[true, false]"));
  EXPECT_FALSE(Accepts(m, "[]"));
  EXPECT_FALSE(IsPrefix(m, "[true, false,"));
  EXPECT_FALSE(IsPrefix(m, "[true,]"));
}

TEST(JsonMatcherTest, RefsDefsAndRecursionWithABoundedDepth) {
  const JsonMatcher m = Matcher(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Accepts(m, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  std::string deep;
  for (int i = 0; i < kMaxDepth; ++i) deep += R"({"v": 1, "kids": [)";
  EXPECT_FALSE(IsPrefix(m, deep));
}

TEST(JsonMatcherTest, AnAnyOfThatReachesItselfIsCutNotRecursedForever) {
  const JsonMatcher m = Matcher(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"},
      {"type": "null"}]}}, "$ref": "#/$defs/a"})");
  EXPECT_TRUE(Accepts(m, "null"));
  EXPECT_FALSE(IsPrefix(m, "1"));
}

TEST(JsonMatcherTest, ToolCallsInHermesFormat) {
  const std::vector<ToolSpec> tools = {
      {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]})"},
      {"now", ""}};
  auto one = Grammar::ForToolCalls(tools, /*parallel=*/false, ToolCallFormat{});
  ASSERT_TRUE(one.ok()) << one.status();
  const JsonMatcher single(*one);
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(Accepts(single, weather));
  EXPECT_TRUE(Accepts(single, now));
  EXPECT_FALSE(Accepts(single, weather + "\n" + now));
  EXPECT_FALSE(IsPrefix(single, "<tool_call>\n{\"name\": \"set"));
  EXPECT_FALSE(IsPrefix(single, "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"x"));
  EXPECT_FALSE(IsPrefix(single, "Sure! <tool_call>"));
  auto many = Grammar::ForToolCalls(tools, /*parallel=*/true, ToolCallFormat{});
  ASSERT_TRUE(many.ok());
  const JsonMatcher parallel(*many);
  EXPECT_TRUE(Accepts(parallel, weather));
  std::string calls = weather;
  for (int i = 0; i < 3 * kMaxDepth; ++i) calls += "\n" + (i % 2 ? weather : now);
  EXPECT_TRUE(Accepts(parallel, calls));  // the stack does not grow per call
  EXPECT_FALSE(Accepts(parallel, weather + "\n"));
  auto bad = Grammar::ForToolCalls({{"f", R"({"type": "object", "not": {}})"}}, false, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "tools[0].parameters.not: the keyword \"not\" is not supported in structured output");
}

TEST(JsonMatcherTest, ToolCallsInLlamaJsonFormat) {
  const std::vector<ToolSpec> tools = {
      {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]})"}};
  auto grammar = Grammar::ForToolCalls(tools, /*parallel=*/false, ToolCallFormat::LlamaJson());
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  const JsonMatcher m(*grammar);
  EXPECT_TRUE(Accepts(m, R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"));
  EXPECT_FALSE(IsPrefix(m, R"({"name": "get_weather", "arguments")"));
  EXPECT_FALSE(IsPrefix(m, "<tool_call>"));
  EXPECT_FALSE(IsPrefix(m, "Sure"));
}

TEST(JsonMatcherTest, WhitespaceIsBounded) {
  const JsonMatcher m = Matcher(R"({"type": "array"})");
  EXPECT_TRUE(IsPrefix(m, "[" + std::string(kMaxWhitespace, ' ')));
  EXPECT_FALSE(IsPrefix(m, "[" + std::string(kMaxWhitespace + 1, ' ')));
}

TEST(GrammarTest, UnsupportedKeywordsAreErrorsNamingThePath) {
  auto bad = [](std::string_view schema) {
    auto g = Grammar::FromJsonSchema(schema);
    return g.ok() ? std::string("ok") : std::string(g.status().message());
  };
  EXPECT_EQ(bad(R"({"properties": {"a": {"type": "string", "pattern": "x+"}}})"),
            "properties.a.pattern: the keyword \"pattern\" is not supported in structured output");
  EXPECT_EQ(bad(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "minimum: no number lies between the bounds");
  EXPECT_EQ(bad(R"({"$ref": "#/$defs/missing"})"), "$ref: \"#/$defs/missing\" does not resolve");
  EXPECT_EQ(bad(R"({"required": ["a"]})"),
            "required: names \"a\", which \"properties\" does not declare");
  EXPECT_EQ(bad("false"), "the schema: the schema `false` accepts nothing");
  EXPECT_EQ(bad("{"), "the schema is not valid JSON");
  EXPECT_EQ(bad(R"({"type": "float"})"), "type: unknown type \"float\"");
  EXPECT_EQ(bad(R"({"description": "x", "format": "date-time", "type": "string"})"), "ok");
}

}  // namespace
}  // namespace winnow::structured
