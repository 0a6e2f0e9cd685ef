#include "bench/synthetic_gguf.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace winnow::bench {
namespace {

constexpr uint32_t kTypeU32 = 4, kTypeI32 = 5, kTypeF32 = 6, kTypeString = 8, kTypeArray = 9;
constexpr uint32_t kGgmlF32 = 0, kGgmlQ4_0 = 2;
constexpr int64_t kQ4Block = 32, kQ4BlockBytes = 18;  // fp16 scale + 16 bytes of nibbles
constexpr uint64_t kAlignment = 32;

class Buffer {
 public:
  template <typename T>
  void Put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_ += s;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

struct Tensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length
  uint32_t type;
  uint64_t offset = 0;

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  uint64_t bytes() const {
    return type == kGgmlF32 ? elements() * 4 : elements() / kQ4Block * kQ4BlockBytes;
  }
};

class Metadata {
 public:
  void U32(const std::string& key, uint32_t v) { Key(key, kTypeU32).Put(v); }
  void F32(const std::string& key, float v) { Key(key, kTypeF32).Put(v); }
  void Str(const std::string& key, const std::string& v) { Key(key, kTypeString).Str(v); }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    Array(key, kTypeString, v.size());
    for (const std::string& s : v) body_.Str(s);
  }
  void F32Array(const std::string& key, const std::vector<float>& v) {
    Array(key, kTypeF32, v.size());
    for (float f : v) body_.Put(f);
  }
  void I32Array(const std::string& key, const std::vector<int32_t>& v) {
    Array(key, kTypeI32, v.size());
    for (int32_t i : v) body_.Put(i);
  }
  uint64_t count() const { return count_; }
  const std::string& bytes() const { return body_.bytes(); }

 private:
  Buffer& Key(const std::string& key, uint32_t type) {
    ++count_;
    body_.Str(key);
    body_.Put(type);
    return body_;
  }
  void Array(const std::string& key, uint32_t type, uint64_t n) {
    Key(key, kTypeArray).Put(type);
    body_.Put(n);
  }
  Buffer body_;
  uint64_t count_ = 0;
};

// SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, then filler pieces up to `vocab`.
void AddVocabulary(int32_t vocab, Metadata& md) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
  }
  while (static_cast<int32_t>(tokens.size()) < vocab) {
    tokens.push_back(absl::StrCat("\xE2\x96\x81w", tokens.size()));
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  md.Str("tokenizer.ggml.model", "llama");
  md.StrArray("tokenizer.ggml.tokens", tokens);
  md.F32Array("tokenizer.ggml.scores", scores);
  md.I32Array("tokenizer.ggml.token_type", types);
  md.U32("tokenizer.ggml.unknown_token_id", 0);
  md.U32("tokenizer.ggml.bos_token_id", 1);
  md.U32("tokenizer.ggml.eos_token_id", 2);
}

std::vector<Tensor> TensorsOf(const SyntheticShape& s) {
  const int64_t q = int64_t{s.heads} * s.head_dim, kv = int64_t{s.kv_heads} * s.head_dim;
  std::vector<Tensor> t = {{"token_embd.weight", {s.hidden, s.vocab}, kGgmlQ4_0},
                           {"output_norm.weight", {s.hidden}, kGgmlF32}};
  if (!s.tied_embeddings) t.push_back({"output.weight", {s.hidden, s.vocab}, kGgmlQ4_0});
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    t.push_back({p + "attn_norm.weight", {s.hidden}, kGgmlF32});
    t.push_back({p + "attn_q.weight", {s.hidden, q}, kGgmlQ4_0});
    t.push_back({p + "attn_k.weight", {s.hidden, kv}, kGgmlQ4_0});
    t.push_back({p + "attn_v.weight", {s.hidden, kv}, kGgmlQ4_0});
    t.push_back({p + "attn_output.weight", {q, s.hidden}, kGgmlQ4_0});
    t.push_back({p + "ffn_norm.weight", {s.hidden}, kGgmlF32});
    t.push_back({p + "ffn_gate.weight", {s.hidden, s.ffn}, kGgmlQ4_0});
    t.push_back({p + "ffn_up.weight", {s.hidden, s.ffn}, kGgmlQ4_0});
    t.push_back({p + "ffn_down.weight", {s.ffn, s.hidden}, kGgmlQ4_0});
  }
  return t;
}

uint16_t HalfBits(float f) {  // f is a normal value well inside fp16's range
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(((bits >> 16) & 0x8000) | (exponent << 10) |
                               ((bits >> 13) & 0x3ff));
}

// Random Q4_0 blocks whose values (nibble - 8) * d have standard deviation 1 / sqrt(row_len):
// uniform nibbles have standard deviation sqrt(255 / 12) ~ 4.61.
void WriteQ4(const Tensor& t, uint64_t& state, std::ofstream& out) {
  const uint16_t d = HalfBits(static_cast<float>(1.0 / (4.61 * std::sqrt(double(t.dims[0])))));
  std::vector<char> chunk(kQ4BlockBytes * 4096);
  for (int64_t left = t.elements() / kQ4Block; left > 0;) {
    const int64_t n = std::min<int64_t>(left, 4096);
    for (int64_t b = 0; b < n; ++b) {
      char* block = chunk.data() + b * kQ4BlockBytes;
      std::memcpy(block, &d, 2);
      for (int i = 0; i < 2; ++i) {  // xorshift64: 16 random bytes
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        std::memcpy(block + 2 + 8 * i, &state, 8);
      }
    }
    out.write(chunk.data(), n * kQ4BlockBytes);
    left -= n;
  }
}

}  // namespace

absl::Status ShapeByName(const std::string& name, SyntheticShape* shape) {
  if (name == "llama3-8b") {
    *shape = {name, 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, false};
  } else if (name == "smollm2-135m") {
    *shape = {name, 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, true};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape '", name, "': known shapes are llama3-8b and smollm2-135m"));
  }
  return absl::OkStatus();
}

absl::Status WriteSyntheticGguf(const SyntheticShape& s, const std::string& path, uint64_t seed) {
  Metadata md;
  md.Str("general.architecture", "llama");
  md.Str("general.name", absl::StrCat("synthetic ", s.name));
  md.U32("general.alignment", kAlignment);
  md.U32("llama.block_count", s.layers);
  md.U32("llama.context_length", s.context);
  md.U32("llama.embedding_length", s.hidden);
  md.U32("llama.feed_forward_length", s.ffn);
  md.U32("llama.attention.head_count", s.heads);
  md.U32("llama.attention.head_count_kv", s.kv_heads);
  md.U32("llama.rope.dimension_count", s.head_dim);
  md.F32("llama.rope.freq_base", s.rope_theta);
  md.F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  AddVocabulary(s.vocab, md);

  std::vector<Tensor> tensors = TensorsOf(s);
  Buffer header;
  header.Put<uint32_t>(0x46554747);  // "GGUF"
  header.Put<uint32_t>(3);
  header.Put<uint64_t>(tensors.size());
  header.Put<uint64_t>(md.count());
  uint64_t offset = 0;
  Buffer infos;
  for (Tensor& t : tensors) {
    t.offset = offset;
    offset += (t.bytes() + kAlignment - 1) / kAlignment * kAlignment;
    infos.Str(t.name);
    infos.Put<uint32_t>(t.dims.size());
    for (int64_t d : t.dims) infos.Put<uint64_t>(d);
    infos.Put<uint32_t>(t.type);
    infos.Put<uint64_t>(t.offset);
  }
  std::string head = header.bytes() + md.bytes() + infos.bytes();
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
  out.write(head.data(), head.size());
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  const std::vector<float> ones(s.hidden, 1.0f);
  for (const Tensor& t : tensors) {
    if (t.type == kGgmlF32) {
      out.write(reinterpret_cast<const char*>(ones.data()), t.bytes());
    } else {
      WriteQ4(t, state, out);
    }
    const uint64_t pad = (kAlignment - t.bytes() % kAlignment) % kAlignment;
    out.write(std::string(pad, '\0').data(), pad);
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> EnsureSyntheticGguf(const SyntheticShape& shape,
                                                const std::string& path) {
  const std::string file = path.empty() ? "/tmp/winnow-synthetic-" + shape.name + ".gguf" : path;
  if (std::filesystem::exists(file)) return file;
  const auto t0 = std::chrono::steady_clock::now();
  WINNOW_RETURN_IF_ERROR(WriteSyntheticGguf(shape, file));
  std::printf("wrote %s in %.1f s\n", file.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return file;
}

}  // namespace winnow::bench
