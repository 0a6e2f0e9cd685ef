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
// visible keys: scores and their max, then exp-weights applied to V. Each key and value block is
// converted to float32 once for the whole group (into `rows`, block_size x head_dim floats,
// unused for f32). Scores live in a thread-local buffer; visible keys are at most the context
// length. `slots` (sparse path) lists the visible slots; when null, slots [0, visible) are. Every
// output is the same sum in the same order whatever the dtype or loop nesting, so a token's
// result depends only on its own inputs.
void AttendGroup(const PagedKvView& kv, const AttentionSequence& seq, int32_t token,
                 int32_t kv_head, int32_t group, int32_t num_heads, const float* q, float scale,
                 float* out, const std::vector<int32_t>* slots, std::vector<float>& scores,
                 float* rows) {
  const int32_t head_dim = kv.head_dim;
  const int32_t visible = slots != nullptr ? static_cast<int32_t>(slots->size())
                                           : seq.num_slots - seq.num_new + token + 1;
  scores.resize(static_cast<size_t>(group) * visible);
  auto key_row = [&](int32_t j) {
    const int32_t slot = (*slots)[j];
    return kv.Row(kv.Keys(seq.block_table[slot / kv.block_size], kv_head),
                  slot % kv.block_size, rows);
  };
  auto value_row = [&](int32_t j) {
    const int32_t slot = (*slots)[j];
    return kv.Row(kv.Values(seq.block_table[slot / kv.block_size], kv_head),
                  slot % kv.block_size, rows);
  };

  if (slots != nullptr) {
    for (int32_t j = 0; j < visible; ++j) {
      const float* key = key_row(j);
      for (int32_t g = 0; g < group; ++g) {
        scores[static_cast<int64_t>(g) * visible + j] =
            Dot(q + static_cast<int64_t>(g) * head_dim, key, head_dim) * scale;
      }
    }
  } else {
    for (int32_t start = 0; start < visible; start += kv.block_size) {
      const int32_t n = std::min(kv.block_size, visible - start);
      const float* keys = kv.Rows(kv.Keys(seq.block_table[start / kv.block_size], kv_head), n,
                                  rows);
      for (int32_t g = 0; g < group; ++g) {
        const float* qh = q + static_cast<int64_t>(g) * head_dim;
        float* s = scores.data() + static_cast<int64_t>(g) * visible + start;
        for (int32_t j = 0; j < n; ++j) {
          s[j] = Dot(qh, keys + static_cast<int64_t>(j) * head_dim, head_dim) * scale;
        }
      }
    }
  }

  // Softmax weights, normalised in place.
  for (int32_t g = 0; g < group; ++g) {
    float* s = scores.data() + static_cast<int64_t>(g) * visible;
    const float max_score = *std::max_element(s, s + visible);
    double sum = 0.0;
    for (int32_t j = 0; j < visible; ++j) {
      s[j] = std::exp(s[j] - max_score);
      sum += s[j];
    }
    const float inv_sum = static_cast<float>(1.0 / sum);
    for (int32_t j = 0; j < visible; ++j) s[j] *= inv_sum;
    std::fill(out + static_cast<int64_t>(g) * head_dim,
              out + static_cast<int64_t>(g + 1) * head_dim, 0.0f);
  }

  if (slots != nullptr) {
    for (int32_t j = 0; j < visible; ++j) {
      const float* value = value_row(j);
      for (int32_t g = 0; g < group; ++g) {
        Axpy(scores[static_cast<int64_t>(g) * visible + j], value,
             out + static_cast<int64_t>(g) * head_dim, head_dim);
      }
    }
  } else {
    for (int32_t start = 0; start < visible; start += kv.block_size) {
      const int32_t n = std::min(kv.block_size, visible - start);
      const float* values = kv.Rows(kv.Values(seq.block_table[start / kv.block_size], kv_head),
                                    n, rows);
      for (int32_t g = 0; g < group; ++g) {
        const float* s = scores.data() + static_cast<int64_t>(g) * visible + start;
        float* o = out + static_cast<int64_t>(g) * head_dim;
        for (int32_t j = 0; j < n; ++j) {
          Axpy(s[j], values + static_cast<int64_t>(j) * head_dim, o, head_dim);
        }
      }
    }
  }

  if (seq.probs != nullptr) {
    for (int32_t g = 0; g < group; ++g) {
      // This work item is the only writer of its (token, head) row.
      const int32_t h = kv_head * group + g;
      const float* s = scores.data() + static_cast<int64_t>(g) * visible;
      float* p = seq.probs + (static_cast<int64_t>(token) * num_heads + h) * seq.num_slots;
      for (int32_t j = 0; j < visible; ++j) p[slots != nullptr ? (*slots)[j] : j] = s[j];
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
    thread_local std::vector<float> rows;
    rows.resize(static_cast<size_t>(kv.block_size) * kv.head_dim);
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
                    out + row * row_floats + head_offset, sparse ? &slots : nullptr, scores,
                    rows.data());
      }
    }
  });
}

}  // namespace winnow::kernels
