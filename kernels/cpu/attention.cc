#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"

namespace winnow::kernels {
namespace {

struct WorkItem {
  int32_t sequence;
  int32_t token;  // index among the sequence's new tokens
  int32_t kv_head;
};

// Attention of one token's query heads that share `kv_head` (a GQA group). Two passes over the
// visible keys: scores and their max, then exp-weights applied to V. Scores live in a
// thread-local buffer; visible keys are at most the context length.
void AttendGroup(const PagedKvView& kv, const AttentionSequence& seq, int32_t token,
                 int32_t kv_head, int32_t group, const float* q, float scale, float* out,
                 std::vector<float>& scores) {
  const int32_t head_dim = kv.head_dim;
  const int32_t visible = seq.num_slots - seq.num_new + token + 1;
  scores.resize(static_cast<size_t>(group) * visible);

  for (int32_t g = 0; g < group; ++g) {
    const float* qh = q + static_cast<int64_t>(g) * head_dim;
    float* s = scores.data() + static_cast<int64_t>(g) * visible;
    for (int32_t start = 0; start < visible; start += kv.block_size) {
      const float* keys = kv.Keys(seq.block_table[start / kv.block_size], kv_head);
      const int32_t n = std::min(kv.block_size, visible - start);
      for (int32_t j = 0; j < n; ++j) {
        s[start + j] = Dot(qh, keys + static_cast<int64_t>(j) * head_dim, head_dim) * scale;
      }
    }
  }

  for (int32_t g = 0; g < group; ++g) {
    float* s = scores.data() + static_cast<int64_t>(g) * visible;
    float* o = out + static_cast<int64_t>(g) * head_dim;
    const float max_score = *std::max_element(s, s + visible);
    double sum = 0.0;
    for (int32_t j = 0; j < visible; ++j) {
      s[j] = std::exp(s[j] - max_score);
      sum += s[j];
    }
    const float inv_sum = static_cast<float>(1.0 / sum);
    std::fill(o, o + head_dim, 0.0f);
    for (int32_t start = 0; start < visible; start += kv.block_size) {
      const float* values = kv.Values(seq.block_table[start / kv.block_size], kv_head);
      const int32_t n = std::min(kv.block_size, visible - start);
      for (int32_t j = 0; j < n; ++j) {
        Axpy(s[start + j] * inv_sum, values + static_cast<int64_t>(j) * head_dim, o, head_dim);
      }
    }
  }
}

}  // namespace

void PagedAttention(const PagedKvView& kv, std::span<const AttentionSequence> sequences,
                    const float* q, int32_t num_heads, float scale, float* out,
                    ThreadPool& pool) {
  const int32_t group = num_heads / kv.num_kv_heads;
  std::vector<WorkItem> items;
  for (int32_t s = 0; s < static_cast<int32_t>(sequences.size()); ++s) {
    for (int32_t t = 0; t < sequences[s].num_new; ++t) {
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) items.push_back({s, t, h});
    }
  }
  // Later tokens of a prefill chunk see more keys, so contiguous chunks would leave the thread
  // with the tail doing most of the work; each thread takes every T-th item instead.
  const int64_t row_floats = static_cast<int64_t>(num_heads) * kv.head_dim;
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t stride = std::min<int64_t>(pool.num_threads(), num_items);
  pool.ParallelFor(stride, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t lane = begin; lane < end; ++lane) {
      for (int64_t i = lane; i < num_items; i += stride) {
        const WorkItem& item = items[i];
        const AttentionSequence& seq = sequences[item.sequence];
        const int64_t row = seq.first_row + item.token;
        const int64_t head_offset = static_cast<int64_t>(item.kv_head) * group * kv.head_dim;
        AttendGroup(kv, seq, item.token, item.kv_head, group,
                    q + row * row_floats + head_offset, scale,
                    out + row * row_floats + head_offset, scores);
      }
    }
  });
}

}  // namespace winnow::kernels
