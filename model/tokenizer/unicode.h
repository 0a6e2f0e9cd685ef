// UTF-8 and GPT-2 byte-level helpers shared by the tokenizers and the detokenizer.
//
// Decoding here is deliberately lenient in the same way as llama.cpp's unicode_cpts_from_utf8
// (the reference for GGUF tokenisation): a byte that does not start a well-formed sequence becomes
// U+FFFD, while overlong forms and surrogates are accepted as code points. Output towards clients
// goes through the strict ReplaceInvalidUtf8 instead, so that text deltas are always valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace winnow::model {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence a byte starts, by its high nibble; continuation and invalid lead
// bytes count as 1. Used to cut text into symbols for BPE/SPM merging.
size_t Utf8SequenceLength(uint8_t lead);

// Lenient decoding (see above).
std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text);

// Appends the UTF-8 encoding of `cpt`. Surrogates are encoded as 3 bytes like any other BMP code
// point; values above U+10FFFF become U+FFFD.
void AppendUtf8(uint32_t cpt, std::string* out);

// Strict validation: no overlongs, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(std::string_view text);

// Strictly valid copy of `bytes`: each maximal ill-formed subsequence becomes one U+FFFD.
std::string ReplaceInvalidUtf8(std::string_view bytes);

// Moves the longest prefix of `*pending` that can be emitted now into the result: complete
// characters are copied, ill-formed subsequences become U+FFFD, and only a trailing incomplete
// (but so far well-formed) sequence stays in `*pending`.
std::string TakeCompleteUtf8(std::string* pending);

// llama.cpp's whitespace set (Unicode White_Space): the class \s stands for in pre-tokenizer
// regexes.
bool IsUnicodeWhitespace(uint32_t cpt);

// GPT-2 byte-level mapping: every byte has a printable stand-in code point.
uint32_t ByteToBpeCodepoint(uint8_t byte);
// The stand-in as UTF-8.
const std::string& ByteToBpeChar(uint8_t byte);
// Inverse of ByteToBpeCodepoint, or -1 when `cpt` is no stand-in.
int BpeCodepointToByte(uint32_t cpt);

}  // namespace winnow::model
