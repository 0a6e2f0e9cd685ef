#include "model/tokenizer/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace winnow::model {

absl::StatusOr<std::unique_ptr<Pcre2Regex>> Pcre2Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // DOLLAR_ENDONLY: `$` means the end of the subject, as in ECMAScript and Oniguruma.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("does not compile at offset ", error_offset,
                                                   ": ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
  std::unique_ptr<Pcre2Regex> regex(new Pcre2Regex());
  regex->code_ = code;
  return regex;
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Pcre2Regex::Scanner::Scanner(const Pcre2Regex& regex)
    : regex_(regex),
      match_data_(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(regex.code_),
                                                       nullptr)) {}

Pcre2Regex::Scanner::~Scanner() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

std::optional<std::pair<size_t, size_t>> Pcre2Regex::Scanner::Find(std::string_view subject,
                                                                   size_t pos) {
  auto* code = static_cast<pcre2_code*>(regex_.code_);
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, text, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, text, subject.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                     nullptr);
  }
  if (rc < 0) {
    if (rc != PCRE2_ERROR_NOMATCH) spdlog::warn("tokenizer: regex failed with PCRE2 error {}", rc);
    return std::nullopt;
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  return std::make_pair(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
}

}  // namespace winnow::model
