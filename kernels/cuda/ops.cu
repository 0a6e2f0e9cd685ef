#include "kernels/cuda/ops.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;

constexpr int kRowThreads = 256;  // a block per row for the per-row kernels

absl::Status CheckPositive(const char* op,
                           std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " must be positive, got ", value));
    }
  }
  return absl::OkStatus();
}

// OK for an empty batch, InvalidArgument for a negative row count.
absl::Status NoRows(const char* op, int64_t rows) {
  if (rows == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": rows is negative (", rows, ")"));
}

// Grid of at most 2^31-1 blocks in x; rows beyond that are looped over in the kernels.
unsigned RowGrid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 30)); }

template <typename T>
__global__ void EmbeddingGatherKernel(const T* table, int64_t vocab, int64_t hidden,
                                      const int32_t* token_ids, const int32_t* embedding_rows,
                                      const float* embeddings, int64_t rows, float* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t id = token_ids[r];
    float* dst = out + r * hidden;
    const T* src_table = nullptr;
    const float* src_embedding = nullptr;
    if (id == kEmbeddingInputId) {
      const int32_t e = embedding_rows != nullptr ? embedding_rows[r] : -1;
      if (e >= 0) src_embedding = embeddings + int64_t{e} * hidden;
    } else if (id >= 0 && id < vocab) {
      src_table = table + int64_t{id} * hidden;
    }
    for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      dst[c] = src_table != nullptr      ? ToFloat(src_table[c])
               : src_embedding != nullptr ? src_embedding[c]
                                          : 0.0f;
    }
  }
}

// A block of up to 1024 threads per row, pointers marked unaliased: a one-row decode step runs
// on one SM, where a thread's few loads must be in flight together (with 256 threads and
// possible aliasing, a 4096 row took 15 us on an H100: 16 serial round trips to memory).
template <typename T>
__global__ void RmsNormKernel(float* __restrict__ x, const T* __restrict__ residual_delta,
                              const float* __restrict__ weight, int64_t rows, int64_t hidden,
                              float eps, T* __restrict__ out) {
  __shared__ float shared[detail::kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = x + r * hidden;
    float sum_sq = 0.0f;
    for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      float v = row[c];
      if (residual_delta != nullptr) {
        v += ToFloat(residual_delta[r * hidden + c]);
        row[c] = v;  // read back below by this same thread only
      }
      sum_sq += v * v;
    }
    sum_sq = detail::BlockReduce<false>(sum_sq, shared);
    // The scale as the CPU computes it: 1 / sqrt(mean + eps) in double, then float.
    const float scale =
        static_cast<float>(1.0 / sqrt(static_cast<double>(sum_sq) / hidden + eps));
    for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      out[r * hidden + c] = FromFloat<T>(row[c] * scale * weight[c]);
    }
  }
}

// One warp per vector (QK-norm's heads are 64-256 long): lanes stride the vector, the sum
// of squares is reduced with shuffles, and each lane rescales the elements it read.
template <typename T>
__global__ void HeadRmsNormKernel(T* __restrict__ x, const float* __restrict__ weight,
                                  int64_t vectors, int32_t dim, float eps) {
  const int64_t warps = blockDim.x / detail::kWarp;
  const int lane = static_cast<int>(threadIdx.x % detail::kWarp);
  for (int64_t v = blockIdx.x * warps + threadIdx.x / detail::kWarp; v < vectors;
       v += int64_t{gridDim.x} * warps) {
    T* vec = x + v * dim;
    float sum_sq = 0.0f;
    for (int32_t c = lane; c < dim; c += detail::kWarp) {
      const float f = ToFloat(vec[c]);
      sum_sq += f * f;
    }
    for (int offset = detail::kWarp / 2; offset > 0; offset /= 2) {
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
    }
    const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(sum_sq) / dim + eps));
    for (int32_t c = lane; c < dim; c += detail::kWarp) {
      vec[c] = FromFloat<T>(ToFloat(vec[c]) * scale * weight[c]);
    }
  }
}

// One block per row. Thread t owns pair t % half of the heads t / half, t / half + lanes, ...
// (lanes = blockDim.x / half), Q heads first, then K heads, computing the pair's cos/sin once:
// the heads are rotated in parallel rather than one after another.
template <typename T>
__global__ void RopeKernel(T* q, int64_t q_stride, int32_t num_heads, T* k, int64_t k_stride,
                           int32_t num_kv_heads, int64_t rows, int32_t head_dim, int32_t rope_dim,
                           const int32_t* positions, const float* inv_freq, float attn_factor,
                           bool halves) {
  const int32_t half = rope_dim / 2;
  const int32_t lanes = blockDim.x / half;  // heads rotated at once (>= 1: see ApplyRope)
  const int32_t i = threadIdx.x % half;
  const int32_t first_head = threadIdx.x / half;
  if (first_head >= lanes) return;  // the threads past lanes * half have no pair
  const int32_t heads = num_heads + (k != nullptr ? num_kv_heads : 0);
  const int32_t a = halves ? i : 2 * i;
  const int32_t b = halves ? i + half : 2 * i + 1;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // Angles in double, as the CPU: positions reach 10^5+, where float angles lose bits.
    double sin_d, cos_d;
    sincos(static_cast<double>(positions[r]) * inv_freq[i], &sin_d, &cos_d);
    const float c = static_cast<float>(cos_d) * attn_factor;
    const float s = static_cast<float>(sin_d) * attn_factor;
    for (int32_t h = first_head; h < heads; h += lanes) {
      T* v = h < num_heads ? q + r * q_stride + int64_t{h} * head_dim
                           : k + r * k_stride + int64_t{h - num_heads} * head_dim;
      const float x0 = ToFloat(v[a]);
      const float x1 = ToFloat(v[b]);
      v[a] = FromFloat<T>(x0 * c - x1 * s);
      v[b] = FromFloat<T>(x0 * s + x1 * c);
    }
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, int64_t rows, int64_t cols,
                              int64_t in_stride, T* out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    const float g = ToFloat(gate[r * in_stride + c]);
    const float u = ToFloat(up[r * in_stride + c]);
    out[i] = FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

// One block per row: the row's max, then the sum of exp(x - max) (each thread's terms in
// double, as the CPU sampler sums them), then max + log(sum).
__global__ void LogSumExpRowsKernel(const float* x, int64_t rows, int64_t cols, float* out) {
  __shared__ float shared[detail::kWarp];
  __shared__ double shared_sum[detail::kWarp];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = x + r * cols;
    float max_value = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) max_value = fmaxf(max_value, row[c]);
    max_value = detail::BlockReduce<true>(max_value, shared);
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - max_value);
    for (int offset = detail::kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (threadIdx.x % detail::kWarp == 0) shared_sum[threadIdx.x / detail::kWarp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0.0;
      for (int w = 0; w < static_cast<int>(blockDim.x) / detail::kWarp; ++w) total += shared_sum[w];
      out[r] = max_value + static_cast<float>(log(total));
    }
    __syncthreads();  // shared_sum is reused by the next row
  }
}

template <typename T>
__global__ void AddBiasKernel(T* x, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = FromFloat<T>(ToFloat(x[i]) + bias[i % cols]);
  }
}

__global__ void WidenKernel(const __nv_bfloat16* x, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(x[i]);
  }
}

unsigned ElementGrid(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kRowThreads - 1) / kRowThreads, 1,
                                                   int64_t{1} << 20));
}

}  // namespace

template <typename T>
absl::Status EmbeddingGather(const T* table, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, const int32_t* embedding_rows,
                             const float* embeddings, int64_t rows, float* out,
                             cudaStream_t stream) {
  if (rows <= 0) return NoRows("EmbeddingGather", rows);
  if (absl::Status s = CheckPositive("EmbeddingGather", {{"vocab", vocab}, {"hidden", hidden}});
      !s.ok()) {
    return s;
  }
  if (embedding_rows != nullptr && embeddings == nullptr) {
    return absl::InvalidArgumentError("EmbeddingGather: embedding_rows without embeddings");
  }
  EmbeddingGatherKernel<<<RowGrid(rows), kRowThreads, 0, stream>>>(
      table, vocab, hidden, token_ids, embedding_rows, embeddings, rows, out);
  return LastLaunchStatus("EmbeddingGatherKernel");
}

template <typename T>
absl::Status RmsNorm(float* x, const T* residual_delta, const float* weight, int64_t rows,
                     int64_t hidden, float eps, T* out, cudaStream_t stream) {
  if (rows <= 0) return NoRows("RmsNorm", rows);
  if (absl::Status s = CheckPositive("RmsNorm", {{"hidden", hidden}}); !s.ok()) return s;
  const int threads = static_cast<int>(
      std::clamp<int64_t>((hidden + detail::kWarp - 1) / detail::kWarp * detail::kWarp,
                          detail::kWarp, 1024));
  RmsNormKernel<<<RowGrid(rows), threads, 0, stream>>>(x, residual_delta, weight, rows, hidden,
                                                       eps, out);
  return LastLaunchStatus("RmsNormKernel");
}

template <typename T>
absl::Status HeadRmsNorm(T* x, const float* weight, int64_t vectors, int32_t dim, float eps,
                         cudaStream_t stream) {
  if (vectors <= 0) return NoRows("HeadRmsNorm", vectors);
  if (absl::Status s = CheckPositive("HeadRmsNorm", {{"dim", dim}}); !s.ok()) return s;
  constexpr int kWarpsPerBlock = kRowThreads / detail::kWarp;
  HeadRmsNormKernel<<<RowGrid((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock), kRowThreads, 0,
                      stream>>>(x, weight, vectors, dim, eps);
  return LastLaunchStatus("HeadRmsNormKernel");
}

template <typename T>
absl::Status ApplyRope(T* q, int64_t q_stride, int32_t num_heads, T* k, int64_t k_stride,
                       int32_t num_kv_heads, int64_t rows, int32_t head_dim, int32_t rope_dim,
                       const int32_t* positions, const float* inv_freq, float attn_factor,
                       RopeLayout layout, cudaStream_t stream) {
  if (rows <= 0) return NoRows("ApplyRope", rows);
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("ApplyRope: rope_dim ", rope_dim,
                                                   " must be even and within head_dim ",
                                                   head_dim));
  }
  if (num_heads <= 0 || (k != nullptr && num_kv_heads <= 0)) {
    return absl::InvalidArgumentError("ApplyRope: num_heads and num_kv_heads must be positive");
  }
  if (q_stride < int64_t{num_heads} * head_dim ||
      (k != nullptr && k_stride < int64_t{num_kv_heads} * head_dim)) {
    return absl::InvalidArgumentError(
        "ApplyRope: q_stride / k_stride must cover num_heads / num_kv_heads x head_dim");
  }
  // As many heads at once as fit in 1024 threads (at least one: half <= head_dim / 2 <= 512
  // for any head_dim the forward takes), rounded to whole warps.
  const int32_t half = rope_dim / 2;
  const int32_t heads = num_heads + (k != nullptr ? num_kv_heads : 0);
  const int64_t wanted = int64_t{half} * std::min<int64_t>(heads, std::max(1, 1024 / half));
  const int threads = static_cast<int>(
      std::min<int64_t>(1024, (wanted + detail::kWarp - 1) / detail::kWarp * detail::kWarp));
  if (half > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("ApplyRope: rope_dim ", rope_dim,
                                                   " is above the 2048 this kernel takes"));
  }
  RopeKernel<<<RowGrid(rows), threads, 0, stream>>>(
      q, q_stride, num_heads, k, k_stride, num_kv_heads, rows, head_dim, rope_dim, positions,
      inv_freq, attn_factor, layout == RopeLayout::kHalves);
  return LastLaunchStatus("RopeKernel");
}

template <typename T>
absl::Status SiluMul(const T* gate, const T* up, int64_t rows, int64_t cols, int64_t in_stride,
                     T* out, cudaStream_t stream) {
  if (rows <= 0) return NoRows("SiluMul", rows);
  if (cols <= 0 || in_stride < cols) {
    return absl::InvalidArgumentError(absl::StrCat("SiluMul: cols (", cols,
                                                   ") must be positive and <= in_stride (",
                                                   in_stride, ")"));
  }
  SiluMulKernel<<<ElementGrid(rows * cols), kRowThreads, 0, stream>>>(gate, up, rows, cols,
                                                                       in_stride, out);
  return LastLaunchStatus("SiluMulKernel");
}

template <typename T>
absl::Status AddBias(T* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return NoRows("AddBias", rows);
  if (absl::Status s = CheckPositive("AddBias", {{"cols", cols}}); !s.ok()) return s;
  AddBiasKernel<<<ElementGrid(rows * cols), kRowThreads, 0, stream>>>(x, bias, rows, cols);
  return LastLaunchStatus("AddBiasKernel");
}

absl::Status WidenToFloat(const __nv_bfloat16* x, int64_t count, float* out,
                          cudaStream_t stream) {
  if (count <= 0) return NoRows("WidenToFloat", count);
  WidenKernel<<<ElementGrid(count), kRowThreads, 0, stream>>>(x, count, out);
  return LastLaunchStatus("WidenKernel");
}

absl::Status LogSumExpRows(const float* x, int64_t rows, int64_t cols, float* out,
                           cudaStream_t stream) {
  if (rows <= 0) return NoRows("LogSumExpRows", rows);
  if (absl::Status s = CheckPositive("LogSumExpRows", {{"cols", cols}}); !s.ok()) return s;
  LogSumExpRowsKernel<<<RowGrid(rows), 1024, 0, stream>>>(x, rows, cols, out);
  return LastLaunchStatus("LogSumExpRowsKernel");
}

#define WINNOW_INSTANTIATE_OPS(T)                                                             \
  template absl::Status EmbeddingGather<T>(const T*, int64_t, int64_t, const int32_t*,        \
                                           const int32_t*, const float*, int64_t, float*,     \
                                           cudaStream_t);                                     \
  template absl::Status RmsNorm<T>(float*, const T*, const float*, int64_t, int64_t, float,   \
                                   T*, cudaStream_t);                                         \
  template absl::Status HeadRmsNorm<T>(T*, const float*, int64_t, int32_t, float,             \
                                       cudaStream_t);                                         \
  template absl::Status ApplyRope<T>(T*, int64_t, int32_t, T*, int64_t, int32_t, int64_t,     \
                                     int32_t, int32_t, const int32_t*, const float*, float,   \
                                     RopeLayout, cudaStream_t);                               \
  template absl::Status SiluMul<T>(const T*, const T*, int64_t, int64_t, int64_t, T*,         \
                                   cudaStream_t);                                             \
  template absl::Status AddBias<T>(T*, const float*, int64_t, int64_t, cudaStream_t);

WINNOW_INSTANTIATE_OPS(__half)
WINNOW_INSTANTIATE_OPS(__nv_bfloat16)

}  // namespace winnow::kernels::cuda
