#include "model/tokenizer/unicode.h"

#include <array>

namespace winnow::model {
namespace {

enum class SeqState { kComplete, kIncomplete, kInvalid };

// Strict check of the sequence starting at p[0]. On kComplete and kInvalid, *len is the number of
// bytes to consume (for kInvalid: the maximal ill-formed subpart, at least 1).
SeqState CheckSequence(const uint8_t* p, size_t avail, size_t* len) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *len = 1;
    return SeqState::kComplete;
  }
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 3;
  } else if (b0 == 0xED) {
    need = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4, hi = 0x8F;
  } else {
    *len = 1;
    return SeqState::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= avail) return SeqState::kIncomplete;
    const uint8_t b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *len = i;
      return SeqState::kInvalid;
    }
  }
  *len = need;
  return SeqState::kComplete;
}

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

struct ByteMap {
  std::array<uint32_t, 256> byte_to_cpt{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cpt_to_byte{};  // stand-ins are all below U+0200
};

ByteMap BuildByteMap() {
  ByteMap m;
  m.cpt_to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cpt = printable(b) ? b : next++;
    m.byte_to_cpt[b] = cpt;
    AppendUtf8(cpt, &m.byte_to_utf8[b]);
    m.cpt_to_byte[cpt] = static_cast<int16_t>(b);
  }
  return m;
}

const ByteMap& GetByteMap() {
  static const ByteMap* map = new ByteMap(BuildByteMap());
  return *map;
}

}  // namespace

size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t b0 = p[i];
    if (b0 < 0x80) {
      out.push_back(b0);
      i += 1;
    } else if ((b0 & 0x40) == 0) {
      out.push_back(kReplacementChar);
      i += 1;
    } else if ((b0 & 0x20) == 0) {
      if (!cont(1)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu));
      i += 2;
    } else if ((b0 & 0x10) == 0) {
      if (!cont(1) || !cont(2)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu));
      i += 3;
    } else if ((b0 & 0x08) == 0) {
      if (!cont(1) || !cont(2) || !cont(3)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) |
                    ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu));
      i += 4;
    } else {
      out.push_back(kReplacementChar);
      i += 1;
    }
  }
  return out;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt > 0x10FFFF) cpt = kReplacementChar;
  if (cpt <= 0x7F) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    if (CheckSequence(p + i, text.size() - i, &len) != SeqState::kComplete) return false;
    i += len;
  }
  return true;
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t len = 0;
    switch (CheckSequence(p + i, bytes.size() - i, &len)) {
      case SeqState::kComplete:
        out.append(bytes.substr(i, len));
        i += len;
        break;
      case SeqState::kInvalid:
        out.append(kReplacementUtf8);
        i += len;
        break;
      case SeqState::kIncomplete:
        // A truncated sequence at the very end is one ill-formed subpart.
        out.append(kReplacementUtf8);
        i = bytes.size();
        break;
    }
  }
  return out;
}

std::string TakeCompleteUtf8(std::string* pending) {
  std::string out;
  const std::string& in = *pending;
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  size_t i = 0;
  while (i < in.size()) {
    size_t len = 0;
    const SeqState state = CheckSequence(p + i, in.size() - i, &len);
    if (state == SeqState::kIncomplete) break;
    if (state == SeqState::kComplete) {
      out.append(in, i, len);
    } else {
      out.append(kReplacementUtf8);
    }
    i += len;
  }
  pending->erase(0, i);
  return out;
}

bool IsUnicodeWhitespace(uint32_t cpt) {
  switch (cpt) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cpt >= 0x2000 && cpt <= 0x200A;
  }
}

uint32_t ByteToBpeCodepoint(uint8_t byte) { return GetByteMap().byte_to_cpt[byte]; }

const std::string& ByteToBpeChar(uint8_t byte) { return GetByteMap().byte_to_utf8[byte]; }

int BpeCodepointToByte(uint32_t cpt) {
  if (cpt >= 512) return -1;
  return GetByteMap().cpt_to_byte[cpt];
}

}  // namespace winnow::model
