#include "scheduler/sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cache/compressed_prefix.h"
#include "model/model.h"

namespace winnow::scheduler {

Sequence::Sequence(GenerationRequest request, int32_t num_layers, int32_t block_size)
    : req(std::move(request)), kv(num_layers, block_size), sampler(req.sampling) {
  tokens = req.prompt_tokens;
  prompt_len = num_tokens();
  tokens.reserve(int64_t{prompt_len} + req.max_tokens);
  emb_prefix.resize(prompt_len + 1);
  std::vector<int32_t> prompt_ids;  // what the repetition penalty sees: tokens, not embeddings
  prompt_ids.reserve(prompt_len);
  for (int32_t i = 0; i < prompt_len; ++i) {
    const bool embedding = tokens[i] == model::kEmbeddingInput;
    emb_prefix[i + 1] = emb_prefix[i] + (embedding ? 1 : 0);
    if (!embedding) prompt_ids.push_back(tokens[i]);
  }
  sampler.AddPromptTokens(prompt_ids);
}

int32_t Sequence::CacheablePrefix() const {
  if (req.prompt_logprobs >= 0) return 0;  // every prompt row's logits are needed
  int32_t limit = num_tokens() - 1;
  if (awaits_compression()) limit = std::min(limit, compression->FirstObservedPosition());
  return std::max(limit, 0);
}

bool ScheduledBefore(const Sequence* a, const Sequence* b) {
  if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
  return a->arrival < b->arrival;
}

absl::StatusOr<std::unique_ptr<cache::CompressionSession>> MakeCompressionSession(
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens) {
  cache::policies::PolicyContext context;
  context.dims = dims;
  context.layout.num_tokens = num_tokens;
  context.layout.spans = req.prompt_spans;
  // A context-scoped policy sees its context only.
  if (req.compression.context_tokens > 0) {
    context.layout = context.layout.Leading(req.compression.context_tokens);
  }
  WINNOW_ASSIGN_OR_RETURN(
      std::unique_ptr<cache::CompressionSession> session,
      cache::CompressionSession::Create(
          req.compression.policy,
          cache::policies::PolicyConfig(req.compression.budget, req.compression.params),
          context));
  if (session != nullptr && req.compression.probe == ContextProbe::kRepeat) {
    WINNOW_RETURN_IF_ERROR(session->SetProbe(req.compression.probe_segments));
  }
  return session;
}

std::vector<std::vector<int32_t>> RepeatProbeSegments(const model::Tokenizer& tokenizer,
                                                      std::span<const int32_t> context) {
  const std::vector<int32_t> instruction = tokenizer.Encode(
      "\n\nRepeat the previous context:\n", /*add_special=*/false, /*parse_special=*/false);
  const size_t piece = std::max<size_t>(1, kRepeatProbeSegment - instruction.size());
  std::vector<std::vector<int32_t>> segments;
  for (size_t at = 0; at < context.size(); at += piece) {
    std::vector<int32_t>& segment = segments.emplace_back(instruction);
    const std::span<const int32_t> part = context.subspan(at, std::min(piece, context.size() - at));
    segment.insert(segment.end(), part.begin(), part.end());
  }
  return segments;
}

uint64_t CompressedContextKey(const GenerationRequest& req, int32_t hidden) {
  const int32_t n = req.compression.context_tokens;
  const std::span<const int32_t> tokens = std::span<const int32_t>(req.prompt_tokens).first(n);
  int64_t rows = 0;
  for (int32_t id : tokens) rows += id == model::kEmbeddingInput ? 1 : 0;
  // The plan's inputs as text no two different inputs share: numbers in hex-float (exact),
  // strings length-prefixed, params in name order.
  std::string inputs = absl::StrFormat("%d:%s|%a|", req.compression.policy.size(),
                                       req.compression.policy, req.compression.budget);
  std::vector<std::pair<std::string, cache::policies::PolicyParam>> params(
      req.compression.params.begin(), req.compression.params.end());
  std::sort(params.begin(), params.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [name, value] : params) {
    absl::StrAppendFormat(&inputs, "%d:%s=", name.size(), name);
    if (const double* number = std::get_if<double>(&value)) {
      absl::StrAppendFormat(&inputs, "n%a|", *number);
    } else {
      const std::string& text = std::get<std::string>(value);
      absl::StrAppendFormat(&inputs, "s%d:%s|", text.size(), text);
    }
  }
  if (req.compression.probe == ContextProbe::kRepeat) inputs += "probe=repeat|";
  cache::policies::PromptLayout layout;
  layout.num_tokens = static_cast<int32_t>(req.prompt_tokens.size());
  layout.spans = req.prompt_spans;
  for (const cache::policies::PromptSpan& span : layout.Leading(n).spans) {
    absl::StrAppendFormat(&inputs, "span%d:%d-%d|", static_cast<int>(span.kind), span.begin,
                          span.end);
  }
  return cache::CompressedPrefixCache::Key(
      tokens, std::span<const float>(req.embeddings).first(rows * hidden), hidden,
      req.cache_salt, inputs);
}

}  // namespace winnow::scheduler
