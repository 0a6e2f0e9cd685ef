// Shared machinery of the GGUF tokenizers: vocabulary, token attributes, special-token ids, the
// end-of-generation set, and the split of text around special tokens. BPE and SPM differ only in
// how a plain-text fragment becomes ids and how a normal token becomes bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "model/gguf.h"
#include "model/tokenizer/byte_trie.h"
#include "model/tokenizer/tokenizer.h"

namespace winnow::model {

// Token attributes, as llama.cpp keeps them (bit flags; GGUF stores only the token type).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};

class VocabTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  std::string TokenToPiece(int32_t id, bool render_special) const override;

  // Id of the token whose text is exactly `text` (the last one if texts repeat), or -1.
  int32_t TextToId(std::string_view text) const;
  uint32_t attr(int32_t id) const { return attrs_[id]; }
  int32_t unk_id() const { return unk_id_; }
  bool add_eos() const { return add_eos_; }
  int32_t FindSpecialToken(std::string_view text) const;

  // A piece of the input: raw text (token < 0) or an already recognised special token.
  struct Fragment {
    int32_t token = -1;
    size_t offset = 0;
    size_t length = 0;
  };
  // The split llama.cpp's tokenizer_st_partition makes: special tokens are cut out longest text
  // first, each at all its non-overlapping occurrences, left to right.
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;

 protected:
  struct Defaults {
    int32_t bos = -1;
    int32_t eos = -1;
    int32_t unk = -1;
    bool add_bos = false;
    bool add_eos = false;
  };
  // Reads tokens, types, scores, special ids and add_bos/add_eos, then derives the attributes,
  // the end-of-generation set and the caches exactly once.
  absl::Status LoadVocab(const GgufFile& file, const Defaults& defaults);

  // Appends the ids of one raw-text fragment. `after_special` is true for the first fragment and
  // for fragments that follow a special token (SentencePiece prefixes a space there).
  virtual void EncodeFragment(std::string_view text, bool after_special,
                              std::vector<int32_t>* out) const = 0;
  // Bytes of a token with the normal attribute.
  virtual std::string NormalPiece(const std::string& text) const = 0;

  // Byte value of a <0xNN> token, or -1.
  static int ByteTokenValue(std::string_view text);

  std::vector<float> scores_;
  std::vector<uint32_t> attrs_;
  absl::flat_hash_map<std::string, int32_t> text_to_id_;
  int32_t unk_id_ = -1;

 private:
  // Steps of LoadVocab, in the order it runs them.
  struct FimIds {
    int32_t pre = -1;
    int32_t suf = -1;
    int32_t mid = -1;
  };
  void IndexTokens(std::vector<std::string> tokens, const std::vector<int64_t>& types);
  FimIds ReadSpecialIds(const GgufFile& file, const Defaults& defaults);
  void ReadAddBosEos(const GgufFile& file, const Defaults& defaults);
  void DetectSpecialTokensByText(FimIds* fim);
  std::vector<int32_t> EndOfGenerationIds();
  void DropMessageEnds(std::vector<int32_t>* eog);
  void MarkAlwaysRenderedTokens();
  bool IsCanonical(int32_t id) const;
  void ForceControl(int32_t id);
  void BuildCaches(const GgufFile& file);
  // Ids of special tokens whose text occurs in `text`, in partition order.
  std::vector<int32_t> SpecialsPresent(std::string_view text, bool parse_special) const;

  int32_t eot_id_ = -1;
  int32_t eom_id_ = -1;
  int32_t fim_pad_id_ = -1;
  int32_t fim_rep_id_ = -1;
  int32_t fim_sep_id_ = -1;

  // Special tokens (control, user-defined, unknown) by descending text length, ties by id.
  std::vector<int32_t> special_order_;
  std::vector<int32_t> special_rank_;  // id -> position in special_order_, or -1
  // The special texts, each with its id (the first in special_order_ for equal texts).
  ByteTrie special_trie_;
  std::vector<std::string> pieces_;  // TokenToPiece(id, true) of every token
};

}  // namespace winnow::model
