#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.h"

namespace winnow::model {
namespace {

// SmolLM2-135M-Instruct's template as stored in its GGUF (the newlines inside the string
// literals are real newlines there).
constexpr char kSmolLm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// The non-tool part of Qwen2.5's template: the default system turn sits before the loop and the
// newlines are Jinja escapes.
constexpr char kQwen25[] =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\") %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' "
    "}}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

constexpr char kLlama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

constexpr char kLlama31[] =
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n";

std::string Render(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = true) {
  auto t = ChatTemplate::FromTemplateText(tmpl);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "";
  auto out = t->Apply(messages, add_generation_prompt);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST(ChatTemplateTest, SmolLm2InsertsDefaultSystemInsideLoop) {
  auto t = ChatTemplate::FromTemplateText(kSmolLm2);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(Render(kSmolLm2, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(kSmolLm2, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", " ok "}},
                   false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n ok <|im_end|>\n");
  // No messages: the loop never runs, so no default system turn either.
  EXPECT_EQ(Render(kSmolLm2, {}), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen25DefaultSystemBeforeLoop) {
  EXPECT_EQ(Render(kQwen25, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(kQwen25, {{"system", "S"}, {"user", "U"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplateTest, PlainChatMlHasNoDefaultSystem) {
  const std::string tmpl =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_EQ(Render(tmpl, {{"user", "Hi"}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3TrimsAndPrependsBos) {
  auto t = ChatTemplate::FromTemplateText(kLlama3);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(Render(kLlama3, {{"system", " Be brief.\n"}, {"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama3, {}), "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama31AlwaysHasSystemTurnWithDates) {
  EXPECT_EQ(Render(kLlama31, {{"user", " Hi "}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama31, {{"system", "S "}, {"user", "U"}}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>");
}

// Found with fuzz/chat_template_fuzz.cc: the template scans were std::regex searches, whose
// recursion per matched character overflowed the stack on a 100 KB system turn or date string.
TEST(ChatTemplateTest, HugeTemplatesDoNotOverflowTheStack) {
  const std::string big(1 << 20, 'a');
  auto chatml = ChatTemplate::FromTemplateText("{{ '<|im_start|>system\\n" + big +
                                               "<|im_end|>\\n' }}{%- for  message in\n"
                                               "messages %}{% endfor %}");
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  auto out = chatml->Apply({}, /*add_generation_prompt=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<|im_start|>system\n" + big + "<|im_end|>\n");  // before the loop: emitted

  auto llama31 = ChatTemplate::FromTemplateText(
      "<|start_header_id|>Cutting Knowledge Date {% set date_string = '" + big + "' %}");
  ASSERT_TRUE(llama31.ok()) << llama31.status();
  auto dated = llama31->Apply({{"user", "hi"}}, false);
  ASSERT_TRUE(dated.ok()) << dated.status();
  EXPECT_NE(dated->find("Today Date: " + big + "\n"), std::string::npos);
}

TEST(ChatTemplateTest, RejectsUnknownTemplatesAndRoles) {
  auto t =
      ChatTemplate::FromTemplateText("{% for m in messages %}[INST] {{ m.content }}{% endfor %}");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("raw prompt"), absl::string_view::npos);
  auto chatml = ChatTemplate::FromTemplateText(kSmolLm2);
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->Apply({{"robot", "x"}}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ToolsRenderForChatMlAndAreRefusedByLlama3) {
  auto chatml = ChatTemplate::FromTemplateText(kSmolLm2);
  ASSERT_TRUE(chatml.ok());
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"c1", "f", R"({"x":1})"});
  ChatMessage result{"tool", "42"};
  result.tool_call_id = "c1";
  auto out = chatml->Apply({{"user", "Hi"}, call, result}, true,
                           {R"({"type":"function","function":{"name":"f"}})"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n</tools>"),
            std::string::npos) << *out;
  EXPECT_NE(out->find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                      "{\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
                      "</tool_response><|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos) << *out;
  call.tool_calls[0].arguments = "{oops";
  EXPECT_EQ(chatml->Apply({call}, true).status().message(),
            "[0].tool_calls[0].arguments: not valid JSON");
  auto llama = ChatTemplate::FromTemplateText(kLlama3);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->Apply({{"user", "Hi"}}, true, {R"({"type":"function"})"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, FromRealModel) {
  const char* env = std::getenv("WINNOW_TEST_MODEL");
  const std::string path = env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "set WINNOW_TEST_MODEL";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplateKind::kChatMl);
  auto out = t->Apply({{"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace winnow::model
