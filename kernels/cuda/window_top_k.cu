#include "kernels/cuda/window_top_k.h"

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {
namespace {

constexpr int kPoolThreads = 256;
constexpr int kSelectThreads = 1024;

__global__ void PoolAndFoldKernel(const float* sums, WindowScoreShape s, float* scores) {
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t g = blockIdx.y;
  if (j >= s.prefix) return;
  const int32_t group = s.num_heads / s.num_kv_heads;
  const int32_t half = s.kernel / 2;
  const bool pooled = s.kernel > 1 && s.pooling != KeyPooling::kNone;
  const int32_t lo = pooled ? max(0, j - half) : j;
  const int32_t hi = pooled ? min(s.prefix - 1, j + half) : j;
  float folded = 0.0f;
  for (int32_t hh = 0; hh < group; ++hh) {
    const float* row = sums + int64_t{g * group + hh} * s.num_slots;
    float v;
    if (!pooled) {
      v = row[j];
    } else if (s.pooling == KeyPooling::kMax) {
      v = row[lo];
      for (int32_t i = lo + 1; i <= hi; ++i) v = fmaxf(v, row[i]);
    } else {
      double sum = 0.0;  // Pool1d sums in double
      for (int32_t i = lo; i <= hi; ++i) sum += row[i];
      v = static_cast<float>(sum / (2 * half + 1));
    }
    folded = (s.folding == HeadFolding::kMax && hh > 0) ? fmaxf(folded, v) : folded + v;
  }
  if (s.folding == HeadFolding::kMean) folded /= static_cast<float>(group);
  scores[int64_t{g} * s.prefix + j] = folded;
}

// A float's bits as an unsigned key in the same order.
__device__ inline uint32_t OrderKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// The key of rank `rank` (1 = largest) among row[0, n), and how many keys equal to it rank at
// or above it: a radix select, eight bits a pass from the top.
__device__ void SelectThreshold(const float* row, int32_t n, int32_t rank, uint32_t* threshold,
                                int32_t* equal_taken) {
  __shared__ int32_t histogram[256];
  __shared__ uint32_t s_want;
  __shared__ int32_t s_rank;
  uint32_t want = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t key = OrderKey(row[j]);
      if ((key & mask) == want) atomicAdd(&histogram[(key >> shift) & 0xffu], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int bin = 255;
      while (bin > 0 && histogram[bin] < rank) rank -= histogram[bin--];
      s_want = want | (static_cast<uint32_t>(bin) << shift);
      s_rank = rank;
    }
    __syncthreads();
    want = s_want;
    rank = s_rank;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  *threshold = want;
  *equal_taken = rank;
}

__global__ void TopKWithWindowKernel(const float* scores, int32_t prefix, int32_t n,
                                     int32_t keep, int32_t* kept) {
  const int32_t g = blockIdx.x;
  const float* row = scores + int64_t{g} * prefix;
  int32_t* out = kept + int64_t{g} * keep;
  const int32_t window = n - prefix;
  if (keep <= window) {
    for (int32_t i = threadIdx.x; i < keep; i += blockDim.x) out[i] = n - keep + i;
    return;
  }
  const int32_t picks = keep - window;  // from the prefix; picks <= prefix since keep <= n
  for (int32_t i = threadIdx.x; i < window; i += blockDim.x) out[picks + i] = prefix + i;
  if (picks >= prefix) {
    for (int32_t i = threadIdx.x; i < prefix; i += blockDim.x) out[i] = i;
    return;
  }
  uint32_t threshold = 0;
  int32_t equal_taken = 0;
  SelectThreshold(row, prefix, picks, &threshold, &equal_taken);

  // In slot order: every key above the threshold, and the first equal_taken equal to it.
  using Scan = cub::BlockScan<int32_t, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t s_taken, s_equal;
  if (threadIdx.x == 0) s_taken = s_equal = 0;
  __syncthreads();
  for (int32_t base = 0; base < prefix; base += kSelectThreads) {
    const int32_t j = base + static_cast<int32_t>(threadIdx.x);
    const uint32_t key = j < prefix ? OrderKey(row[j]) : 0u;
    const int32_t equal = j < prefix && key == threshold;
    int32_t equal_rank = 0, equal_total = 0;
    Scan(scan).ExclusiveSum(equal, equal_rank, equal_total);
    __syncthreads();
    const int32_t take =
        j < prefix && (key > threshold || (equal && s_equal + equal_rank < equal_taken));
    int32_t position = 0, taken_total = 0;
    Scan(scan).ExclusiveSum(take, position, taken_total);
    if (take) out[s_taken + position] = j;
    __syncthreads();
    if (threadIdx.x == 0) {
      s_taken += taken_total;
      s_equal += equal_total;
    }
    __syncthreads();
  }
}

}  // namespace

absl::Status PoolAndFoldWindowScores(const float* sums, const WindowScoreShape& shape,
                                     float* scores, cudaStream_t stream) {
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.prefix < 0 || shape.prefix > shape.num_slots) {
    return absl::InvalidArgumentError("PoolAndFoldWindowScores: bad shape");
  }
  if (shape.prefix == 0) return absl::OkStatus();
  const dim3 grid((shape.prefix + kPoolThreads - 1) / kPoolThreads, shape.num_kv_heads);
  PoolAndFoldKernel<<<grid, kPoolThreads, 0, stream>>>(sums, shape, scores);
  return CudaStatus(cudaGetLastError(), "PoolAndFoldKernel");
}

absl::Status TopKWithWindow(const float* scores, int32_t num_kv_heads, int32_t prefix,
                            int32_t num_slots, int32_t keep, int32_t* kept,
                            cudaStream_t stream) {
  if (num_kv_heads <= 0 || prefix < 0 || prefix > num_slots || keep < 1 || keep > num_slots) {
    return absl::InvalidArgumentError("TopKWithWindow: bad arguments");
  }
  TopKWithWindowKernel<<<num_kv_heads, kSelectThreads, 0, stream>>>(scores, prefix, num_slots,
                                                                    keep, kept);
  return CudaStatus(cudaGetLastError(), "TopKWithWindowKernel");
}

}  // namespace winnow::kernels::cuda
