// PCRE2 patterns compiled the way every tokenizer regex is (GGUF pre-tokenizers and
// tokenizer.json alike): UTF and UCP, `$` only at the very end of the subject, JIT when
// available. Kept in one place so both match with the same options and the same fallback.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"

namespace winnow::model {

class Pcre2Regex {
 public:
  // InvalidArgument with PCRE2's message and offset when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Pcre2Regex>> Compile(std::string_view pattern);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Match state of one thread for one regex.
  class Scanner {
   public:
    explicit Scanner(const Pcre2Regex& regex);
    ~Scanner();
    Scanner(const Scanner&) = delete;
    Scanner& operator=(const Scanner&) = delete;
    // The first match at or after `pos` in `subject` (valid UTF-8: it is not checked), as
    // [start, end). A JIT stack overflow is retried with the interpreter; other errors are
    // logged and end the search like no match.
    std::optional<std::pair<size_t, size_t>> Find(std::string_view subject, size_t pos);

   private:
    const Pcre2Regex& regex_;
    void* match_data_;  // pcre2_match_data_8
  };

 private:
  Pcre2Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8; void keeps pcre2.h out of this header
};

}  // namespace winnow::model
