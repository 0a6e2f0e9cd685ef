// A Hugging Face directory's inputs -> their readers. The first byte picks which:
//   0: safetensors bytes (model/safetensors.cc): every tensor's first and last byte is touched,
//      so a view outside the image shows under ASan;
//   1: config.json text (ModelConfig::FromHfConfig) and, when it reads, the rope factors;
//   2: NUL-separated tokenizer.json text and a text to encode (model/tokenizer/hf_tokenizer.cc):
//      Encode with each flag pair, every id in the vocabulary, pieces and Decode.
// Each must return an error for a bad input, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

void Safetensors(std::string_view bytes) {
  auto file = winnow::model::SafetensorsFile::FromBytes(std::string(bytes), "fuzz");
  if (!file.ok()) return;
  volatile uint8_t sink = 0;
  for (const winnow::model::SafetensorsTensor& t : (*file)->tensors()) {
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    winnow::kernels::GgmlType type;
    (void)t.KernelType(&type);
    (void)t.elements();
  }
}

void Config(std::string_view text) {
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto parsed = winnow::model::ModelConfig::FromHfConfig(config);
  if (parsed.ok()) (void)winnow::model::RopeFrequencyFactors(*parsed);
}

void TokenizerJson(const std::vector<std::string_view>& fields) {
  if (fields.empty()) return;
  auto tok = winnow::model::Tokenizer::FromTokenizerJson(fields[0]);
  if (!tok.ok()) return;
  const std::string_view text = fields.size() > 1 ? fields[1] : std::string_view("a b");
  for (int flags = 0; flags < 4; ++flags) {
    const std::vector<int32_t> ids = (*tok)->Encode(text, flags & 1, flags & 2);
    for (int32_t id : ids) {
      if (id < 0 || id >= (*tok)->vocab_size()) __builtin_trap();  // ids stay in the vocab
    }
    (void)(*tok)->Decode(ids, flags & 1);
  }
  for (int32_t id = 0; id < (*tok)->vocab_size() && id < 4096; ++id) {
    (void)(*tok)->TokenToPiece(id, id % 2 == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      Safetensors(rest);
      break;
    case 1:
      Config(rest);
      break;
    default:
      TokenizerJson(winnow::fuzz::SplitFields(data + 1, size - 1));
  }
  return 0;
}
