#include "kernels/cuda/sparse_attention.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

using detail::kWarp;
using detail::ToFloat;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxPerLane = kMaxDeviceHeadDim / kWarp;

template <typename KvT>
__global__ void SparseDecodeKernel(DevicePagedKv kv, DeviceSparseDecode in,
                                   const __nv_bfloat16* q, int32_t num_heads, float scale,
                                   __nv_bfloat16* out) {
  __shared__ float query[kMaxDeviceHeadDim];
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxDeviceHeadDim];
  const int32_t item = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t d = kv.head_dim;
  const int32_t kv_head = h / (num_heads / kv.num_kv_heads);
  const int64_t row = (int64_t{in.rows[item]} * num_heads + h) * d;
  const int32_t* table = in.tables + in.table_offsets[item];
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x) query[c] = ToFloat(q[row + c]);
  __syncthreads();

  // Each warp folds its share of the list into a running max, sum and weighted value.
  const int32_t lane = threadIdx.x % kWarp;
  const int32_t warp = threadIdx.x / kWarp;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  float acc[kMaxPerLane] = {};
  for (int32_t i = in.list_offsets[item] + warp; i < in.list_offsets[item + 1]; i += kWarps) {
    const int32_t j = in.lists[i];
    const int32_t block = table[j / kv.block_size];
    const KvT* key = detail::KvRow<KvT>(kv, block, kv_head, j % kv.block_size, false);
    const KvT* value = detail::KvRow<KvT>(kv, block, kv_head, j % kv.block_size, true);
    float partial = 0.0f;
    for (int32_t c = lane; c < d; c += kWarp) partial += ToFloat(key[c]) * query[c];
    const float logit = detail::WarpSum(partial) * scale;
    const float new_max = fmaxf(running_max, logit);
    const float rescale = expf(running_max - new_max);  // 0 while nothing was seen
    const float p = expf(logit - new_max);
    running_sum = running_sum * rescale + p;
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int32_t c = lane + k * kWarp;
      if (c < d) acc[k] = acc[k] * rescale + p * ToFloat(value[c]);
    }
    running_max = new_max;
  }
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int32_t c = lane + k * kWarp;
    if (c < d) warp_acc[warp][c] = acc[k];
  }
  __syncthreads();

  float block_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_max[w]);
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x) {
    float total = 0.0f;
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum[w] == 0.0f) continue;  // a warp that saw no slot
      const float weight = expf(warp_max[w] - block_max);
      total += warp_acc[w][c] * weight;
      sum += warp_sum[w] * weight;
    }
    out[row + c] = __float2bfloat16_rn(sum > 0.0f ? total / sum : 0.0f);
  }
}

}  // namespace

absl::Status SparseDecodeAttention(const DevicePagedKv& kv, const DeviceSparseDecode& in,
                                   const __nv_bfloat16* q, int32_t num_heads, float scale,
                                   __nv_bfloat16* out, cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (num_heads <= 0 || num_heads % kv.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SparseDecodeAttention: num_heads ", num_heads,
        " is not a positive multiple of num_kv_heads ", kv.num_kv_heads));
  }
  if (in.num_items < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseDecodeAttention: num_items is ", in.num_items));
  }
  if (in.num_items == 0) return absl::OkStatus();
  if (in.rows == nullptr || in.table_offsets == nullptr || in.list_offsets == nullptr ||
      in.tables == nullptr || in.lists == nullptr || q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "SparseDecodeAttention: rows, table_offsets, list_offsets, tables, lists, q and out "
        "are required");
  }
  const dim3 grid(in.num_items, num_heads);
  if (kv.dtype == KvDtype::kF16) {
    SparseDecodeKernel<__half><<<grid, kThreads, 0, stream>>>(kv, in, q, num_heads, scale, out);
  } else {
    SparseDecodeKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(kv, in, q, num_heads,
                                                                      scale, out);
  }
  return LastLaunchStatus("SparseDecodeKernel");
}

}  // namespace winnow::kernels::cuda
