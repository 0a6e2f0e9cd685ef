// Device helpers shared by the kernels in this folder (include from .cu files only):
// conversions between the 16-bit storage types and float, warp and block reductions, and the
// address of a row in the paged KV arena.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/paged_kv.h"

namespace winnow::kernels::cuda::detail {

inline constexpr int kWarp = 32;

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// float -> T, rounding to nearest even as the CPU's EncodeKv does.
template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) { return v; }
template <>
__device__ inline __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ inline float WarpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}
__device__ inline float WarpMax(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum (or max) over the whole block; every thread gets the result. `shared` holds 32 floats.
// blockDim.x must be a multiple of 32. Contains __syncthreads: call from every thread.
template <bool kMax>
__device__ inline float BlockReduce(float v, float* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = kMax ? -INFINITY : 0.0f;
  for (int w = 0; w < warps; ++w) r = kMax ? fmaxf(r, shared[w]) : r + shared[w];
  return r;
}

// Row `slot` (within `block`) of one KV head, K or V, as stored (KvT = __half or
// __nv_bfloat16, matching kv.dtype).
template <typename KvT>
__device__ inline KvT* KvRow(const DevicePagedKv& kv, int32_t block, int32_t kv_head,
                             int32_t slot, bool values) {
  const int64_t row_bytes = int64_t{kv.head_dim} * 2;  // kv.row_bytes(), a host function
  const int64_t head_block = int64_t{kv.block_size} * row_bytes;
  std::byte* p = kv.arena + block * kv.bytes_per_block +
                 (int64_t{values ? kv.num_kv_heads : 0} + kv_head) * head_block +
                 int64_t{slot} * row_bytes;
  return reinterpret_cast<KvT*>(p);
}

}  // namespace winnow::kernels::cuda::detail
