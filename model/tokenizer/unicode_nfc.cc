#include "model/tokenizer/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "model/tokenizer/unicode.h"

namespace winnow::model {
namespace {

struct CombiningClassEntry {
  uint32_t cp;
  uint8_t ccc;
};

struct DecompositionEntry {
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0 for a singleton
  uint8_t composes;  // the pair composes back to cp (a primary composite)
};

#include "model/tokenizer/unicode_nfc_data.inc"

// Hangul syllables decompose and compose by arithmetic (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](const CombiningClassEntry& e, uint32_t v) { return e.cp < v; });
  return it != std::end(kCombiningClass) && it->cp == cp ? it->ccc : 0;
}

const DecompositionEntry* FindDecomposition(uint32_t cp) {
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const DecompositionEntry& e, uint32_t v) { return e.cp < v; });
  return it != std::end(kDecomposition) && it->cp == cp ? &*it : nullptr;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const DecompositionEntry* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  Decompose(d->first, out);  // mappings may themselves decompose
  if (d->second != 0) Decompose(d->second, out);
}

// Canonical ordering: a stable sort by combining class of each run of non-starters.
void ReorderMarks(std::vector<uint32_t>* cps) {
  auto& v = *cps;
  for (size_t i = 0; i < v.size();) {
    if (CombiningClass(v[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < v.size() && CombiningClass(v[end]) != 0) ++end;
    std::stable_sort(v.begin() + i, v.begin() + end,
                     [](uint32_t a, uint32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = end;
  }
}

uint64_t PairKey(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 21) | b; }

const absl::flat_hash_map<uint64_t, uint32_t>& Compositions() {
  static const auto* map = [] {
    auto* m = new absl::flat_hash_map<uint64_t, uint32_t>();
    for (const DecompositionEntry& d : kDecomposition) {
      if (d.composes) m->emplace(PairKey(d.first, d.second), d.cp);
    }
    return m;
  }();
  return *map;
}

// The primary composite of a starter and a following character, or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& map = Compositions();
  auto it = map.find(PairKey(a, b));
  return it == map.end() ? 0 : it->second;
}

// Canonical composition: each character joins the last starter unless a character between them
// blocks it (a starter, or a mark of the same or a higher class).
std::vector<uint32_t> ComposeAll(const std::vector<uint32_t>& cps) {
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  uint8_t last_ccc = 0;
  for (uint32_t cp : cps) {
    const uint8_t ccc = CombiningClass(cp);
    if (starter != SIZE_MAX) {
      const bool adjacent = out.size() == starter + 1;
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        if (const uint32_t composite = Compose(out[starter], cp); composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    last_ccc = ccc;
    out.push_back(cp);
  }
  return out;
}

}  // namespace

std::string NormalizeNfc(std::string_view text) {
  // Lead bytes below 0xCC only start code points below U+0300, which neither decompose nor
  // combine with anything before them.
  const bool may_change = std::any_of(text.begin(), text.end(), [](char c) {
    return static_cast<uint8_t>(c) >= 0xCC;
  });
  if (!may_change) return std::string(text);
  std::vector<uint32_t> decomposed;
  decomposed.reserve(text.size());
  for (uint32_t cp : DecodeUtf8Lenient(text)) Decompose(cp, &decomposed);
  ReorderMarks(&decomposed);
  std::string out;
  out.reserve(text.size());
  for (uint32_t cp : ComposeAll(decomposed)) AppendUtf8(cp, &out);
  return out;
}

std::string_view NfcUnicodeVersion() { return kNfcUnicodeVersion; }

}  // namespace winnow::model
