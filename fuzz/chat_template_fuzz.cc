// Chat-template recognition and rendering (model/chat_template.cc) on arbitrary template text and
// conversations. The input is NUL-separated fields: the template's Jinja text, a flags byte
// (bit 0: add_generation_prompt), then role, content, role, content, ... The rendered prompt is
// then tokenized as the server does (EncodeRenderedChat, special tokens parsed) with the
// in-memory SentencePiece vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/chat_template.h"

namespace {
winnow::fuzz::SpmVocab* spm = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spm = new winnow::fuzz::SpmVocab(winnow::fuzz::MakeSpmVocab());
  if (spm->tokenizer == nullptr) {
    std::fprintf(stderr, "chat_template_fuzz: the SentencePiece vocabulary did not load\n");
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using winnow::model::ChatTemplate;
  const std::vector<std::string_view> fields = winnow::fuzz::SplitFields(data, size);
  auto tmpl = ChatTemplate::FromTemplateText(std::string(fields[0]));
  if (!tmpl.ok()) return 0;
  const bool add_generation_prompt = fields.size() > 1 && !fields[1].empty() && (fields[1][0] & 1);
  std::vector<winnow::model::ChatMessage> messages;
  for (size_t i = 2; i + 1 < fields.size(); i += 2) {
    messages.push_back({std::string(fields[i]), std::string(fields[i + 1])});
  }
  auto rendered = tmpl->Apply(messages, add_generation_prompt);
  if (!rendered.ok()) return 0;
  (void)winnow::model::EncodeRenderedChat(*spm->tokenizer, *rendered, /*add_special=*/true);
  return 0;
}
