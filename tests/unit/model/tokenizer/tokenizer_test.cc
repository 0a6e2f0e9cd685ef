#include "model/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace winnow::model {
namespace {

// --- a vocab-only GGUF written by hand -------------------------------------------------------

class GgufWriter {
 public:
  void Str(const std::string& key, const std::string& v) {
    Key(key, 8);
    PutStr(v);
    ++n_kv_;
  }
  void U32(const std::string& key, uint32_t v) {
    Key(key, 4);
    Put(v);
    ++n_kv_;
  }
  void Bool(const std::string& key, bool v) {
    Key(key, 7);
    Put<uint8_t>(v ? 1 : 0);
    ++n_kv_;
  }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, 9);
    Put<uint32_t>(8);
    Put<uint64_t>(v.size());
    for (const auto& s : v) PutStr(s);
    ++n_kv_;
  }
  void F32Array(const std::string& key, const std::vector<float>& v) {
    Key(key, 9);
    Put<uint32_t>(6);
    Put<uint64_t>(v.size());
    for (float f : v) Put(f);
    ++n_kv_;
  }
  void I32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, 9);
    Put<uint32_t>(5);
    Put<uint64_t>(v.size());
    for (int32_t i : v) Put(i);
    ++n_kv_;
  }
  std::string Write(const std::string& name) const {
    std::string header = "GGUF";
    auto put = [&](auto v) { header.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    put(uint32_t{3});
    put(uint64_t{0});  // tensors
    put(n_kv_);
    std::string file = header + body_;
    file.resize((file.size() + 31) / 32 * 32, '\0');
    const std::string path = (std::filesystem::path(testing::TempDir()) / name).string();
    std::ofstream(path, std::ios::binary) << file;
    return path;
  }

 private:
  template <typename T>
  void Put(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutStr(const std::string& s) {
    Put<uint64_t>(s.size());
    body_ += s;
  }
  void Key(const std::string& key, uint32_t type) {
    PutStr(key);
    Put(type);
  }
  std::string body_;
  uint64_t n_kv_ = 0;
};

constexpr char kSp[] = "\xE2\x96\x81";  // U+2581

struct TinySpm {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int32_t Add(const std::string& text, float score, int32_t type = 1) {
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size()) - 1;
  }
};

// <unk>, <s>, </s>, optionally the 256 byte tokens, then pieces whose scores make
// "hello world" merge into "▁hello" and "▁world".
TinySpm MakeTinySpm(bool with_bytes) {
  TinySpm v;
  v.Add("<unk>", 0, 2);
  v.Add("<s>", 0, 3);
  v.Add("</s>", 0, 3);
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      v.Add(name, 0, 6);
    }
  }
  v.Add(kSp, -1000);
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d"}) v.Add(c, -1000);
  v.Add("ll", -1);
  v.Add("he", -2);
  v.Add("hell", -3);
  v.Add("hello", -4);
  v.Add(std::string(kSp) + "hello", -5);
  v.Add("or", -6);
  v.Add("wor", -7);
  v.Add("ld", -8);
  v.Add("world", -9);
  v.Add(std::string(kSp) + "world", -10);
  v.Add("<|user|>", 0, 4);
  return v;
}

std::string WriteSpmGguf(const TinySpm& v, const std::string& name,
                         std::optional<bool> add_space_prefix = std::nullopt) {
  GgufWriter w;
  w.Str("general.architecture", "llama");
  w.Str("tokenizer.ggml.model", "llama");
  w.StrArray("tokenizer.ggml.tokens", v.tokens);
  w.F32Array("tokenizer.ggml.scores", v.scores);
  w.I32Array("tokenizer.ggml.token_type", v.types);
  w.U32("tokenizer.ggml.unknown_token_id", 0);
  w.U32("tokenizer.ggml.bos_token_id", 1);
  w.U32("tokenizer.ggml.eos_token_id", 2);
  if (add_space_prefix) w.Bool("tokenizer.ggml.add_space_prefix", *add_space_prefix);
  return w.Write(name);
}

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

Loaded Load(const std::string& path) {
  Loaded l;
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return l;
  l.file = std::move(*file);
  auto tok = Tokenizer::FromGguf(*l.file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (tok.ok()) l.tok = std::move(*tok);
  return l;
}

int32_t Id(const Tokenizer& t, const std::string& text) {
  for (int32_t i = 0; i < t.vocab_size(); ++i) {
    if (t.TokenText(i) == text) return i;
  }
  return -1;
}

// --- SentencePiece ----------------------------------------------------------------------------

TEST(SpmTokenizerTest, MergesByScoreWithSpacePrefixAndBos) {
  Loaded l = Load(WriteSpmGguf(MakeTinySpm(true), "spm_bytes.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.bos_id(), 1);
  const int32_t hello = Id(t, std::string(kSp) + "hello");
  const int32_t world = Id(t, std::string(kSp) + "world");
  EXPECT_EQ(t.Encode("hello world", true, true), (std::vector<int32_t>{1, hello, world}));
  EXPECT_EQ(t.Encode("hello world", false, true), (std::vector<int32_t>{hello, world}));
  EXPECT_EQ(t.Decode(t.Encode("hello world", true, true), false), " hello world");
  EXPECT_EQ(t.Decode(t.Encode("hello world", true, true), true), "<s> hello world");
  EXPECT_TRUE(t.Encode("", false, true).empty());
  EXPECT_EQ(t.Encode("", true, true), (std::vector<int32_t>{1}));
}

TEST(SpmTokenizerTest, ByteFallbackAndUnknown) {
  Loaded with = Load(WriteSpmGguf(MakeTinySpm(true), "spm_bytes2.gguf"));
  ASSERT_NE(with.tok, nullptr);
  const Tokenizer& t = *with.tok;
  // "hé" -> "▁", "h", then é as its two UTF-8 bytes.
  EXPECT_EQ(t.Encode("h\xC3\xA9", false, true),
            (std::vector<int32_t>{Id(t, kSp), Id(t, "h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.TokenToPiece(3 + 0xC3, false), "\xC3");
  EXPECT_EQ(t.Decode(t.Encode("h\xC3\xA9", false, true), false), " h\xC3\xA9");

  Loaded without = Load(WriteSpmGguf(MakeTinySpm(false), "spm_nobytes.gguf"));
  ASSERT_NE(without.tok, nullptr);
  const Tokenizer& u = *without.tok;
  EXPECT_EQ(u.Encode("h\xC3\xA9", false, true),
            (std::vector<int32_t>{Id(u, kSp), Id(u, "h"), 0, 0}));
  EXPECT_EQ(u.TokenToPiece(0, false), "");  // unknown renders only as special
  EXPECT_EQ(u.TokenToPiece(0, true), "<unk>");
}

TEST(SpmTokenizerTest, SpecialTokensAndPrefixAfterThem) {
  Loaded l = Load(WriteSpmGguf(MakeTinySpm(true), "spm_special.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  const int32_t hello = Id(t, std::string(kSp) + "hello");
  // Text after a special token gets the space prefix again, as in llama.cpp.
  EXPECT_EQ(t.Encode("<s>hello", true, true), (std::vector<int32_t>{1, 1, hello}));
  // Without parse_special the control token is text; user-defined tokens still split.
  EXPECT_EQ(t.Encode("<s>hello", false, false),
            (std::vector<int32_t>{Id(t, kSp), 3 + '<', 3 + 's', 3 + '>', Id(t, "hello")}));
  const int32_t user = Id(t, "<|user|>");
  EXPECT_EQ(t.Encode("<|user|>hello", false, false), (std::vector<int32_t>{user, hello}));
  EXPECT_EQ(t.FindSpecial("<|user|>"), user);
  EXPECT_EQ(t.FindSpecial("</s>"), 2);
  EXPECT_EQ(t.FindSpecial("hello"), -1);
  EXPECT_TRUE(t.IsEndOfGeneration(2));
  EXPECT_FALSE(t.IsEndOfGeneration(1));
  EXPECT_EQ(t.TokenToPiece(user, false), "<|user|>");  // user-defined always renders
}

TEST(SpmTokenizerTest, AddSpacePrefixFromMetadata) {
  Loaded l = Load(WriteSpmGguf(MakeTinySpm(true), "spm_noprefix.gguf", false));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.Encode("hello world", false, true),
            (std::vector<int32_t>{Id(t, "hello"), Id(t, std::string(kSp) + "world")}));
}

TEST(StreamingDetokenizerTest, HoldsBackSplitCharacters) {
  Loaded l = Load(WriteSpmGguf(MakeTinySpm(true), "spm_stream.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  StreamingDetokenizer d(t);
  // U+1F600 as four byte tokens, then U+4E2D as three.
  const std::string emoji = "\xF0\x9F\x98\x80", han = "\xE4\xB8\xAD";
  std::vector<std::string> out;
  for (unsigned char c : emoji + han) out.push_back(d.Append(3 + c));
  EXPECT_EQ(out, (std::vector<std::string>{"", "", "", emoji, "", "", han}));
  EXPECT_EQ(d.Flush(), "");
  // A character cut off at the end becomes U+FFFD on flush; invalid bytes never block.
  EXPECT_EQ(d.Append(3 + 0xE4), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Append(3 + 0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Append(Id(t, std::string(kSp) + "hello")), " hello");
  EXPECT_EQ(d.Append(1), "");  // control tokens are not rendered by default
}

// --- UTF-8 helpers ----------------------------------------------------------------------------

TEST(UnicodeTest, TakeCompleteUtf8) {
  std::string pending = "ab\xE4\xB8";
  EXPECT_EQ(TakeCompleteUtf8(&pending), "ab");
  EXPECT_EQ(pending, "\xE4\xB8");
  pending += "\xAD!";
  EXPECT_EQ(TakeCompleteUtf8(&pending), "\xE4\xB8\xAD!");
  EXPECT_TRUE(pending.empty());
  pending = "\xE4x";  // broken sequence: replaced, not held
  EXPECT_EQ(TakeCompleteUtf8(&pending), "\xEF\xBF\xBDx");
  pending = "\xED\xA0\x80";  // surrogate: invalid in strict UTF-8
  EXPECT_EQ(TakeCompleteUtf8(&pending), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(UnicodeTest, ValidationAndByteMap) {
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));
  EXPECT_EQ(ReplaceInvalidUtf8("a\xFF" "b\xE4\xB8"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(ByteToBpeCodepoint(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(ByteToBpeCodepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToBpeCodepoint('A'), static_cast<uint32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(BpeCodepointToByte(ByteToBpeCodepoint(b)), b);
  EXPECT_EQ(DecodeUtf8Lenient("\xFF" "a"), (std::vector<uint32_t>{0xFFFD, 'a'}));
}

// --- pre-tokenizer ----------------------------------------------------------------------------

std::vector<std::string> Pieces(const PreTokenizer& p, const std::string& text) {
  std::vector<std::string> out;
  size_t offset = 0;
  for (size_t len : p.Split(text)) {
    out.push_back(text.substr(offset, len));
    offset += len;
  }
  return out;
}

TEST(PreTokenizerTest, RegexListsFollowLlamaCpp) {
  auto smollm = PreTokenizer::ForName("smollm");
  ASSERT_TRUE(smollm.ok());
  EXPECT_EQ((*smollm)->kind(), "starcoder");
  EXPECT_EQ(Pieces(**smollm, "Hello  world's 123"),
            (std::vector<std::string>{"Hello", " ", " world", "'s", " ", "1", "2", "3"}));
  auto llama3 = PreTokenizer::ForName("llama-bpe");
  ASSERT_TRUE(llama3.ok());
  EXPECT_TRUE((*llama3)->ignore_merges());
  EXPECT_EQ(Pieces(**llama3, "I'M 1234567\n\n  x"),
            (std::vector<std::string>{"I", "'M", " ", "123", "456", "7", "\n\n", " ", " x"}));
  auto qwen2 = PreTokenizer::ForName("qwen2");
  ASSERT_TRUE(qwen2.ok());
  EXPECT_EQ(Pieces(**qwen2, "ab12"), (std::vector<std::string>{"ab", "1", "2"}));
  // llama.cpp's \s includes U+0085 (PCRE2's does not by default).
  auto gpt2 = PreTokenizer::ForName("gpt-2");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(Pieces(**gpt2, "a\xC2\x85\xC2\x85z"),
            (std::vector<std::string>{"a", "\xC2\x85", "\xC2\x85", "z"}));
  for (const char* name : {"default", "falcon", "deepseek-llm", "deepseek-coder", "deepseek-v3",
                           "starcoder", "command-r", "dbrx"}) {
    auto p = PreTokenizer::ForName(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_FALSE(Pieces(**p, "Hello, world! 12345 \xE4\xB8\xAD\xE6\x96\x87\n").empty()) << name;
  }
  auto unknown = PreTokenizer::ForName("no-such-pre");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ((*unknown)->kind(), "gpt2");
}

// --- byte-level BPE on the real model ---------------------------------------------------------

class BpeModelTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* env = std::getenv("WINNOW_TEST_MODEL");
    const std::string path = env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) return;
    auto file = GgufFile::Open(path);
    if (!file.ok()) return;
    file_ = std::move(*file).release();
    auto tok = Tokenizer::FromGguf(*file_);
    if (tok.ok()) tok_ = std::move(*tok).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    tok_ = nullptr;
    file_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "set WINNOW_TEST_MODEL to the SmolLM2 GGUF";
  }
  static GgufFile* file_;
  static Tokenizer* tok_;
};
GgufFile* BpeModelTest::file_ = nullptr;
Tokenizer* BpeModelTest::tok_ = nullptr;

TEST_F(BpeModelTest, MatchesLlamaCpp) {
  const Tokenizer& t = *tok_;
  // Expected ids from llama-cpp-python 0.3.36 (Llama(vocab_only=True).tokenize).
  EXPECT_EQ(t.Encode("Hello world! <|im_start|>user\nWhat's 12345 + 6789?  \xC3\x9Cn\xC3\xAF"
                     "c\xC3\xB6" "d\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87<|im_end|>",
                     true, true),
            (std::vector<int32_t>{19556, 905,  17,    216,  1,     4093, 198,   1780, 506, 216,
                                  33,    34,   35,    36,   37,    1232, 216,   38,   39,  40,
                                  41,    47,   216,   5549, 246,   94,   25972, 83,   7466, 84,
                                  2756,  40303, 218,  216,  28589, 29184, 2}));
  EXPECT_EQ(t.Encode("<|im_start|>user\nHi<|im_end|>", true, false),
            (std::vector<int32_t>{44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306,
                                  79, 486, 108, 46}));
  EXPECT_EQ(t.Encode("   leading spaces\n\n\ttabs  ", true, true),
            (std::vector<int32_t>{256, 2899, 5600, 1116, 197, 100, 7366, 256}));
  EXPECT_EQ(t.Encode("I'll say \"don't\" 3.14", true, true),
            (std::vector<int32_t>{57, 3060, 1643, 476, 12420, 982, 18, 216, 35, 30, 33, 36}));
}

TEST_F(BpeModelTest, SpecialTokensAndEndOfGeneration) {
  const Tokenizer& t = *tok_;
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.FindSpecial("<|im_end|>"), 2);
  EXPECT_EQ(t.FindSpecial("<|im_start|>"), 1);
  EXPECT_EQ(t.FindSpecial("Hello"), -1);
  EXPECT_TRUE(t.IsEndOfGeneration(2));   // <|im_end|> (also EOS)
  EXPECT_TRUE(t.IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_FALSE(t.IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_EQ(t.TokenToPiece(1, false), "");
  EXPECT_EQ(t.TokenToPiece(1, true), "<|im_start|>");
  EXPECT_EQ(t.TokenToPiece(216, false), " ");
}

TEST_F(BpeModelTest, RoundTripAndStreaming) {
  const Tokenizer& t = *tok_;
  const std::string text =
      "Emoji \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 and "
      "\xE4\xB8\xAD\xE6\x96\x87\xE6\xB5\x8B\xE8\xAF\x95, \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 "
      "<|im_start|>\n\tcode();  ";
  const std::vector<int32_t> ids = t.Encode(text, true, true);
  EXPECT_EQ(t.Decode(ids, true), text);
  StreamingDetokenizer d(t, /*render_special=*/true);
  std::string streamed;
  int held = 0;
  for (int32_t id : ids) {
    std::string delta = d.Append(id);
    EXPECT_TRUE(IsValidUtf8(delta));
    if (delta.empty()) ++held;
    streamed += delta;
  }
  streamed += d.Flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0);  // the family emoji and CJK span several byte-level tokens
}

TEST_F(BpeModelTest, LongPromptIsFast) {
  const Tokenizer& t = *tok_;
  std::string text;
  for (int i = 0; i < 220; ++i) {
    text += "Section " + std::to_string(i) +
            ": the quick brown fox jumps over the lazy dog; caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 "
            "\xF0\x9F\x98\x80 <|im_end|>\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t.Encode(text, true, true);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 4000u);
  std::printf("encoded %zu bytes into %zu tokens in %.2f ms\n", text.size(), ids.size(), ms);
  EXPECT_LT(ms, 500.0);  // generous: it takes a few ms; this only catches quadratic blow-ups
}

}  // namespace
}  // namespace winnow::model
