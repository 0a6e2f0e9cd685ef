#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace winnow::model {
namespace {

constexpr int32_t kMaxTopLogprobs = 20;

absl::Status OutOfRange(const std::string& field, double value, const std::string& rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling.", field, " = ", value, " is invalid: must be ", rule));
}

// Uniform double in [0, 1) from the top 53 bits: the same on every standard library, unlike
// std::uniform_real_distribution.
double UniformUnit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// How many of the `keep` candidates (probabilities highest first, summing to `total`) top-p
// keeps: the fewest whose share of the mass reaches `top_p`.
int32_t TopPKeep(const std::vector<double>& probs, double total, float top_p, int32_t keep) {
  double cumulative = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    cumulative += probs[i] / total;
    if (cumulative >= top_p) return i + 1;
  }
  return keep;
}

// How many min-p keeps: probs[0] is the largest; those at least min_p times as likely stay.
int32_t MinPKeep(const std::vector<double>& probs, float min_p, int32_t keep) {
  int32_t n = 1;
  while (n < keep && probs[n] >= min_p * probs[0]) ++n;
  return n;
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return OutOfRange("temperature", temperature, "a finite number >= 0");
  }
  if (top_k < 0) return OutOfRange("top_k", top_k, ">= 0 (0 disables it)");
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f) {
    return OutOfRange("top_p", top_p, "in (0, 1]");
  }
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f) {
    return OutOfRange("min_p", min_p, "in [0, 1]");
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return OutOfRange("repetition_penalty", repetition_penalty, "a finite number > 0");
  }
  if (!std::isfinite(frequency_penalty) || std::abs(frequency_penalty) > 2.0f) {
    return OutOfRange("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (!std::isfinite(presence_penalty) || std::abs(presence_penalty) > 2.0f) {
    return OutOfRange("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return OutOfRange("top_logprobs", top_logprobs, absl::StrCat("in [0, ", kMaxTopLogprobs, "]"));
  }
  return absl::OkStatus();
}

SampledToken ScoreToken(std::span<const float> logits, int32_t id, int32_t top,
                        std::optional<float> log_norm, std::vector<int32_t>* scratch) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  // Log-probabilities are under the model's own distribution (before penalties and
  // temperature), as vLLM reports raw logprobs. Each term is exp of a float <= 0 (float exp is
  // a fraction of double exp's cost over a 128k vocabulary); the sum is kept in double.
  if (!log_norm.has_value()) {
    const float max_raw = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float v : logits) sum += std::exp(v - max_raw);
    log_norm = max_raw + static_cast<float>(std::log(sum));
  }
  SampledToken result;
  result.id = id;
  result.logprob = logits[id] - *log_norm;
  if (top > 0) {
    const int32_t n = std::min(top, vocab);
    std::vector<int32_t> local;
    std::vector<int32_t>& order = scratch != nullptr ? *scratch : local;
    order.resize(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) {
      result.top_logprobs.emplace_back(order[i], logits[order[i]] - *log_norm);
    }
  }
  return result;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::AddPromptTokens(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) ++prompt_counts_[t];
}

SampledToken Sampler::Sample(std::span<const float> logits, std::optional<float> log_norm,
                             std::span<const uint64_t> allowed) {
  const bool adjusted = params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                        params_.presence_penalty != 0.0f || !params_.logit_bias.empty() ||
                        !allowed.empty();
  if (params_.temperature == 0.0f && !adjusted) {
    // Plain greedy reads the logits as they are: no working copy.
    const auto best = std::max_element(logits.begin(), logits.end());
    return Finish(logits, static_cast<int32_t>(best - logits.begin()), log_norm);
  }
  work_.assign(logits.begin(), logits.end());
  ApplyPenalties();
  if (!allowed.empty()) ApplyMask(allowed);
  int32_t chosen = 0;
  if (params_.temperature == 0.0f) {
    // Greedy; ties go to the lowest id so the choice never depends on iteration order.
    chosen = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    chosen = SampleWithTemperature();
  }
  return Finish(logits, chosen, log_norm);
}

void Sampler::ApplyMask(std::span<const uint64_t> allowed) {
  const int32_t vocab = static_cast<int32_t>(work_.size());
  for (int32_t id = 0; id < vocab; ++id) {
    if (!((allowed[id >> 6] >> (id & 63)) & 1)) work_[id] = -std::numeric_limits<float>::infinity();
  }
}

// Repetition (CTRL-style) over prompt and output, as transformers and vLLM do; frequency and
// presence (OpenAI-style) over output tokens only.
void Sampler::ApplyPenalties() {
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      float& v = work_[id];
      v = v > 0.0f ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    };
    for (const auto& [id, count] : prompt_counts_) penalize(id);
    for (const auto& [id, count] : output_counts_) {
      if (!prompt_counts_.contains(id)) penalize(id);
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      work_[id] -= params_.frequency_penalty * count + params_.presence_penalty;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < static_cast<int32_t>(work_.size())) work_[id] += bias;
  }
}

int32_t Sampler::SampleWithTemperature() {
  for (float& v : work_) v /= params_.temperature;
  int32_t keep = RankCandidates();
  // Masked tokens (-inf) are never candidates.
  while (keep > 1 && std::isinf(work_[order_[keep - 1]]) && work_[order_[keep - 1]] < 0) --keep;
  // Probabilities of the kept candidates, highest first.
  const float max_logit = work_[order_[0]];
  std::vector<double> probs(keep);
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(static_cast<double>(work_[order_[i]]) - max_logit);
    total += probs[i];
  }
  if (params_.top_p < 1.0f) keep = TopPKeep(probs, total, params_.top_p, keep);
  if (params_.min_p > 0.0f) keep = MinPKeep(probs, params_.min_p, keep);
  return Draw(probs, keep);
}

int32_t Sampler::RankCandidates() {
  const int32_t vocab = static_cast<int32_t>(work_.size());
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return work_[a] > work_[b] || (work_[a] == work_[b] && a < b);
  };
  // Top-k needs only the first k in order, which a partial sort gives for less.
  if (params_.top_k > 0 && params_.top_k < vocab) {
    std::partial_sort(order_.begin(), order_.begin() + params_.top_k, order_.end(), by_logit);
    return params_.top_k;
  }
  std::sort(order_.begin(), order_.end(), by_logit);
  return vocab;
}

int32_t Sampler::Draw(const std::vector<double>& probs, int32_t keep) {
  double kept_total = 0.0;
  for (int32_t i = 0; i < keep; ++i) kept_total += probs[i];
  double target = UniformUnit(rng_) * kept_total;
  // Rounding can leave `target` just short of zero after the last candidate: that one wins.
  int32_t chosen = order_[keep - 1];
  for (int32_t i = 0; i < keep; ++i) {
    target -= probs[i];
    if (target < 0.0) {
      chosen = order_[i];
      break;
    }
  }
  return chosen;
}

SampledToken Sampler::Finish(std::span<const float> logits, int32_t chosen,
                             std::optional<float> log_norm) {
  SampledToken result = ScoreToken(logits, chosen, params_.top_logprobs, log_norm, &order_);
  ++output_counts_[chosen];
  return result;
}

}  // namespace winnow::model
