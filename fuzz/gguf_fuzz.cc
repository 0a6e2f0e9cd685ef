// GGUF bytes -> the parser (model/gguf.cc), then everything that reads a parsed file's metadata:
// every typed accessor on every key, the tensor table (touching each tensor's first and last
// byte, so an out-of-bounds view shows under ASan), the model config, the tokenizer and the chat
// template. Each must return an error for a bad file, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer/tokenizer.h"
#include "spdlog/spdlog.h"

// The tokenizer warns about odd vocabularies (empty tokens, bad special ids); on fuzzed files that
// is most inputs, and the logging would be most of the time spent.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using winnow::model::GgufFile;
  auto file = GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata()) {
    (void)f.GetString(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetStringArray(key);
    (void)f.GetIntArray(key);
    (void)f.GetFloatArray(key);
  }
  volatile uint8_t sink = 0;
  for (const winnow::model::GgufTensor& t : f.tensors()) {
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    (void)t.AsMatrix();
    if (f.FindTensor(t.name) == nullptr) __builtin_trap();  // the index must find every tensor
  }
  (void)winnow::model::ModelConfig::FromGguf(f);
  auto tokenizer = winnow::model::Tokenizer::FromGguf(f);
  if (tokenizer.ok()) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode("Hello <s> world", true, true);
    (void)(*tokenizer)->Decode(ids, true);
  }
  (void)winnow::model::ChatTemplate::FromGguf(f);
  return 0;
}
