// Unicode Normalization Form C, for tokenizer.json's NFC normalizer (Qwen2/Qwen3). The tables
// are generated from Python's unicodedata by scripts/gen-unicode-nfc.py.
#pragma once

#include <string>
#include <string_view>

namespace winnow::model {

// NFC of strictly valid UTF-8 (callers make the text valid first). Text without any code point
// at or above U+0300 is returned unchanged without decoding: nothing below composes.
std::string NormalizeNfc(std::string_view text);

// The Unicode version of the tables, for the documentation and tests.
std::string_view NfcUnicodeVersion();

}  // namespace winnow::model
