// The Hermes tool-call parser: whole replies, and streams cut at every byte giving the same calls
// and content.
#include "server/http/tool_calls.h"

#include <gtest/gtest.h>

#include <string>

namespace winnow::server::http {
namespace {

TEST(ToolCallsTest, WholeReplies) {
  ParsedReply r = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
      "</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);

  // No calls: the text as it is. A block that is not a call stays content.
  EXPECT_EQ(ParseToolCalls("  plain  ").content, "  plain  ");
  r = ParseToolCalls("<tool_call>not json</tool_call> and <tool_call>{\"arguments\": {}}");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "<tool_call>not json</tool_call> and <tool_call>{\"arguments\": {}}");
  EXPECT_EQ(ParseToolCalls("a < b <tool_ca").content, "a < b <tool_ca");
}

TEST(ToolCallsTest, StreamsCutAnywhereGiveTheSameReply) {
  const std::string text =
      "Sure <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"</tool\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"g\"}</tool_call> done";
  const ParsedReply whole = ParseToolCalls(text);
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.content, "Sure done");
  for (size_t step = 1; step <= 7; ++step) {
    ToolCallStream stream;
    std::string content;
    std::vector<ParsedToolCall> calls;
    for (size_t i = 0; i < text.size(); i += step) {
      ParsedReply part = stream.Feed(text.substr(i, step));
      // Content never shows a piece of a block, nor whitespace that may turn out to border one.
      EXPECT_EQ(part.content.find("<tool_call>"), std::string::npos);
      content += part.content;
      calls.insert(calls.end(), part.calls.begin(), part.calls.end());
    }
    content += stream.Finish().content;
    EXPECT_EQ(content, "Sure done") << step;
    ASSERT_EQ(calls.size(), 2u) << step;
    EXPECT_EQ(calls[0].arguments, whole.calls[0].arguments);
    EXPECT_EQ(calls[1].name, "g");
    EXPECT_EQ(calls[1].arguments, "{}");
  }
}

TEST(ToolCallsTest, LlamaJsonReplies) {
  using model::ToolCallSyntax;
  ParsedReply r = ParseToolCalls(
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n",
      ToolCallSyntax::kLlamaJson);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Oslo\"}");
  r = ParseToolCalls("<|python_tag|>{\"name\": \"now\", \"parameters\": {}}",
                     ToolCallSyntax::kLlamaJson);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "now");
  // Text, JSON that is not a call, and a Hermes block are content in this syntax.
  for (const std::string text : {"It is sunny.", "{\"city\": \"Oslo\"}", "{\"name\": ",
                                 "<tool_call>{\"name\": \"f\"}</tool_call>", "<b>bold</b>"}) {
    r = ParseToolCalls(text, ToolCallSyntax::kLlamaJson);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCallsTest, LlamaJsonStreamsHoldOnlyWhatMayBeACall) {
  using model::ToolCallSyntax;
  const std::string call = "{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
  for (size_t step = 1; step <= 5; ++step) {
    ToolCallStream stream(ToolCallSyntax::kLlamaJson);
    std::vector<ParsedToolCall> calls;
    for (size_t i = 0; i < call.size(); i += step) {
      ParsedReply part = stream.Feed(call.substr(i, step));
      EXPECT_EQ(part.content, "") << step;  // held: it may be (and is) a call
    }
    ParsedReply end = stream.Finish();
    ASSERT_EQ(end.calls.size(), 1u) << step;
    EXPECT_EQ(end.calls[0].arguments, "{\"x\":1}");
  }
  // Plain text goes out as soon as it cannot be a call.
  ToolCallStream stream(ToolCallSyntax::kLlamaJson);
  EXPECT_EQ(stream.Feed(" ").content, "");
  EXPECT_EQ(stream.Feed("<").content, "");
  EXPECT_EQ(stream.Feed("b>Hi").content, " <b>Hi");
  EXPECT_EQ(stream.Feed(" there").content, " there");
  EXPECT_EQ(stream.Finish().content, "");
}

}  // namespace
}  // namespace winnow::server::http
