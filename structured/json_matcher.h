// The pushdown automaton of a Grammar over bytes: a MatchState is the set of stacks the bytes
// so far can be in (a set because anyOf alternatives may share a prefix: two object schemas
// both start with '{'), and Feed advances every stack by one byte, dropping those that reject
// it. The output it accepts is JSON that validates against the schema, with these limits of
// the generator (docs/api.md, "Structured output"): at most kMaxWhitespace bytes of
// whitespace between tokens, containers nested at most kMaxDepth deep, numbers of at most
// kMaxIntDigits integer, kMaxFracDigits fraction and kMaxExpDigits exponent digits (no exponent
// where bounded),
// strings valid UTF-8 without \u escapes of lone surrogates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "structured/grammar.h"

namespace winnow::structured {

inline constexpr int kEndOfText = 256;  // Feed's pseudo-byte: the output ends here
inline constexpr int kMaxWhitespace = 20;
inline constexpr int kMaxDepth = 32;
inline constexpr int kMaxIntDigits = 18;
inline constexpr int kMaxFracDigits = 18;
// Two exponent digits keep every number a finite double (JSON parsers overflow on 1e400).
inline constexpr int kMaxExpDigits = 2;

enum class FrameKind : uint8_t {
  kDone, kValue, kObject, kArray, kString, kNumber, kLiteral, kSequence
};

// One level of a stack. The meaning of phase, a and b depends on the kind (json_matcher.cc).
struct Frame {
  FrameKind kind = FrameKind::kDone;
  uint8_t phase = 0;
  uint8_t ws = 0;     // whitespace bytes in the current gap (number: exponent digits)
  uint8_t flags = 0;  // number: negative
  int32_t node = -1;  // grammar node; -1 for an object's undeclared key (any string)
  int32_t a = 0;
  int32_t b = 0;
  double x = 0.0;     // number: magnitude so far

  bool operator==(const Frame&) const = default;
};

using Stack = absl::InlinedVector<Frame, 8>;

struct MatchState {
  absl::InlinedVector<Stack, 2> stacks;

  bool empty() const { return stacks.empty(); }
  // Bytes that identify the state: equal keys, equal futures (the mask cache's key).
  std::string Key() const;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {}

  // Nothing read yet.
  MatchState Initial() const;
  // `in` advanced by `byte` (0..255, or kEndOfText) into `out`; false (and `out` empty) when
  // every stack rejects it.
  bool Feed(const MatchState& in, int byte, MatchState* out) const;
  // Feeds `bytes` in order; false if one is rejected (then `state` is empty).
  bool FeedAll(MatchState& state, std::string_view bytes) const;
  // Whether the output may end here: a complete value.
  bool CanEnd(const MatchState& state) const;

  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }

 private:
  using Out = absl::InlinedVector<Stack, 2>;
  void Step(Stack s, int byte, Out& out) const;
  // `expansions` counts the anyOf/sequence nodes entered for this byte: a schema whose anyOf
  // reaches itself without a byte in between ({"$defs": {"a": {"anyOf": [{"$ref": ...a}]}}})
  // is cut there instead of recursing forever.
  void StartValue(Stack s, int32_t node, int byte, Out& out, int expansions = 0) const;
  void StepSequence(Stack s, int byte, Out& out, int expansions = 0) const;
  void StepObject(Stack s, int byte, Out& out) const;
  void StartKey(const Stack& s, Out& out) const;
  void StepArray(Stack s, int byte, Out& out) const;
  void StepString(Stack s, int byte, Out& out) const;
  void StepNumber(Stack s, int byte, Out& out) const;
  void StepLiteral(Stack s, int byte, Out& out) const;
  // A number that cannot take `byte` ends before it, if it may end here.
  void EndNumber(Stack s, int byte, Out& out) const;

  std::shared_ptr<const Grammar> grammar_;
};

}  // namespace winnow::structured
