#include "structured/json_matcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace winnow::structured {
namespace {

// Object phases.
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjAfterValue, kObjNext };
// Array phases.
enum : uint8_t { kArrOpen, kArrAfterValue, kArrNext };
// String phases.
enum : uint8_t { kStrChars, kStrEscape, kStrHex };
// Number phases.
enum : uint8_t {
  kNumStart, kNumSign, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits
};
constexpr uint8_t kNegative = 1;

bool IsWhitespace(int byte) { return byte == ' ' || byte == '\n' || byte == '\t' || byte == '\r'; }
bool IsDigit(int byte) { return byte >= '0' && byte <= '9'; }
int HexValue(int byte) {
  if (IsDigit(byte)) return byte - '0';
  if (byte >= 'a' && byte <= 'f') return byte - 'a' + 10;
  if (byte >= 'A' && byte <= 'F') return byte - 'A' + 10;
  return -1;
}

void Add(absl::InlinedVector<Stack, 2>& out, Stack s) {
  if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
}

// Whitespace in a container's gap: counted, and refused past the limit.
bool TakeWhitespace(Frame& f, int byte) {
  if (!IsWhitespace(byte) || f.ws >= kMaxWhitespace) return false;
  ++f.ws;
  return true;
}

// UTF-8 inside a string: b holds the continuation bytes still due and the range the next one
// must fall in (which excludes overlong forms, surrogates and code points past U+10FFFF).
int32_t Utf8Pending(int remaining, int lo, int hi) { return remaining | (lo << 8) | (hi << 16); }
int32_t Utf8Lead(int byte) {
  if (byte >= 0xC2 && byte <= 0xDF) return Utf8Pending(1, 0x80, 0xBF);
  if (byte == 0xE0) return Utf8Pending(2, 0xA0, 0xBF);
  if ((byte >= 0xE1 && byte <= 0xEC) || byte == 0xEE || byte == 0xEF) {
    return Utf8Pending(2, 0x80, 0xBF);
  }
  if (byte == 0xED) return Utf8Pending(2, 0x80, 0x9F);
  if (byte == 0xF0) return Utf8Pending(3, 0x90, 0xBF);
  if (byte >= 0xF1 && byte <= 0xF3) return Utf8Pending(3, 0x80, 0xBF);
  if (byte == 0xF4) return Utf8Pending(3, 0x80, 0x8F);
  return -1;
}

// A set of reals with open or closed ends, for number bounds.
struct Interval {
  double lo, hi;
  bool lo_closed, hi_closed;

  Interval Negated() const { return {-hi, -lo, hi_closed, lo_closed}; }
  bool Intersects(const Interval& o) const {
    const bool lo_from_this = lo > o.lo || (lo == o.lo && !lo_closed);
    const double l = std::max(lo, o.lo);
    const bool l_closed = lo_from_this ? lo_closed : (lo == o.lo ? lo_closed && o.lo_closed
                                                                 : o.lo_closed);
    const bool hi_from_this = hi < o.hi || (hi == o.hi && !hi_closed);
    const double h = std::min(hi, o.hi);
    const bool h_closed = hi_from_this ? hi_closed : (hi == o.hi ? hi_closed && o.hi_closed
                                                                 : o.hi_closed);
    return l < h || (l == h && l_closed && h_closed);
  }
};

Interval BoundsInterval(const NumberBounds& b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  return {b.min.value_or(-kInf), b.max.value_or(kInf), b.min && !b.min_exclusive,
          b.max && !b.max_exclusive};
}

// Whether some completion of the number in `f` lies within the node's bounds. Integers reach
// whole intervals of integers, numbers dense ranges (further fraction digits).
bool NumberViable(const Frame& f, const Node& node) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const Interval bounds = BoundsInterval(node.bounds);
  const bool integer = node.kind == NodeKind::kInteger;
  const bool negative = f.flags & kNegative;
  auto fits = [&](Interval magnitude) {
    return bounds.Intersects(negative ? magnitude.Negated() : magnitude);
  };
  switch (f.phase) {
    case kNumStart:
      return true;
    case kNumSign:
      return fits({0.0, kInf, true, false});
    case kNumZero:
      return fits(integer ? Interval{0, 0, true, true} : Interval{0, 1, true, false});
    case kNumInt:
      // j more integer digits reach [x * 10^j, (x + 1) * 10^j): closed and integral for
      // integers, half-open (fractions) for numbers.
      for (int j = 0; f.a + j <= kMaxIntDigits; ++j) {
        const double scale = std::pow(10.0, j);
        const Interval reach = integer ? Interval{f.x * scale, (f.x + 1) * scale - 1, true, true}
                                       : Interval{f.x * scale, (f.x + 1) * scale, true, false};
        if (fits(reach)) return true;
      }
      return false;
    case kNumDot:
    case kNumFrac:
      return fits({f.x, f.x + std::pow(10.0, -f.b), true, false});
    default:
      return true;  // exponents only where unbounded
  }
}

}  // namespace

std::string MatchState::Key() const {
  std::string key;
  for (const Stack& s : stacks) {
    key.push_back(static_cast<char>(s.size()));
    for (const Frame& f : s) {
      char bytes[4 + 3 * sizeof(int32_t) + sizeof(double)];
      bytes[0] = static_cast<char>(f.kind);
      bytes[1] = static_cast<char>(f.phase);
      bytes[2] = static_cast<char>(f.ws);
      bytes[3] = static_cast<char>(f.flags);
      std::memcpy(bytes + 4, &f.node, 4);
      std::memcpy(bytes + 8, &f.a, 4);
      std::memcpy(bytes + 12, &f.b, 4);
      std::memcpy(bytes + 16, &f.x, 8);
      key.append(bytes, sizeof(bytes));
    }
  }
  return key;
}

MatchState JsonMatcher::Initial() const {
  Stack s;
  s.push_back(Frame{.kind = FrameKind::kDone});
  s.push_back(Frame{.kind = FrameKind::kValue, .node = grammar_->root()});
  MatchState state;
  state.stacks.push_back(std::move(s));
  return state;
}

bool JsonMatcher::Feed(const MatchState& in, int byte, MatchState* out) const {
  out->stacks.clear();
  for (const Stack& s : in.stacks) Step(s, byte, out->stacks);
  return !out->stacks.empty();
}

bool JsonMatcher::FeedAll(MatchState& state, std::string_view bytes) const {
  MatchState next;
  for (const char c : bytes) {
    if (!Feed(state, static_cast<uint8_t>(c), &next)) {
      state.stacks.clear();
      return false;
    }
    std::swap(state, next);
  }
  return true;
}

bool JsonMatcher::CanEnd(const MatchState& state) const {
  MatchState end;
  return Feed(state, kEndOfText, &end);
}

void JsonMatcher::Step(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  switch (f.kind) {
    case FrameKind::kDone:
      if (byte == kEndOfText) Add(out, std::move(s));
      return;
    case FrameKind::kValue: {
      if (TakeWhitespace(f, byte)) {
        Add(out, std::move(s));
        return;
      }
      const int32_t node = f.node;
      s.pop_back();
      StartValue(std::move(s), node, byte, out);
      return;
    }
    case FrameKind::kObject:
      return StepObject(std::move(s), byte, out);
    case FrameKind::kArray:
      return StepArray(std::move(s), byte, out);
    case FrameKind::kString:
      return StepString(std::move(s), byte, out);
    case FrameKind::kNumber:
      return StepNumber(std::move(s), byte, out);
    case FrameKind::kLiteral:
      return StepLiteral(std::move(s), byte, out);
    case FrameKind::kSequence:
      return StepSequence(std::move(s), byte, out);
  }
}

// The next part of a sequence starts with `byte`; the last part replaces the sequence frame
// (a tail call), so a sequence that recurses in its last part does not deepen the stack.
void JsonMatcher::StepSequence(Stack s, int byte, Out& out, int expansions) const {
  Frame& f = s.back();
  const std::vector<int32_t>& parts = grammar_->node(f.node).sequence;
  if (f.a >= static_cast<int32_t>(parts.size())) {  // empty: done before this byte
    s.pop_back();
    if (s.empty()) return;
    Step(std::move(s), byte, out);
    return;
  }
  const int32_t part = parts[f.a++];
  if (f.a == static_cast<int32_t>(parts.size())) s.pop_back();
  StartValue(std::move(s), part, byte, out, expansions + 1);
}

void JsonMatcher::StartValue(Stack s, int32_t node_id, int byte, Out& out,
                             int expansions) const {
  const Node& node = grammar_->node(node_id);
  const bool room = static_cast<int>(s.size()) < kMaxDepth;
  if (expansions > 2 * kMaxDepth) return;
  switch (node.kind) {
    case NodeKind::kAnyOf:
      for (const int32_t alt : node.alternatives) StartValue(s, alt, byte, out, expansions + 1);
      return;
    case NodeKind::kSequence:
      if (!room) return;
      s.push_back(Frame{.kind = FrameKind::kSequence, .node = node_id});
      StepSequence(std::move(s), byte, out, expansions);
      return;
    case NodeKind::kObject:
      if (byte != '{' || !room) return;
      s.push_back(Frame{.kind = FrameKind::kObject, .phase = kObjOpen, .node = node_id});
      Add(out, std::move(s));
      return;
    case NodeKind::kArray:
      if (byte != '[' || !room) return;
      s.push_back(Frame{.kind = FrameKind::kArray, .phase = kArrOpen, .node = node_id});
      Add(out, std::move(s));
      return;
    case NodeKind::kString:
      if (byte != '"') return;
      s.push_back(Frame{.kind = FrameKind::kString, .phase = kStrChars, .node = node_id});
      Add(out, std::move(s));
      return;
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      if (byte != '-' && !IsDigit(byte)) return;
      s.push_back(Frame{.kind = FrameKind::kNumber, .phase = kNumStart, .node = node_id});
      StepNumber(std::move(s), byte, out);
      return;
    case NodeKind::kLiterals:
      s.push_back(Frame{.kind = FrameKind::kLiteral, .node = node_id, .a = ByteTrie::kRoot});
      StepLiteral(std::move(s), byte, out);
      return;
  }
}

void JsonMatcher::StepObject(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  const Node& node = grammar_->node(f.node);
  const int32_t n = static_cast<int32_t>(node.properties.size());
  const bool may_close = node.FirstRequiredFrom(f.a) == n;
  switch (f.phase) {
    case kObjKey: {
      // Inside a declared key: the properties that may come next are those from `a` up to the
      // first required one (optional ones may be skipped, required ones not).
      const int32_t child = node.key_trie.Child(f.b, static_cast<uint8_t>(byte & 0xFF));
      const int32_t hi = std::min(node.FirstRequiredFrom(f.a), n - 1);
      if (byte == kEndOfText || child == ByteTrie::kNone ||
          !node.key_trie.HasValueIn(child, f.a, hi)) {
        return;
      }
      const int32_t property = node.key_trie.Terminal(child);
      if (property != ByteTrie::kNone) {
        f.a = property + 1;
        f.b = node.properties[property].value;
        f.phase = kObjColon;
        f.ws = 0;
      } else {
        f.b = child;
      }
      Add(out, std::move(s));
      return;
    }
    case kObjColon:
      if (TakeWhitespace(f, byte)) break;
      if (byte != ':') return;
      {
        const int32_t value = f.b;
        f.phase = kObjAfterValue;
        f.ws = 0;
        s.push_back(Frame{.kind = FrameKind::kValue, .node = value});
      }
      break;
    case kObjOpen:
    case kObjNext:
      if (TakeWhitespace(f, byte)) break;
      if (byte == '"') return StartKey(s, out);
      if (byte != '}' || f.phase != kObjOpen || !may_close) return;
      s.pop_back();
      break;
    case kObjAfterValue:
      if (TakeWhitespace(f, byte)) break;
      if (byte == '}' && may_close) {
        s.pop_back();
        break;
      }
      if (byte != ',' || (f.a >= n && node.additional < 0)) return;
      f.phase = kObjNext;
      f.ws = 0;
      break;
    default:
      return;
  }
  Add(out, std::move(s));
}

void JsonMatcher::StartKey(const Stack& s, Out& out) const {
  const Frame& f = s.back();
  const Node& node = grammar_->node(f.node);
  const int32_t n = static_cast<int32_t>(node.properties.size());
  const int32_t next_required = node.FirstRequiredFrom(f.a);
  // A declared key, in order.
  const int32_t quote = node.key_trie.Child(ByteTrie::kRoot, '"');
  if (f.a < n && quote != ByteTrie::kNone &&
      node.key_trie.HasValueIn(quote, f.a, std::min(next_required, n - 1))) {
    Stack declared = s;
    declared.back().phase = kObjKey;
    declared.back().b = quote;
    Add(out, std::move(declared));
  }
  // An undeclared key, once every required property is out; declared ones end there.
  if (node.additional >= 0 && next_required == n && static_cast<int>(s.size()) < kMaxDepth) {
    Stack extra = s;
    Frame& object = extra.back();
    object.a = n;
    object.b = node.additional;
    object.phase = kObjColon;
    object.ws = 0;
    extra.push_back(Frame{.kind = FrameKind::kString, .phase = kStrChars, .node = -1});
    Add(out, std::move(extra));
  }
}

void JsonMatcher::StepArray(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  const Node& node = grammar_->node(f.node);
  if (IsWhitespace(byte)) {
    if (TakeWhitespace(f, byte)) Add(out, std::move(s));
    return;
  }
  if (f.phase == kArrAfterValue) {
    if (byte == ']' && f.a >= node.min_items) {
      s.pop_back();
      Add(out, std::move(s));
    } else if (byte == ',' && (node.max_items < 0 || f.a < node.max_items)) {
      f.phase = kArrNext;
      f.ws = 0;
      Add(out, std::move(s));
    }
    return;
  }
  if (byte == ']') {
    if (f.phase == kArrOpen && node.min_items == 0) {
      s.pop_back();
      Add(out, std::move(s));
    }
    return;
  }
  if (byte == kEndOfText || node.max_items == 0) return;
  ++f.a;
  f.phase = kArrAfterValue;
  f.ws = 0;
  s.push_back(Frame{.kind = FrameKind::kValue, .node = node.items});
  Step(std::move(s), byte, out);
}

namespace {

// After a backslash: one of \" \\ \/ \b \f \n \r \t, or \u and four hex digits (b holds how
// many, and the first). False when the byte cannot come next.
bool StepEscape(Frame& f, int byte) {
  if (f.phase == kStrEscape) {
    if (byte == 'u') {
      f.phase = kStrHex;
      f.b = 0;
      return true;
    }
    if (byte == 0 || std::strchr("\"\\/bfnrt", byte) == nullptr) return false;
    f.phase = kStrChars;
    return true;
  }
  const int digit = HexValue(byte);
  const int count = f.b & 0xFF;
  if (digit < 0) return false;
  // \uD800-\uDFFF (surrogates) are refused: a lone one is not valid Unicode.
  if (count == 1 && (f.b >> 8) == 0xD && digit >= 8) return false;
  f.b = count == 0 ? (1 | (digit << 8)) : ((count + 1) | (f.b & ~0xFF));
  if (count + 1 == 4) {
    f.phase = kStrChars;
    f.b = 0;
  }
  return true;
}

}  // namespace

void JsonMatcher::StepString(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  if (byte == kEndOfText) return;
  if (f.phase != kStrChars) {
    if (StepEscape(f, byte)) Add(out, std::move(s));
    return;
  }
  if (f.b != 0) {  // inside a multi-byte character
    const int remaining = f.b & 0xFF, lo = (f.b >> 8) & 0xFF, hi = (f.b >> 16) & 0xFF;
    if (byte < lo || byte > hi) return;
    f.b = remaining > 1 ? Utf8Pending(remaining - 1, 0x80, 0xBF) : 0;
    Add(out, std::move(s));
    return;
  }
  const int32_t min_length = f.node >= 0 ? grammar_->node(f.node).min_length : 0;
  const int32_t max_length = f.node >= 0 ? grammar_->node(f.node).max_length : -1;
  if (byte == '"') {
    if (f.a < min_length) return;
    s.pop_back();
    Add(out, std::move(s));
    return;
  }
  if (byte < 0x20) return;  // control characters must be escaped
  const int32_t pending = byte < 0x80 ? 0 : Utf8Lead(byte);
  if (pending < 0) return;
  // A new code point starts (a character, or an escape): counted against the length bounds.
  if (max_length >= 0 && f.a >= max_length) return;
  ++f.a;
  if (byte == '\\') f.phase = kStrEscape;
  f.b = pending;
  Add(out, std::move(s));
}

void JsonMatcher::EndNumber(Stack s, int byte, Out& out) const {
  const Frame& f = s.back();
  const Node& node = grammar_->node(f.node);
  const bool complete = f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac ||
                        f.phase == kNumExpDigits;
  if (!complete) return;
  if (node.bounds.bounded() && !node.bounds.Contains((f.flags & kNegative) ? -f.x : f.x)) return;
  s.pop_back();
  Step(std::move(s), byte, out);
}

namespace {

// What one byte does to a number: it is taken, it ends the number (which the parent then
// reads), or it is refused. Split by the part of the number the frame is in.
enum class NumberStep { kTaken, kEnds, kRefused };

NumberStep IntegerPart(Frame& f, int byte, bool integer, bool bounded) {
  const int digit = IsDigit(byte) ? byte - '0' : -1;
  if (f.phase == kNumStart && byte == '-') {
    f.flags |= kNegative;
    f.phase = kNumSign;
    return NumberStep::kTaken;
  }
  if (f.phase == kNumStart || f.phase == kNumSign) {
    if (digit < 0) return NumberStep::kRefused;
    f.phase = digit == 0 ? kNumZero : kNumInt;  // no leading zeros: "0" takes no digit
    f.a = 1;
    f.x = digit;
    return NumberStep::kTaken;
  }
  if (digit >= 0 && f.phase == kNumInt && f.a < kMaxIntDigits) {
    ++f.a;
    f.x = f.x * 10 + digit;
  } else if (byte == '.' && !integer) {
    f.phase = kNumDot;
  } else if ((byte == 'e' || byte == 'E') && !integer && !bounded) {
    f.phase = kNumExp;
  } else {
    return NumberStep::kEnds;
  }
  return NumberStep::kTaken;
}

NumberStep FractionPart(Frame& f, int byte, bool bounded) {
  if (IsDigit(byte) && f.b < kMaxFracDigits) {
    ++f.b;
    f.x += (byte - '0') * std::pow(10.0, -f.b);
    f.phase = kNumFrac;
    return NumberStep::kTaken;
  }
  if (f.phase == kNumDot) return NumberStep::kRefused;  // "1." needs a digit
  if ((byte == 'e' || byte == 'E') && !bounded) {
    f.phase = kNumExp;
    return NumberStep::kTaken;
  }
  return NumberStep::kEnds;
}

NumberStep ExponentPart(Frame& f, int byte) {
  if (f.phase == kNumExp && (byte == '+' || byte == '-')) {
    f.phase = kNumExpSign;
    return NumberStep::kTaken;
  }
  if (f.phase != kNumExpDigits) {
    if (!IsDigit(byte)) return NumberStep::kRefused;
    f.phase = kNumExpDigits;
    f.ws = 1;  // exponent digits so far
    return NumberStep::kTaken;
  }
  if (IsDigit(byte) && f.ws < kMaxExpDigits) {
    ++f.ws;
    return NumberStep::kTaken;
  }
  return NumberStep::kEnds;
}

}  // namespace

void JsonMatcher::StepNumber(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  const Node& node = grammar_->node(f.node);
  const bool bounded = node.bounds.bounded();
  NumberStep step = NumberStep::kRefused;
  // The phases are declared in the order a number is written.
  if (f.phase <= kNumInt) {
    step = IntegerPart(f, byte, node.kind == NodeKind::kInteger, bounded);
  } else if (f.phase <= kNumFrac) {
    step = FractionPart(f, byte, bounded);
  } else {
    step = ExponentPart(f, byte);
  }
  if (step == NumberStep::kEnds) return EndNumber(std::move(s), byte, out);
  if (step == NumberStep::kRefused) return;
  if (bounded && !NumberViable(f, node)) return;
  Add(out, std::move(s));
}

void JsonMatcher::StepLiteral(Stack s, int byte, Out& out) const {
  Frame& f = s.back();
  const ByteTrie& trie = grammar_->node(f.node).literals;
  const int32_t child =
      byte == kEndOfText ? ByteTrie::kNone : trie.Child(f.a, static_cast<uint8_t>(byte));
  if (child == ByteTrie::kNone) {
    // The literal may have ended before this byte (an enum of 1 and 12, at "1").
    if (trie.Terminal(f.a) == ByteTrie::kNone || f.a == ByteTrie::kRoot) return;
    s.pop_back();
    Step(std::move(s), byte, out);
    return;
  }
  f.a = child;
  if (trie.Terminal(child) != ByteTrie::kNone && !trie.HasChildren(child)) s.pop_back();
  Add(out, std::move(s));
}

}  // namespace winnow::structured
