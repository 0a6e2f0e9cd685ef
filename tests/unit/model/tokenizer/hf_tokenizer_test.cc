// tokenizer.json reading: small hand-written documents (expected ids from the `tokenizers`
// library 0.23 on the same documents), the pipeline components one by one, NFC, and the errors
// the parser gives. The differential test on whole families is tests/python/test_tokenizer_json.py.
#include "model/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer/hf_pipeline.h"
#include "model/tokenizer/unicode_nfc.h"

namespace winnow::model {
namespace {

using Ids = std::vector<int32_t>;

// Byte-level BPE with single digits, a BOS/EOS template and an lstrip/rstrip added token.
constexpr char kByteLevelDoc[] = R"({
 "model": {"type": "BPE", "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6,
   "d": 7, "he": 8, "ll": 9, "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14,
   "Ġworld": 15, "<|eot|>": 16, "1": 17, "2": 18, "12": 19, "Ġworl": 20},
  "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",
             "1 2"]},
 "added_tokens": [{"id": 16, "content": "<|eot|>", "special": true, "normalized": false},
   {"id": 21, "content": "<|bos|>", "special": true, "normalized": false},
   {"id": 22, "content": "<x>", "special": false, "normalized": false, "lstrip": true,
    "rstrip": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
   {"type": "Digits", "individual_digits": true},
   {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
 "post_processor": {"type": "TemplateProcessing",
   "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
              {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|eot|>", "type_id": 0}}],
   "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [21]},
                      "<|eot|>": {"id": "<|eot|>", "ids": [16]}}},
 "decoder": {"type": "ByteLevel"}})";

// SentencePiece-style BPE: Prepend/Replace normalizer, byte fallback, fused unknowns, <s>, and a
// normalized non-special added token.
constexpr char kSpmDoc[] = R"({
 "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
  "vocab": {"<unk>": 0, "<s>": 1, "<0x0A>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5, "a": 6,
   "b": 7, "▁a": 8, "▁ab": 9},
  "merges": [["▁", "a"], ["▁a", "b"]]},
 "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
   {"id": 1, "content": "<s>", "special": true, "normalized": false},
   {"id": 10, "content": "<n>", "special": false, "normalized": true}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
 "pre_tokenizer": null,
 "post_processor": {"type": "TemplateProcessing",
   "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
              {"Sequence": {"id": "A", "type_id": 0}}],
   "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}}},
 "decoder": {"type": "Sequence", "decoders": [
   {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
   {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})";

std::unique_ptr<Tokenizer> Load(const std::string& doc) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromTokenizerJson(doc);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

TEST(HfTokenizerTest, ByteLevelBpeWithTemplate) {
  std::unique_ptr<Tokenizer> tok = Load(kByteLevelDoc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("hello world", true, true), (Ids{21, 11, 15, 16}));
  EXPECT_EQ(tok->Encode("hello world", false, true), (Ids{11, 15}));
  // Digits split one by one before ByteLevel, so the "1 2" merge never applies.
  EXPECT_EQ(tok->Encode("hello world12", false, true), (Ids{11, 15, 17, 18}));
  EXPECT_EQ(tok->Encode("hello<|eot|>world", false, true), (Ids{11, 16, 5, 13, 2, 7}));
  // Without special-token parsing the text is plain; characters with no token are dropped.
  EXPECT_EQ(tok->Encode("hello<|eot|>", false, false), (Ids{11, 1, 3}));
  // lstrip/rstrip: the spaces around <x> belong to it.
  EXPECT_EQ(tok->Encode("hello  <x>  world", false, true), (Ids{11, 22, 5, 13, 2, 7}));
  EXPECT_EQ(tok->Encode("", true, true), (Ids{21, 16}));
  EXPECT_EQ(tok->Encode("zzz hello", false, true), (Ids{4, 11}));
  EXPECT_EQ(tok->bos_id(), 21);
  EXPECT_EQ(tok->eos_id(), 16);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->IsEndOfGeneration(16));
  EXPECT_EQ(tok->FindSpecial("<|eot|>"), 16);
  EXPECT_EQ(tok->FindSpecial("<x>"), 22);
  EXPECT_EQ(tok->TokenToPiece(15, false), " world");
  EXPECT_EQ(tok->TokenToPiece(16, false), "");
  EXPECT_EQ(tok->TokenToPiece(16, true), "<|eot|>");
  EXPECT_EQ(tok->TokenToPiece(22, false), "<x>");
  EXPECT_EQ(tok->vocab_size(), 23);
}

TEST(HfTokenizerTest, SentencePieceStyleBpe) {
  std::unique_ptr<Tokenizer> tok = Load(kSpmDoc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab a", true, true), (Ids{1, 9, 8}));
  EXPECT_EQ(tok->Encode("ab\n\xC3\xA9", false, true), (Ids{9, 2, 3, 4}));  // byte fallback
  // No byte token for 'x'/'y'/'z': one fused unknown for the run.
  EXPECT_EQ(tok->Encode("ab xyz a", false, true), (Ids{9, 5, 0, 8}));
  EXPECT_EQ(tok->Encode("hello world", false, true), (Ids{5, 0, 5, 0}));
  // A normalized added token matches the normalized text: only "▁<n>".
  EXPECT_EQ(tok->Encode("a<n>b <n>", false, true), (Ids{8, 0, 7, 10}));
  EXPECT_EQ(tok->Encode("<s>ab", false, true), (Ids{1, 9}));
  EXPECT_EQ(tok->Encode("", true, true), (Ids{1}));
  EXPECT_EQ(tok->Decode(Ids{9, 2, 3, 4}, false), " ab\n\xC3\xA9");  // pieces keep the space
  EXPECT_EQ(tok->TokenToPiece(3, false), "\xC3");
  EXPECT_EQ(tok->TokenToPiece(0, false), "");
  EXPECT_EQ(tok->TokenToPiece(0, true), "<unk>");
}

TEST(HfTokenizerTest, InvalidUtf8IsReplacedFirst) {
  std::unique_ptr<Tokenizer> tok = Load(kSpmDoc);
  ASSERT_NE(tok, nullptr);
  // "\xFF" becomes U+FFFD (EF BF BD) before anything else, as Python's errors="replace".
  EXPECT_EQ(tok->Encode("a\xFF", false, true), tok->Encode("a\xEF\xBF\xBD", false, true));
  EXPECT_EQ(tok->Encode("\xE2\x82 b", false, true), tok->Encode("\xEF\xBF\xBD b", false, true));
}

std::vector<std::string> PreTokenize(const std::string& json_text, const std::string& text) {
  absl::StatusOr<std::unique_ptr<HfPreTokenizer>> pre =
      HfPreTokenizer::FromJson(nlohmann::json::parse(json_text), "pre_tokenizer");
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<HfPiece> pieces = {{text, true}};
  (*pre)->PreTokenize(&pieces);
  std::vector<std::string> out;
  for (const HfPiece& p : pieces) out.push_back(p.text);
  return out;
}

std::string SplitJson(const std::string& behavior, bool invert) {
  return R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

using Pieces = std::vector<std::string>;

TEST(HfPipelineTest, SplitBehavioursAsTokenizers) {
  const std::string text = "a-b--c d";
  EXPECT_EQ(PreTokenize(SplitJson("Removed", false), text), (Pieces{"a", "b", "c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("Removed", true), text), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(PreTokenize(SplitJson("Isolated", false), text),
            (Pieces{"a", "-", "b", "-", "-", "c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithPrevious", false), text),
            (Pieces{"a-", "b-", "-", "c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithPrevious", true), text),
            (Pieces{"a", "-b", "-", "-c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithNext", false), text),
            (Pieces{"a", "-b", "-", "-c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithNext", true), text),
            (Pieces{"a-", "b-", "-", "c d"}));
  EXPECT_EQ(PreTokenize(SplitJson("Contiguous", false), text),
            (Pieces{"a", "-", "b", "--", "c d"}));
}

TEST(HfPipelineTest, EmptyRegexMatchesSplitAsOniguruma) {
  const std::string isolated =
      R"({"type": "Split", "pattern": {"Regex": "x*"}, "behavior": "Isolated"})";
  EXPECT_EQ(PreTokenize(isolated, "abxxc"), (Pieces{"a", "b", "xx", "c"}));
  const std::string removed =
      R"({"type": "Split", "pattern": {"Regex": "x*"}, "behavior": "Removed"})";
  EXPECT_EQ(PreTokenize(removed, "abxxc"), (Pieces{"a", "b", "c"}));
}

TEST(HfPipelineTest, DigitsMetaspaceByteLevel) {
  EXPECT_EQ(PreTokenize(R"({"type": "Digits", "individual_digits": false})", "ab123c4"),
            (Pieces{"ab", "123", "c", "4"}));
  EXPECT_EQ(PreTokenize(R"({"type": "Metaspace", "replacement": "▁",
                           "prepend_scheme": "always", "split": true})",
                        "hi  there"),
            (Pieces{"▁hi", "▁", "▁there"}));
  EXPECT_EQ(PreTokenize(R"({"type": "ByteLevel", "add_prefix_space": true})", "Hello  world"),
            (Pieces{"ĠHello", "Ġ", "Ġworld"}));
  // \s in a tokenizer.json regex is Oniguruma's: U+0085 counts as whitespace.
  EXPECT_EQ(PreTokenize(R"({"type": "Split", "pattern": {"Regex": "\\s+"},
                           "behavior": "Removed"})",
                        "a\xC2\x85" "b"),
            (Pieces{"a", "b"}));
}

TEST(HfPipelineTest, NfcMatchesPython) {
  // Expected values from Python's unicodedata.normalize("NFC", ...), which the
  // `tokenizers` NFC normalizer agrees with on these.
  EXPECT_EQ(NormalizeNfc("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(NormalizeNfc("\xE1\xBA\x9B\xCC\xA3"), "\xE1\xBA\x9B\xCC\xA3");  // ẛ̣ stays
  EXPECT_EQ(NormalizeNfc("A\xCC\x8A\xCC\xA3"), "\xE1\xBA\xA0\xCC\x8A");     // reordered marks
  EXPECT_EQ(NormalizeNfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul
  EXPECT_EQ(NormalizeNfc("\xE2\x84\xAB"), "\xC3\x85");  // Angstrom sign -> Å (singleton)
  EXPECT_EQ(NormalizeNfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
  EXPECT_EQ(NormalizeNfc("plain ASCII"), "plain ASCII");
  EXPECT_FALSE(NfcUnicodeVersion().empty());
}

void ExpectHas(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << message;
}

std::string LoadError(const std::string& doc) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromTokenizerJson(doc);
  EXPECT_FALSE(tok.ok());
  return tok.ok() ? "" : std::string(tok.status().message());
}

// kByteLevelDoc with the text `from` replaced by `to`.
std::string ByteLevelWith(const std::string& from, const std::string& to) {
  std::string doc = kByteLevelDoc;
  const size_t pos = doc.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return doc.replace(pos, from.size(), to);
}

constexpr char kDigits[] = R"({"type": "Digits", "individual_digits": true})";

TEST(HfTokenizerTest, ErrorsNameTheJsonPath) {
  ExpectHas(LoadError("not json"), "not a JSON object");
  ExpectHas(LoadError(R"({"model": {"type": "WordPiece", "vocab": {}}})"),
            "model.type 'WordPiece' is not supported");
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {kDigits, R"({"type": "Whitespace"})",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].type 'Whitespace' is not supported"},
      {R"("normalizer": null)", R"("normalizer": {"type": "NFKC"})",
       "normalizer.type 'NFKC' is not supported"},
      {R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "CTC"})",
       "decoder.type 'CTC' is not supported"},
      {R"("type": "TemplateProcessing")", R"("type": "RobertaProcessing")",
       "post_processor.type 'RobertaProcessing' is not supported"},
      {R"("1 2"])", R"("1 3"])", "model.merges[9] '1 3' uses or makes a token not in the vocab"},
      {R"("1 2"])", R"("12"])", "model.merges[9] must hold exactly one space"},
      {R"("type": "BPE",)", R"("type": "BPE", "unk_token": "?",)",
       "model.unk_token '?' is no token"},
      {kDigits, R"({"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"})",
       "pre_tokenizer.pretokenizers[0].pattern.Regex does not compile"},
      {kDigits, R"({"type": "Split", "pattern": {"Regex": "[\\S]"}, "behavior": "Isolated"})",
       "inside a character class"},
      {kDigits, R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})",
       "pre_tokenizer.pretokenizers[0].behavior 'Sideways' is not known"},
      {R"("ids": [16])", R"("ids": ["x"])", "tokenizer.json: "},
  };
  for (const Case& c : cases) ExpectHas(LoadError(ByteLevelWith(c.from, c.to)), c.message);
}

}  // namespace
}  // namespace winnow::model
