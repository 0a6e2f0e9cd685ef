#include "model/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/spm_tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/vocab_tokenizer.h"

namespace winnow::model {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model file has no usable tokenizer.ggml.model: ", model.status().message()));
  }
  if (*model == "gpt2") {
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> bpe, BpeTokenizer::FromGguf(file));
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }
  if (*model == "llama") {
    WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> spm, SpmTokenizer::FromGguf(file));
    return std::unique_ptr<Tokenizer>(std::move(spm));
  }
  return absl::UnimplementedError(absl::StrCat(
      "tokenizer model '", *model, "' is not supported (only 'gpt2' BPE and 'llama' SPM)"));
}

std::vector<std::string> Tokenizer::Pieces(bool render_special) const {
  std::vector<std::string> pieces(vocab_size());
  for (int32_t id = 0; id < vocab_size(); ++id) pieces[id] = TokenToPiece(id, render_special);
  return pieces;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += TokenToPiece(id, render_special);
  return out;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

int32_t Tokenizer::FindSpecial(std::string_view text) const {
  if (const auto* vocab = dynamic_cast<const VocabTokenizer*>(this); vocab != nullptr) {
    return vocab->FindSpecialToken(text);
  }
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const int32_t type = id < static_cast<int32_t>(token_types_.size()) ? token_types_[id] : 1;
    if ((type == 3 || type == 4) && tokens_[id] == text) return id;
  }
  return -1;
}

void Tokenizer::SetSpecialIds(int32_t bos_id, int32_t eos_id,
                              std::span<const int32_t> more_eog_ids) {
  auto known = [this](int32_t id) { return id >= 0 && id < vocab_size(); };
  if (known(bos_id)) bos_id_ = bos_id;
  if (known(eos_id)) {
    eos_id_ = eos_id;
    eog_ids_.push_back(eos_id);
  }
  for (int32_t id : more_eog_ids) {
    if (known(id)) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
}

std::string StreamingDetokenizer::Append(int32_t id) {
  pending_ += tokenizer_.TokenToPiece(id, render_special_);
  return TakeCompleteUtf8(&pending_);
}

std::string StreamingDetokenizer::Flush() {
  std::string out = ReplaceInvalidUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace winnow::model
