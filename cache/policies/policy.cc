#include "cache/policies/policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace winnow::cache::policies {

// ---------------------------------------------------------------------------------------------
// PromptLayout

bool PromptLayout::HasCompressibleSpans() const {
  for (const PromptSpan& span : spans) {
    if (IsCompressibleKind(span.kind) && span.end > span.begin) return true;
  }
  return false;
}

int32_t PromptLayout::LastCompressibleEnd() const {
  int32_t end = 0;
  for (const PromptSpan& span : spans) {
    if (IsCompressibleKind(span.kind)) end = std::max(end, span.end);
  }
  return end;
}

bool PromptLayout::IsCompressible(int32_t position) const {
  for (const PromptSpan& span : spans) {
    if (IsCompressibleKind(span.kind) && position >= span.begin && position < span.end) {
      return true;
    }
  }
  return false;
}

std::vector<int32_t> PromptLayout::CompressiblePositions() const {
  std::vector<int32_t> out;
  for (const PromptSpan& span : spans) {
    if (!IsCompressibleKind(span.kind)) continue;
    for (int32_t p = span.begin; p < span.end; ++p) out.push_back(p);
  }
  return out;
}

PromptLayout PromptLayout::Leading(int32_t n) const {
  PromptLayout out;
  out.num_tokens = std::min(n, num_tokens);
  for (const PromptSpan& span : spans) {
    if (span.end > num_tokens) {
      out.spans.push_back(span);
    } else if (span.begin < out.num_tokens) {
      out.spans.push_back({span.kind, span.begin, std::min(span.end, out.num_tokens)});
    }
  }
  return out;
}

absl::Status PromptLayout::Validate() const {
  int32_t previous_end = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const PromptSpan& span = spans[i];
    if (span.begin < previous_end || span.end <= span.begin || span.end > num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt span ", i, " [", span.begin, ", ", span.end,
          ") is empty, overlaps the previous one or lies outside the prompt of ", num_tokens,
          " tokens"));
    }
    previous_end = span.end;
  }
  return absl::OkStatus();
}

WindowRange ObservationWindow(const PromptLayout& layout, int32_t default_window,
                              int32_t min_window, int32_t max_window) {
  const int32_t n = layout.num_tokens;
  int32_t size = default_window;
  if (layout.HasCompressibleSpans()) {
    size = std::clamp(n - layout.LastCompressibleEnd(), min_window,
                      std::max(min_window, max_window));
  }
  size = std::clamp(size, 1, std::max(1, n));
  return WindowRange{n - size, n};
}

// ---------------------------------------------------------------------------------------------
// PolicyConfig

namespace {

// The API field a value came from: numbers travel in params, strings in options.
std::string ParamField(const std::string& name, const PolicyParam& value) {
  return absl::StrCat(std::holds_alternative<double>(value) ? "compression.params."
                                                           : "compression.options.",
                      name);
}

absl::Status Invalid(const std::string& name, const PolicyParam& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(ParamField(name, value), ": ", why));
}

// The shortest text that reads back as the same double ("1048576", "0.1234567891"): StrCat's
// six significant digits would print a refused 1048576.5 as "1.04858e+06".
std::string FormatNumber(double value) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

// The number a numeric getter needs; a string means the client used the wrong map.
absl::StatusOr<double> NumberOf(const std::string& name, const PolicyParam& value,
                                const char* wants) {
  if (const double* number = std::get_if<double>(&value)) return *number;
  return Invalid(name, value,
                 absl::StrCat("\"", std::get<std::string>(value), "\" is a string, but ", name,
                              " takes ", wants, ": send it in compression.params"));
}

}  // namespace

PolicyParam ParsePolicyParam(std::string_view text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const std::from_chars_result r = std::from_chars(text.data(), end, value);
  if (!text.empty() && r.ec == std::errc() && r.ptr == end && std::isfinite(value)) return value;
  return std::string(text);
}

const PolicyParam* PolicyConfig::Find(const std::string& name) const {
  used_.insert(name);
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : &it->second;
}

absl::StatusOr<int64_t> PolicyConfig::GetInt(const std::string& name, int64_t default_value,
                                              int64_t min, int64_t max) const {
  const PolicyParam* param = Find(name);
  if (param == nullptr) return default_value;
  WINNOW_ASSIGN_OR_RETURN(const double value, NumberOf(name, *param, "an integer"));
  if (!std::isfinite(value) || value != std::trunc(value)) {
    return Invalid(name, *param, absl::StrCat(FormatNumber(value), " is not an integer"));
  }
  // The 2^63 bound keeps the cast below defined whatever min and max are.
  if (value < static_cast<double>(min) || value > static_cast<double>(max) ||
      std::abs(value) >= 0x1p63) {
    return Invalid(name, *param,
                   absl::StrCat(FormatNumber(value), " is outside [", min, ", ", max, "]"));
  }
  return static_cast<int64_t>(value);
}

absl::StatusOr<double> PolicyConfig::GetDouble(const std::string& name, double default_value,
                                               double min, double max) const {
  const PolicyParam* param = Find(name);
  if (param == nullptr) return default_value;
  WINNOW_ASSIGN_OR_RETURN(const double value, NumberOf(name, *param, "a number"));
  if (!std::isfinite(value)) {
    return Invalid(name, *param, absl::StrCat(FormatNumber(value), " is not a finite number"));
  }
  if (value < min || value > max) {
    return Invalid(name, *param,
                   absl::StrCat(FormatNumber(value), " is outside [", FormatNumber(min), ", ",
                                FormatNumber(max), "]"));
  }
  return value;
}

absl::StatusOr<bool> PolicyConfig::GetBool(const std::string& name, bool default_value) const {
  const PolicyParam* param = Find(name);
  if (param == nullptr) return default_value;
  // Both maps are accepted: a client holding a params map sends flags as 0/1 numbers.
  if (const double* number = std::get_if<double>(param)) {
    if (*number == 1.0) return true;
    if (*number == 0.0) return false;
    return Invalid(name, *param,
                   absl::StrCat(FormatNumber(*number), " is not a boolean (0 or 1 here, or "
                                "\"true\"/\"false\" in compression.options)"));
  }
  const std::string& text = std::get<std::string>(*param);
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "1") return true;
  if (lower == "false" || lower == "0") return false;
  return Invalid(name, *param, absl::StrCat("\"", text, "\" is not true/false"));
}

absl::StatusOr<std::string> PolicyConfig::GetEnum(const std::string& name,
                                                  const std::string& default_value,
                                                  const std::vector<std::string>& allowed) const {
  const PolicyParam* param = Find(name);
  if (param == nullptr) return default_value;
  const std::string choices = absl::StrJoin(allowed, ", ");
  if (const double* number = std::get_if<double>(param)) {
    return Invalid(name, *param,
                   absl::StrCat(FormatNumber(*number), " is a number, but ", name,
                                " takes one of ", choices, ": send it in compression.options"));
  }
  const std::string& text = std::get<std::string>(*param);
  if (std::find(allowed.begin(), allowed.end(), text) != allowed.end()) return text;
  return Invalid(name, *param, absl::StrCat("\"", text, "\" is not one of ", choices));
}

absl::Status PolicyConfig::CheckAllUsed(const std::string& policy_name) const {
  std::vector<std::string> unknown;
  for (const auto& [name, value] : params_) {
    if (!used_.contains(name)) unknown.push_back(name);
  }
  if (unknown.empty()) return absl::OkStatus();
  std::sort(unknown.begin(), unknown.end());
  std::vector<std::string> known(used_.begin(), used_.end());
  std::sort(known.begin(), known.end());
  return Invalid(unknown[0], params_.at(unknown[0]),
                 absl::StrCat("unknown parameter for policy ", policy_name, " (known: ",
                              known.empty() ? std::string("none") : absl::StrJoin(known, ", "),
                              ")"));
}

// ---------------------------------------------------------------------------------------------
// SlotPositions

SlotPositions::SlotPositions(int32_t num_layers, int32_t num_kv_heads)
    : num_kv_heads_(num_kv_heads),
      heads_(num_layers, std::vector<std::vector<int32_t>>(num_kv_heads)) {}

void SlotPositions::AppendRange(int32_t first, int32_t count) {
  for (auto& layer : heads_) {
    for (auto& head : layer) {
      for (int32_t i = 0; i < count; ++i) head.push_back(first + i);
    }
  }
}

void SlotPositions::Apply(const KeepPlan& plan) {
  for (size_t l = 0; l < plan.layers.size() && l < heads_.size(); ++l) {
    const LayerKeep& keep = plan.layers[l];
    if (keep.untouched()) continue;
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      std::vector<int32_t>& positions = heads_[l][h];
      std::vector<int32_t> kept;
      kept.reserve(keep.heads[h].size());
      for (int32_t slot : keep.heads[h]) kept.push_back(positions[slot]);
      positions = std::move(kept);
    }
  }
}

void SlotPositions::Clear() {
  for (auto& layer : heads_) {
    for (auto& head : layer) head.clear();
  }
}

// ---------------------------------------------------------------------------------------------
// CompressionPolicy

int64_t CompressionPolicy::SteadyStateSlots(int32_t prompt_tokens, int32_t generated) const {
  const double kept = std::floor(config_.budget() * prompt_tokens + 1e-6);
  const int64_t per_layer =
      std::clamp<int64_t>(static_cast<int64_t>(kept), 1, std::max(1, prompt_tokens));
  return int64_t{context_.dims.num_layers} * (per_layer + generated);
}

}  // namespace winnow::cache::policies
