#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "model/gguf.h"
#include "model/template/jinja.h"
#include "nlohmann/json.hpp"

namespace winnow::model {
namespace {

// SmolLM2-135M-Instruct's template as stored in its GGUF (the newlines inside the string
// literals are real newlines there).
// The interpreter is the libpython the binary links, with its own standard library and
// site-packages, whatever python3 comes first in PATH: an activated venv's would otherwise
// lend its site-packages, without the system's jinja2. The test runs under such a PATH.
TEST(JinjaInterpreterTest, IsTheOneTheBinaryLinks) {
  // A venv of nothing first in PATH (ctest runs each test in a process of its own, so the
  // interpreter starts here).
  const std::filesystem::path venv =
      std::filesystem::path(::testing::TempDir()) / "winnow-jinja-venv";
  std::filesystem::create_directories(venv / "bin");
  std::ofstream(venv / "pyvenv.cfg") << "home = /usr/bin\ninclude-system-site-packages = false\n";
  std::ofstream(venv / "bin" / "python3") << "#!/bin/sh\n";
  std::filesystem::permissions(venv / "bin" / "python3", std::filesystem::perms::owner_all);
  const char* path = std::getenv("PATH");
  setenv("PATH", ((venv / "bin").string() + ":" + (path != nullptr ? path : "")).c_str(), 1);
  auto info = jinja::Interpreter();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string home(jinja::PythonHome());
  EXPECT_EQ((*info)["prefix"], home) << info->dump();
  EXPECT_TRUE(absl::StartsWith((*info)["stdlib"].get<std::string>(), home + "/lib/python3"))
      << info->dump();
  EXPECT_TRUE(absl::StartsWith((*info)["jinja2_path"].get<std::string>(), home + "/lib/python3"))
      << info->dump();
}

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

const SpecialTokens kLlamaTokens{"<|begin_of_text|>", "<|eot_id|>", "", ""};

std::string Render(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = true, SpecialTokens special = {}) {
  auto t = ChatTemplate::FromTemplateText(tmpl, std::move(special));
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "";
  auto out = t->Apply(messages, add_generation_prompt);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST(ChatTemplateTest, SmolLm2InsertsDefaultSystemInsideLoop) {
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
  EXPECT_EQ(Render(kLlama3, {{"system", " Be brief.\n"}, {"user", "Hi"}}, true, kLlamaTokens),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama3, {}, true, kLlamaTokens),
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama31AlwaysHasSystemTurnWithDates) {
  EXPECT_EQ(Render(kLlama31, {{"user", " Hi "}}, true, kLlamaTokens),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama31, {{"system", "S "}, {"user", "U"}}, false, kLlamaTokens),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>");
}

// What transformers adds to jinja2: tojson keeping non-ASCII, raise_exception, strftime_now,
// namespace, loop controls and the {% generation %} tag.
TEST(ChatTemplateTest, TransformersEnvironment) {
  EXPECT_EQ(Render("{{ {'a': '\u00e9<>', 'b': [1, 2.5, none, true]} | tojson }}", {}),
            "{\"a\": \"\u00e9<>\", \"b\": [1, 2.5, null, true]}");
  EXPECT_EQ(Render("{{ messages[0] | tojson(indent=2) }}", {{"user", "x"}}),
            "{\n  \"role\": \"user\",\n  \"content\": \"x\"\n}");
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}"
                   "{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                   {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}),
            "2");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}", {}), "kept");
  EXPECT_EQ(Render("{{ strftime_now('%Y') | length }}", {}), "4");
}

TEST(ChatTemplateTest, TemplateErrorsAreInvalidArgumentWithTheirMessage) {
  auto alternate = ChatTemplate::FromTemplateText(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must "
      "alternate user/assistant') }}{% endif %}ok");
  ASSERT_TRUE(alternate.ok()) << alternate.status();
  EXPECT_EQ(*alternate->Apply({{"user", "x"}}, true), "ok");
  const absl::Status refused = alternate->Apply({{"assistant", "x"}}, true).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "chat template: Conversation roles must alternate user/assistant");

  const absl::Status syntax = ChatTemplate::FromTemplateText("{% for m in messages %}").status();
  EXPECT_EQ(syntax.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(syntax.message().find("syntax error at line 1"), absl::string_view::npos) << syntax;

  auto type_error = ChatTemplate::FromTemplateText("{{ messages[0].content + 1 }}");
  ASSERT_TRUE(type_error.ok());
  EXPECT_NE(type_error->Apply({{"user", "x"}}, true).status().message().find("TypeError"),
            absl::string_view::npos);
}

// The sandbox transformers renders in: no attribute route to Python's internals, no mutation of
// the inputs.
TEST(ChatTemplateTest, TemplatesRunSandboxed) {
  for (const char* escape : {"{{ ''.__class__.__mro__[1].__subclasses__() }}",
                             "{{ messages.append(1) }}", "{% set ns = namespace(_x=1) %}"}) {
    auto t = ChatTemplate::FromTemplateText(escape);
    ASSERT_TRUE(t.ok()) << escape << ": " << t.status();
    const absl::Status s = t->Apply({{"user", "x"}}, true).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << escape;
    EXPECT_NE(s.message().find("SecurityError"), absl::string_view::npos) << escape << ": " << s;
  }
}

TEST(ChatTemplateTest, RolesPassToTheTemplate) {
  // Any role reaches the template; "developer" is "system" only for templates without it.
  EXPECT_EQ(Render(kSmolLm2, {{"robot", "x"}}, false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>robot\nx<|im_end|>\n");
  EXPECT_EQ(Render(kSmolLm2, {{"developer", "d"}}, false), "<|im_start|>system\nd<|im_end|>\n");
  EXPECT_EQ(Render("{% for m in messages %}{{ m.role }}{% endfor %}{# developer #}",
                   {{"developer", "d"}}),
            "developer");
}

TEST(ChatTemplateTest, ToolsRenderForChatMlAndAreRefusedByLlama3) {
  auto chatml = ChatTemplate::FromTemplateText(kSmolLm2);
  ASSERT_TRUE(chatml.ok());
  EXPECT_FALSE(chatml->renders_tools());
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"c1", "f", R"({"x":1})"});
  ChatMessage result{"tool", "42"};
  result.tool_call_id = "c1";
  auto out = chatml->Apply({{"user", "Hi"}, call, result}, true,
                           {R"({"type":"function","function":{"name":"f"}})"});
  ASSERT_TRUE(out.ok()) << out.status();
  // The tools turn carries the model's default system text (SmolLM2's), as Qwen2.5's does its.
  EXPECT_TRUE(absl::StartsWith(*out, "<|im_start|>system\nYou are a helpful AI assistant named "
                                     "SmolLM, trained by Hugging Face\n\n# Tools\n\n"))
      << *out;
  EXPECT_NE(out->find("<tools>\n{\"type\": \"function\", \"function\": "
                      "{\"name\": \"f\"}}\n</tools>"),
            std::string::npos) << *out;
  EXPECT_NE(out->find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                      "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n"
                      "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                      "<|im_start|>assistant\n"),
            std::string::npos) << *out;
  call.tool_calls[0].arguments = "{oops";
  EXPECT_EQ(chatml->Apply({call}, true).status().message(),
            "[0].tool_calls[0].arguments: not valid JSON");
  auto llama = ChatTemplate::FromTemplateText(kLlama3);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->Apply({{"user", "Hi"}}, true, {R"({"type":"function"})"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ToolCallSyntaxFollowsTheTemplate) {
  auto smollm = ChatTemplate::FromTemplateText(kSmolLm2);  // winnow's ChatML tool template
  ASSERT_TRUE(smollm.ok());
  EXPECT_EQ(smollm->tool_call_syntax(), ToolCallSyntax::kHermes);
  // Llama 3.1's tool section, reduced to what marks it: past calls as {"name", "parameters"}.
  auto llama = ChatTemplate::FromTemplateText(
      "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{% if m.tool_calls %}{{ '{\"name\": \"' + m.tool_calls[0].function.name + '\", ' }}"
      "{{ '\"parameters\": ' + m.tool_calls[0].function.arguments | tojson + '}' }}"
      "{% else %}{{ m.content }}{% endif %}<|eot_id|>{% endfor %}");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->tool_call_syntax(), ToolCallSyntax::kLlamaJson);
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"c1", "f", R"({"x":1})"});
  EXPECT_EQ(*llama->Apply({call}, false),
            "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"f\", \"parameters\": "
            "{\"x\": 1}}<|eot_id|>");
}

TEST(ChatTemplateTest, FromRealModel) {
  const char* env = std::getenv("WINNOW_TEST_MODEL");
  const std::string path = env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "set WINNOW_TEST_MODEL";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = t->Apply({{"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace winnow::model
