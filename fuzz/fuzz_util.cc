#include "fuzz/fuzz_util.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace winnow::fuzz {

std::vector<std::string_view> SplitFields(const uint8_t* data, size_t size) {
  std::vector<std::string_view> fields;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t start = 0;
  for (size_t nul = all.find('\0'); nul != std::string_view::npos; nul = all.find('\0', start)) {
    fields.push_back(all.substr(start, nul - start));
    start = nul + 1;
  }
  fields.push_back(all.substr(start));
  return fields;
}

std::string ModelPath() {
  for (const char* var : {"WINNOW_FUZZ_MODEL", "WINNOW_TEST_MODEL"}) {
    const char* path = std::getenv(var);
    if (path != nullptr && std::filesystem::is_regular_file(path)) return path;
  }
  return {};
}

GgufImage& GgufImage::Str(const std::string& key, const std::string& value) {
  Key(key, 8);
  PutStr(value);
  return *this;
}

GgufImage& GgufImage::U32(const std::string& key, uint32_t value) {
  Key(key, 4);
  body_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  return *this;
}

GgufImage& GgufImage::Bool(const std::string& key, bool value) {
  Key(key, 7);
  body_.push_back(value ? 1 : 0);
  return *this;
}

GgufImage& GgufImage::StrArray(const std::string& key, const std::vector<std::string>& values) {
  Key(key, 9);
  const uint32_t type = 8;
  const uint64_t n = values.size();
  body_.append(reinterpret_cast<const char*>(&type), sizeof(type));
  body_.append(reinterpret_cast<const char*>(&n), sizeof(n));
  for (const std::string& v : values) PutStr(v);
  return *this;
}

GgufImage& GgufImage::F32Array(const std::string& key, const std::vector<float>& values) {
  Key(key, 9);
  const uint32_t type = 6;
  const uint64_t n = values.size();
  body_.append(reinterpret_cast<const char*>(&type), sizeof(type));
  body_.append(reinterpret_cast<const char*>(&n), sizeof(n));
  body_.append(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
  return *this;
}

GgufImage& GgufImage::I32Array(const std::string& key, const std::vector<int32_t>& values) {
  Key(key, 9);
  const uint32_t type = 5;
  const uint64_t n = values.size();
  body_.append(reinterpret_cast<const char*>(&type), sizeof(type));
  body_.append(reinterpret_cast<const char*>(&n), sizeof(n));
  body_.append(reinterpret_cast<const char*>(values.data()), n * sizeof(int32_t));
  return *this;
}

std::string GgufImage::Bytes() const {
  std::string out = "GGUF";
  const uint32_t version = 3;
  const uint64_t tensors = 0;
  out.append(reinterpret_cast<const char*>(&version), sizeof(version));
  out.append(reinterpret_cast<const char*>(&tensors), sizeof(tensors));
  out.append(reinterpret_cast<const char*>(&count_), sizeof(count_));
  return out + body_;
}

void GgufImage::Key(const std::string& key, uint32_t type) {
  PutStr(key);
  body_.append(reinterpret_cast<const char*>(&type), sizeof(type));
  ++count_;
}

void GgufImage::PutStr(const std::string& s) {
  const uint64_t n = s.size();
  body_.append(reinterpret_cast<const char*>(&n), sizeof(n));
  body_ += s;
}

SpmVocab MakeSpmVocab() {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;  // llama.cpp: 1 normal, 2 unknown, 3 control, 4 user, 6 byte
  auto add = [&](const std::string& text, float score, int32_t type) {
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(type);
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name, 0, 6);
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  add(sp, -1000, 1);
  for (char c = 'a'; c <= 'z'; ++c) add(std::string(1, c), -1000, 1);
  // Merged pieces with distinct scores, so merge order matters; one multi-byte piece.
  float score = -1;
  for (const char* piece : {"ll", "he", "hell", "hello", "or", "wor", "ld", "world", "in", "ing",
                            "th", "the", "\xC3\xA9t\xC3\xA9"}) {
    add(piece, score--, 1);
  }
  add(sp + "hello", score--, 1);
  add(sp + "the", score--, 1);
  add("<|user|>", 0, 4);
  add("<|end|>", 0, 3);
  const std::string image = GgufImage()
                                .Str("general.architecture", "llama")
                                .Str("tokenizer.ggml.model", "llama")
                                .StrArray("tokenizer.ggml.tokens", tokens)
                                .F32Array("tokenizer.ggml.scores", scores)
                                .I32Array("tokenizer.ggml.token_type", types)
                                .U32("tokenizer.ggml.unknown_token_id", 0)
                                .U32("tokenizer.ggml.bos_token_id", 1)
                                .U32("tokenizer.ggml.eos_token_id", 2)
                                .Bool("tokenizer.ggml.add_bos_token", true)
                                .Bytes();
  SpmVocab vocab;
  auto file = model::GgufFile::FromBytes(image, "spm-vocab");
  if (!file.ok()) return vocab;
  vocab.file = std::move(*file);
  auto tokenizer = model::Tokenizer::FromGguf(*vocab.file);
  if (tokenizer.ok()) vocab.tokenizer = std::move(*tokenizer);
  return vocab;
}

}  // namespace winnow::fuzz
