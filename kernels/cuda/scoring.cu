#include "kernels/cuda/scoring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

using detail::kWarp;
using detail::ToFloat;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxPerLane = kMaxDeviceHeadDim / kWarp;

__device__ inline int32_t KvHeadOf(int32_t h, int32_t num_heads, int32_t num_kv_heads,
                                   bool gqa_mod) {
  return gqa_mod ? h % num_kv_heads : h / (num_heads / num_kv_heads);
}

__device__ inline int32_t ClampVisible(const int32_t* visible, int32_t r, int32_t num_slots) {
  return visible == nullptr ? num_slots : min(max(visible[r], 0), num_slots);
}

// Key row of slot j (a layer slot, through the block table).
template <typename KvT>
__device__ inline const KvT* KeyOf(const DevicePagedKv& kv, const int32_t* table, int32_t j,
                                   int32_t kv_head) {
  return detail::KvRow<KvT>(kv, table[j / kv.block_size], kv_head, j % kv.block_size, false);
}

// q . key over head_dim values, split across the warp's lanes; every lane gets the sum.
template <typename KvT, typename Q>
__device__ inline float WarpDot(const KvT* key, const Q* q, int32_t d) {
  float partial = 0.0f;
  for (int32_t c = threadIdx.x % kWarp; c < d; c += kWarp) {
    partial += ToFloat(key[c]) * ToFloat(q[c]);
  }
  return detail::WarpSum(partial);
}

// The query row of (row r, head h), copied to shared memory as float.
template <typename Q>
__device__ inline void LoadQuery(const Q* q, int32_t num_heads, int32_t d, int32_t r, int32_t h,
                                 float* out) {
  const Q* src = q + (int64_t{r} * num_heads + h) * d;
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x) out[c] = ToFloat(src[c]);
  __syncthreads();
}

// Pass 1 of the column sums and of the vote: ln sum_j exp(scale * q.k_j) over keys
// [key_begin, visible[r]) of one (row, head) per block, with a running max and sum per warp
// (online softmax), merged across warps at the end. Writes lse[h * num_rows + r].
template <typename Q, typename KvT>
__global__ void LogNormalizerKernel(DevicePagedKv kv, const int32_t* table, int32_t num_slots,
                                    const Q* q, int32_t num_rows, const int32_t* visible,
                                    int32_t num_heads, float scale, int32_t key_begin,
                                    bool gqa_mod, float* lse) {
  __shared__ float query[kMaxDeviceHeadDim];
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  const int32_t r = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t d = kv.head_dim;
  const int32_t end = ClampVisible(visible, r, num_slots);
  const int32_t kv_head = KvHeadOf(h, num_heads, kv.num_kv_heads, gqa_mod);
  LoadQuery(q, num_heads, d, r, h, query);
  const int32_t warp = threadIdx.x / kWarp;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  for (int32_t j = key_begin + warp; j < end; j += kWarps) {
    const float logit = WarpDot(KeyOf<KvT>(kv, table, j, kv_head), query, d) * scale;
    const float new_max = fmaxf(running_max, logit);
    running_sum = running_sum * expf(running_max - new_max) + expf(logit - new_max);
    running_max = new_max;
  }
  if (threadIdx.x % kWarp == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w]);
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum[w] > 0.0f) s += warp_sum[w] * expf(warp_max[w] - m);
    }
    lse[int64_t{h} * num_rows + r] = m + logf(s);  // -inf when the row sees no key
  }
}

// One block per (row, head): logits into the output row, then its log-sum-exp, then the
// probabilities in place.
template <typename Q, typename KvT>
__global__ void ProbabilitiesKernel(DevicePagedKv kv, DeviceScoreInput<Q> in, float* probs,
                                    float* log_normalizer) {
  __shared__ float query[kMaxDeviceHeadDim];
  __shared__ float reduce[kWarp];
  const int32_t r = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t d = kv.head_dim;
  const int32_t visible = ClampVisible(in.visible, r, in.num_slots);
  const int32_t kv_head = KvHeadOf(h, in.num_heads, kv.num_kv_heads, false);
  float* out = probs + (int64_t{h} * in.num_rows + r) * in.num_slots;
  LoadQuery(in.q, in.num_heads, d, r, h, query);
  float local_max = -INFINITY;
  for (int32_t j = threadIdx.x / kWarp; j < visible; j += kWarps) {
    const float logit = WarpDot(KeyOf<KvT>(kv, in.block_table, j, kv_head), query, d) * in.scale;
    if (threadIdx.x % kWarp == 0) out[j] = logit;
    local_max = fmaxf(local_max, logit);
  }
  // BlockReduce's barriers also make the logits written above visible to the whole block.
  const float max_logit = detail::BlockReduce<true>(local_max, reduce);
  float local_sum = 0.0f;
  for (int32_t j = threadIdx.x; j < visible; j += blockDim.x) local_sum += expf(out[j] - max_logit);
  const float lse = max_logit + logf(detail::BlockReduce<false>(local_sum, reduce));
  for (int32_t j = threadIdx.x; j < visible; j += blockDim.x) out[j] = expf(out[j] - lse);
  for (int32_t j = visible + threadIdx.x; j < in.num_slots; j += blockDim.x) out[j] = 0.0f;
  if (log_normalizer != nullptr && threadIdx.x == 0) {
    log_normalizer[int64_t{h} * in.num_rows + r] = lse;
  }
}

// Pass 2 of the column sums: one block per (key block of the layer, KV head). A warp owns one
// (key, query head of the group) column at a time, keeps the key in registers and sums every
// row's probability on it in row order.
template <typename Q, typename KvT>
__global__ void ColumnSumsKernel(DevicePagedKv kv, DeviceScoreInput<Q> in, const float* lse,
                                 float* column_sums) {
  const int32_t tile = blockIdx.x;
  const int32_t g = blockIdx.y;
  const int32_t d = kv.head_dim;
  const int32_t group = in.num_heads / kv.num_kv_heads;
  const int32_t start = tile * kv.block_size;
  const int32_t n = min(kv.block_size, in.num_slots - start);
  const int32_t lane = threadIdx.x % kWarp;
  for (int32_t item = threadIdx.x / kWarp; item < n * group; item += kWarps) {
    const int32_t j = start + item / group;
    const int32_t h = g * group + item % group;
    const KvT* key = KeyOf<KvT>(kv, in.block_table, j, g);
    float k[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int32_t c = lane + i * kWarp;
      k[i] = c < d ? ToFloat(key[c]) : 0.0f;
    }
    float sum = 0.0f;
    for (int32_t r = 0; r < in.num_rows; ++r) {
      if (j >= ClampVisible(in.visible, r, in.num_slots)) continue;  // uniform in the warp
      const Q* q = in.q + (int64_t{r} * in.num_heads + h) * d;
      float partial = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int32_t c = lane + i * kWarp;
        if (c < d) partial += k[i] * ToFloat(q[c]);
      }
      const float logit = detail::WarpSum(partial) * in.scale;
      const float p = expf(logit - lse[int64_t{h} * in.num_rows + r]);
      sum = in.column_max ? fmaxf(sum, p) : sum + p;
    }
    float& column = column_sums[int64_t{h} * in.num_slots + j];
    if (lane == 0) column = in.column_max ? fmaxf(column, sum) : column + sum;
  }
}

// Pass 2 of the vote: a warp per candidate, summing every head's probability in head order.
template <typename Q, typename KvT>
__global__ void VoteKernel(DevicePagedKv kv, const int32_t* table, const Q* query,
                           int32_t num_heads, int32_t begin, int32_t end, float scale,
                           bool gqa_mod, const float* lse, float* vote) {
  const int32_t d = kv.head_dim;
  const int64_t first_warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = int64_t{gridDim.x} * blockDim.x / kWarp;
  for (int64_t t = begin + first_warp; t < end; t += num_warps) {
    const int32_t j = static_cast<int32_t>(t);
    float v = 0.0f;
    for (int32_t h = 0; h < num_heads; ++h) {
      const KvT* key = KeyOf<KvT>(kv, table, j, KvHeadOf(h, num_heads, kv.num_kv_heads, gqa_mod));
      v += expf(WarpDot(key, query + int64_t{h} * d, d) * scale - lse[h]);
    }
    if (threadIdx.x % kWarp == 0) vote[j - begin] = v;
  }
}

template <typename Q>
absl::Status CheckScoreInput(const char* op, const DevicePagedKv& kv,
                             const DeviceScoreInput<Q>& in) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (in.num_heads <= 0 || in.num_heads % kv.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_heads ", in.num_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   kv.num_kv_heads));
  }
  if (in.num_slots <= 0 || in.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_slots (", in.num_slots,
                                                   ") must be positive and num_rows (",
                                                   in.num_rows, ") not negative"));
  }
  if (in.block_table == nullptr || in.q == nullptr || in.visible == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": block_table, q and visible are required"));
  }
  return absl::OkStatus();
}

// grid (ceil(num_slots / kWarps), num_kv_heads): warp w of block b takes slot b * kWarps + w.
template <typename KvT>
__global__ void ValueNormsKernel(DevicePagedKv kv, const int32_t* table, int32_t num_slots,
                                 float* norms) {
  const int32_t j = blockIdx.x * kWarps + threadIdx.x / kWarp;
  const int32_t g = blockIdx.y;
  if (j >= num_slots) return;
  const KvT* v = detail::KvRow<KvT>(kv, table[j / kv.block_size], g, j % kv.block_size, true);
  float partial = 0.0f;
  for (int32_t c = threadIdx.x % kWarp; c < kv.head_dim; c += kWarp) {
    const float x = ToFloat(v[c]);
    partial += x * x;
  }
  const float sum = detail::WarpSum(partial);
  if (threadIdx.x % kWarp == 0) norms[int64_t{g} * num_slots + j] = sqrtf(sum);
}

// Calls fn(KvT{}) with the storage type of the pool's dtype.
template <typename Fn>
void WithKvType(KvDtype dtype, Fn&& fn) {
  if (dtype == KvDtype::kF16) {
    fn(__half{});
  } else {
    fn(__nv_bfloat16{});
  }
}

}  // namespace

template <typename Q>
absl::Status AttentionProbabilities(const DevicePagedKv& kv, const DeviceScoreInput<Q>& in,
                                    float* probs, float* log_normalizer, cudaStream_t stream) {
  if (absl::Status s = CheckScoreInput("AttentionProbabilities", kv, in); !s.ok()) return s;
  if (in.num_rows == 0) return absl::OkStatus();
  const dim3 grid(in.num_rows, in.num_heads);
  WithKvType(kv.dtype, [&](auto tag) {
    ProbabilitiesKernel<Q, decltype(tag)><<<grid, kThreads, 0, stream>>>(kv, in, probs,
                                                                         log_normalizer);
  });
  return LastLaunchStatus("ProbabilitiesKernel");
}

template <typename Q>
absl::Status AccumulateAttentionColumns(const DevicePagedKv& kv, const DeviceScoreInput<Q>& in,
                                        float* column_sums, float* log_normalizer,
                                        cudaStream_t stream) {
  if (absl::Status s = CheckScoreInput("AccumulateAttentionColumns", kv, in); !s.ok()) return s;
  if (log_normalizer == nullptr) {
    return absl::InvalidArgumentError(
        "AccumulateAttentionColumns: log_normalizer scratch (num_heads x num_rows) is required");
  }
  if (in.num_rows == 0) return absl::OkStatus();
  const dim3 rows_grid(in.num_rows, in.num_heads);
  const dim3 tiles_grid((in.num_slots + kv.block_size - 1) / kv.block_size, kv.num_kv_heads);
  WithKvType(kv.dtype, [&](auto tag) {
    using KvT = decltype(tag);
    LogNormalizerKernel<Q, KvT><<<rows_grid, kThreads, 0, stream>>>(
        kv, in.block_table, in.num_slots, in.q, in.num_rows, in.visible, in.num_heads, in.scale,
        0, false, log_normalizer);
    ColumnSumsKernel<Q, KvT><<<tiles_grid, kThreads, 0, stream>>>(kv, in, log_normalizer,
                                                                   column_sums);
  });
  return LastLaunchStatus("LogNormalizerKernel/ColumnSumsKernel");
}

template <typename Q>
absl::Status TokenSelectVote(const DevicePagedKv& kv, const int32_t* block_table, const Q* query,
                             int32_t num_heads, int32_t begin, int32_t end, float scale,
                             bool gqa_mod, float* vote, float* log_normalizer,
                             cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (num_heads <= 0 || num_heads % kv.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TokenSelectVote: num_heads ", num_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   kv.num_kv_heads));
  }
  if (begin < 0 || end < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenSelectVote: candidates [", begin, ", ", end, ") are not a range"));
  }
  if (block_table == nullptr || query == nullptr || vote == nullptr || log_normalizer == nullptr) {
    return absl::InvalidArgumentError(
        "TokenSelectVote: block_table, query, vote and log_normalizer are required");
  }
  if (begin == end) return absl::OkStatus();
  const int64_t blocks = (int64_t{end - begin} + kWarps - 1) / kWarps;
  const unsigned vote_grid = static_cast<unsigned>(std::min<int64_t>(blocks, 1 << 16));
  WithKvType(kv.dtype, [&](auto tag) {
    using KvT = decltype(tag);
    LogNormalizerKernel<Q, KvT><<<dim3(1, num_heads), kThreads, 0, stream>>>(
        kv, block_table, end, query, 1, nullptr, num_heads, scale, begin, gqa_mod,
        log_normalizer);
    VoteKernel<Q, KvT><<<vote_grid, kThreads, 0, stream>>>(kv, block_table, query, num_heads,
                                                          begin, end, scale, gqa_mod,
                                                          log_normalizer, vote);
  });
  return LastLaunchStatus("LogNormalizerKernel/VoteKernel");
}

absl::Status ValueNorms(const DevicePagedKv& kv, const int32_t* block_table, int32_t num_slots,
                        float* norms, cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (num_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ValueNorms: num_slots is ", num_slots));
  }
  if (block_table == nullptr || norms == nullptr) {
    return absl::InvalidArgumentError("ValueNorms: block_table and norms are required");
  }
  if (num_slots == 0) return absl::OkStatus();
  const dim3 grid((num_slots + kWarps - 1) / kWarps, kv.num_kv_heads);
  WithKvType(kv.dtype, [&](auto tag) {
    ValueNormsKernel<decltype(tag)><<<grid, kThreads, 0, stream>>>(kv, block_table, num_slots,
                                                                  norms);
  });
  return LastLaunchStatus("ValueNormsKernel");
}

#define WINNOW_INSTANTIATE_SCORING(Q)                                                         \
  template absl::Status AttentionProbabilities<Q>(const DevicePagedKv&,                      \
                                                  const DeviceScoreInput<Q>&, float*, float*, \
                                                  cudaStream_t);                              \
  template absl::Status AccumulateAttentionColumns<Q>(                                        \
      const DevicePagedKv&, const DeviceScoreInput<Q>&, float*, float*, cudaStream_t);        \
  template absl::Status TokenSelectVote<Q>(const DevicePagedKv&, const int32_t*, const Q*,    \
                                           int32_t, int32_t, int32_t, float, bool, float*,    \
                                           float*, cudaStream_t);

WINNOW_INSTANTIATE_SCORING(float)
WINNOW_INSTANTIATE_SCORING(__half)
WINNOW_INSTANTIATE_SCORING(__nv_bfloat16)

}  // namespace winnow::kernels::cuda
