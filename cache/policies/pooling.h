// The score shaping SnapKV introduced and most policies share: a 1-D pooling of each head's
// scores along the keys, and how a GQA group's query heads fold into their KV head's score.
// Apart from scoring_helpers.h so that the scoring seam (cache/scoring_backend.h) can name them.
#pragma once

namespace winnow::cache::policies {

// How the query heads of a GQA group are folded into their KV head's score.
enum class GroupAggregation { kSum, kMean, kMax };

enum class Pooling { kNone, kAvg, kMax };

}  // namespace winnow::cache::policies
