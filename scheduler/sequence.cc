#include "scheduler/sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
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
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens,
    int32_t stage) {
  cache::policies::PolicyContext context;
  context.dims = dims;
  context.layout.num_tokens = num_tokens;
  context.layout.spans = req.prompt_spans;
  int32_t begin = 0;
  // A context-scoped policy sees its context only, a stage's its own tokens.
  if (req.compression.context_tokens > 0) {
    begin = req.compression.StageBegin(stage);
    context.layout = context.layout.Leading(req.compression.StageEnd(stage));
    if (begin > 0) {
      cache::policies::PromptLayout own;
      own.num_tokens = context.layout.num_tokens - begin;
      for (const cache::policies::PromptSpan& span : context.layout.spans) {
        if (span.end <= begin) continue;
        own.spans.push_back({span.kind, std::max(span.begin, begin) - begin, span.end - begin});
      }
      context.layout = std::move(own);
    }
  }
  WINNOW_ASSIGN_OR_RETURN(
      std::unique_ptr<cache::CompressionSession> session,
      cache::CompressionSession::Create(
          req.compression.policy,
          cache::policies::PolicyConfig(req.compression.budget, req.compression.params),
          context, begin));
  if (session != nullptr && req.compression.probe == ContextProbe::kRepeat) {
    WINNOW_RETURN_IF_ERROR(session->SetProbe(req.compression.stage_probes.at(stage)));
  }
  return session;
}

absl::StatusOr<std::vector<std::unique_ptr<cache::CompressionSession>>> MakeStageSessions(
    const cache::policies::ModelDims& dims, const GenerationRequest& req, int32_t num_tokens) {
  std::vector<std::unique_ptr<cache::CompressionSession>> sessions(req.compression.num_stages());
  for (int32_t i = 1; i < req.compression.num_stages(); ++i) {
    WINNOW_ASSIGN_OR_RETURN(sessions[i], MakeCompressionSession(dims, req, num_tokens, i));
    if (sessions[i] == nullptr) return absl::InternalError("compression: stages without a policy");
    WINNOW_RETURN_IF_ERROR(sessions[i]->CheckStaged());
  }
  return sessions;
}

absl::Status Sequence::StartStage(int32_t next, const cache::policies::SlotPositions& history) {
  std::unique_ptr<cache::CompressionSession>& session = stage_sessions.at(next);
  if (session == nullptr) return absl::InternalError("compression: a stage started twice");
  WINNOW_RETURN_IF_ERROR(session->StartAfter(history, kv));
  if (compression != nullptr) {
    compression_blocks_freed += compression->stats().blocks_freed;
    compression_slots_evicted += compression->stats().slots_evicted;
  }
  compression = std::move(session);
  stage = next;
  return absl::OkStatus();
}

absl::Status Sequence::AdoptStages(int32_t last, const cache::policies::SlotPositions& positions) {
  if (last == stage) return compression->AdoptCompressed(positions, kv);
  std::unique_ptr<cache::CompressionSession>& session = stage_sessions.at(last);
  if (session == nullptr) return absl::InternalError("compression: a stage adopted twice");
  WINNOW_RETURN_IF_ERROR(session->AdoptCompressed(positions, kv));
  compression = std::move(session);
  stage = last;
  return absl::OkStatus();
}

ProbeFrame ChatProbeFrame(const model::ChatTemplate& chat) {
  constexpr const char* kMark = "\x01probe\x01";
  const std::vector<model::ChatMessage> one = {{"user", "A"}};
  const std::vector<model::ChatMessage> two = {{"user", "A"}, {"user", kMark}};
  const absl::StatusOr<std::string> shorter = chat.Apply(one, /*add_generation_prompt=*/false);
  const absl::StatusOr<std::string> longer = chat.Apply(two, /*add_generation_prompt=*/true);
  if (!shorter.ok() || !longer.ok() || !absl::StartsWith(*longer, *shorter)) return {};
  const std::string turn = longer->substr(shorter->size());
  const size_t mark = turn.find(kMark);
  if (mark == std::string::npos) return {};
  return {turn.substr(0, mark), turn.substr(mark + std::string(kMark).size())};
}

absl::StatusOr<std::vector<cache::ProbeSegment>> RepeatProbeSegments(
    const model::Tokenizer& tokenizer, std::span<const int32_t> context, int32_t segment_tokens,
    const ProbeFrame& frame) {
  auto encode = [&tokenizer](const std::string& text) {
    return tokenizer.Encode(text, /*add_special=*/false, /*parse_special=*/true);
  };
  const std::vector<int32_t> first =
      encode(frame.before + "Repeat the previous context exactly." + frame.after);
  const std::vector<int32_t> later =
      encode(frame.before + "Repeat the part of the previous context exactly, starting with");
  const std::vector<int32_t> after = encode(frame.after);
  const size_t longest = std::max(first.size(), later.size() + kRepeatProbeAnchor + after.size());
  if (segment_tokens <= static_cast<int32_t>(longest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a repeat segment of ", segment_tokens, " tokens cannot hold its instruction (",
        longest, " tokens) and a piece of the context"));
  }
  const size_t piece = static_cast<size_t>(segment_tokens) - longest;
  std::vector<cache::ProbeSegment> segments;
  for (size_t at = 0; at < context.size(); at += piece) {
    const size_t size = std::min(piece, context.size() - at);
    cache::ProbeSegment& segment = segments.emplace_back();
    segment.scored_begin = static_cast<int32_t>(at);
    segment.scored_end = static_cast<int32_t>(at + size);
    std::vector<int32_t>& tokens = segment.tokens;
    if (at == 0) {
      tokens = first;
    } else {
      // The previous piece's last tokens tell the model where in the context to start.
      tokens = later;
      const size_t anchor = std::min<size_t>(kRepeatProbeAnchor, at);
      tokens.insert(tokens.end(), context.begin() + (at - anchor), context.begin() + at);
      tokens.insert(tokens.end(), after.begin(), after.end());
    }
    tokens.insert(tokens.end(), context.begin() + at, context.begin() + at + size);
  }
  return segments;
}

uint64_t CompressedContextKey(const GenerationRequest& req, int32_t hidden, int32_t stage) {
  const int32_t n = req.compression.StageEnd(stage);
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
  if (req.compression.probe == ContextProbe::kRepeat) {
    inputs += "probe=repeat";  // and where its segments cut the stage
    for (const cache::ProbeSegment& s : req.compression.stage_probes.at(stage)) {
      absl::StrAppendFormat(&inputs, ":%d", s.scored_end);
    }
    inputs += "|";
  }
  // A context compressed in stages is another cache than the same tokens compressed at once.
  for (int32_t i = 0; i < stage; ++i) {
    absl::StrAppendFormat(&inputs, "stage%d|", req.compression.StageEnd(i));
  }
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
