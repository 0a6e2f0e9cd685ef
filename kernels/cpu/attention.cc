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

// The slots new token `token` attends to, as a list, for the sparse path: the selected past slots
// then the new tokens up to itself.
void SparseVisible(const AttentionSequence& seq, int32_t token, std::vector<int32_t>& slots) {
  const int32_t past = seq.num_slots - seq.num_new;
  slots.assign(seq.selected, seq.selected + seq.num_selected);
  for (int32_t i = 0; i <= token; ++i) slots.push_back(past + i);
}

// Attention of one token's query heads that share `kv_head` (a GQA group). Two passes over the
// visible keys: scores and their max, then exp-weights applied to V. Scores live in a
// thread-local buffer; visible keys are at most the context length. `slots` (sparse path) lists
// the visible slots; when null, slots [0, visible) are.
void AttendGroup(const PagedKvView& kv, const AttentionSequence& seq, int32_t token,
                 int32_t kv_head, int32_t group, int32_t num_heads, const float* q, float scale,
                 float* out, const std::vector<int32_t>* slots, std::vector<float>& scores) {
  const int32_t head_dim = kv.head_dim;
  const int32_t visible = slots != nullptr ? static_cast<int32_t>(slots->size())
                                           : seq.num_slots - seq.num_new + token + 1;
  scores.resize(static_cast<size_t>(group) * visible);

  for (int32_t g = 0; g < group; ++g) {
    const float* qh = q + static_cast<int64_t>(g) * head_dim;
    float* s = scores.data() + static_cast<int64_t>(g) * visible;
    if (slots != nullptr) {
      for (int32_t j = 0; j < visible; ++j) {
        const int32_t slot = (*slots)[j];
        const float* key = kv.Keys(seq.block_table[slot / kv.block_size], kv_head) +
                           static_cast<int64_t>(slot % kv.block_size) * head_dim;
        s[j] = Dot(qh, key, head_dim) * scale;
      }
      continue;
    }
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
    if (slots != nullptr) {
      for (int32_t j = 0; j < visible; ++j) {
        const int32_t slot = (*slots)[j];
        const float* value = kv.Values(seq.block_table[slot / kv.block_size], kv_head) +
                             static_cast<int64_t>(slot % kv.block_size) * head_dim;
        Axpy(s[j] * inv_sum, value, o, head_dim);
      }
    } else {
      for (int32_t start = 0; start < visible; start += kv.block_size) {
        const float* values = kv.Values(seq.block_table[start / kv.block_size], kv_head);
        const int32_t n = std::min(kv.block_size, visible - start);
        for (int32_t j = 0; j < n; ++j) {
          Axpy(s[start + j] * inv_sum, values + static_cast<int64_t>(j) * head_dim, o,
               head_dim);
        }
      }
    }
    if (seq.probs != nullptr) {
      // This work item is the only writer of its (token, head) row.
      const int32_t h = kv_head * group + g;
      float* p = seq.probs + (static_cast<int64_t>(token) * num_heads + h) * seq.num_slots;
      for (int32_t j = 0; j < visible; ++j) {
        p[slots != nullptr ? (*slots)[j] : j] = s[j] * inv_sum;
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
    thread_local std::vector<int32_t> slots;
    for (int64_t lane = begin; lane < end; ++lane) {
      for (int64_t i = lane; i < num_items; i += stride) {
        const WorkItem& item = items[i];
        const AttentionSequence& seq = sequences[item.sequence];
        const int64_t row = seq.first_row + item.token;
        const int64_t head_offset = static_cast<int64_t>(item.kv_head) * group * kv.head_dim;
        const bool sparse = seq.selected != nullptr;
        if (sparse) SparseVisible(seq, item.token, slots);
        AttendGroup(kv, seq, item.token, item.kv_head, group, num_heads,
                    q + row * row_floats + head_offset, scale,
                    out + row * row_floats + head_offset, sparse ? &slots : nullptr, scores);
      }
    }
  });
}

}  // namespace winnow::kernels
