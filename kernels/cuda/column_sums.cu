#include "kernels/cuda/column_sums.h"

#include <mma.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace winnow::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kKeyTile = 64;  // keys per block: four warps of 16 columns
constexpr int kRowTile = 32;  // query rows per step: two MMA tiles of 16
constexpr int kWarps = kKeyTile / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kRowHalves = kThreads / kKeyTile;  // threads sharing one key's column
// Padding of each shared row, in elements: keeps rows 32-byte aligned for WMMA while moving
// consecutive rows to other banks.
constexpr int kPad = 8;
constexpr int kLogitsPad = 4;
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kRowTile == 2 * 16, "each warp holds two row fragments");
static_assert(kThreads % kKeyTile == 0 && kRowTile % kRowHalves == 0, "columns split evenly");

template <int D>
struct Tiles {
  alignas(32) __nv_bfloat16 keys[kKeyTile][D + kPad];
  alignas(32) __nv_bfloat16 rows[kRowTile][D + kPad];
  alignas(32) float logits[kRowTile][kKeyTile + kLogitsPad];
  float lse[kRowTile];
  int32_t visible[kRowTile];
  float partial[kThreads];
};

// Copies `count` rows of D bf16 values, row i from src(i) (null: zeros), into dst[i], 16 bytes
// per thread and step.
template <int D, int kRows, typename Source>
__device__ inline void LoadRows(Source src, __nv_bfloat16 (*dst)[D + kPad]) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const __nv_bfloat16* from = src(row);
    int4 value = make_int4(0, 0, 0, 0);
    if (from != nullptr) value = reinterpret_cast<const int4*>(from)[chunk];
    *reinterpret_cast<int4*>(&dst[row][chunk * 8]) = value;
  }
}

// One block per (tile of kKeyTile keys, query head): see column_sums.h.
template <int D>
__global__ void __launch_bounds__(kThreads)
    ColumnSumsFromLseKernel(DevicePagedKv kv, DeviceScoreInput<__nv_bfloat16> in,
                            const float* lse_log2, float* column_sums) {
  __shared__ Tiles<D> t;
  const int32_t key0 = blockIdx.x * kKeyTile;
  const int32_t h = blockIdx.y;
  const int32_t kv_head = h / (in.num_heads / kv.num_kv_heads);
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  LoadRows<D, kKeyTile>(
      [&](int i) -> const __nv_bfloat16* {
        const int32_t slot = key0 + i;
        if (slot >= in.num_slots) return nullptr;
        return detail::KvRow<__nv_bfloat16>(kv, in.block_table[slot / kv.block_size], kv_head,
                                            slot % kv.block_size, false);
      },
      t.keys);
  const float scale_log2 = in.scale * kLog2e;
  const int column = tid % kKeyTile;
  const int half = tid / kKeyTile;
  float sum = 0.0f;
  for (int32_t r0 = 0; r0 < in.num_rows; r0 += kRowTile) {
    __syncthreads();  // the previous step is done with rows, logits, lse and visible
    bool sees_tile = false;
    if (tid < kRowTile) {
      const int32_t r = r0 + tid;
      const bool real = r < in.num_rows;
      const int32_t visible = real ? min(max(in.visible[r], 0), in.num_slots) : 0;
      t.visible[tid] = visible;
      t.lse[tid] = real ? lse_log2[int64_t{r} * in.num_heads + h] : 0.0f;
      sees_tile = visible > key0;
    }
    if (!__syncthreads_or(sees_tile)) continue;  // every row of the tile is before these keys
    LoadRows<D, kRowTile>(
        [&](int i) -> const __nv_bfloat16* {
          const int32_t r = r0 + i;
          return r < in.num_rows ? in.q + (int64_t{r} * in.num_heads + h) * D : nullptr;
        },
        t.rows);
    __syncthreads();
    // Warp w: the logits of every row of the tile with keys [16w, 16w + 16).
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
#pragma unroll
    for (int d = 0; d < D; d += 16) {
      wmma::load_matrix_sync(b, &t.keys[warp * 16][d], D + kPad);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a, &t.rows[i * 16][d], D + kPad);
        wmma::mma_sync(acc[i], a, b, acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      wmma::store_matrix_sync(&t.logits[i * 16][warp * 16], acc[i], kKeyTile + kLogitsPad,
                              wmma::mem_row_major);
    }
    __syncthreads();
    const int32_t key = key0 + column;
    constexpr int kRowsPerThread = kRowTile / kRowHalves;
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = half * kRowsPerThread + i;
      if (key >= t.visible[row]) continue;
      const float p = exp2f(t.logits[row][column] * scale_log2 - t.lse[row]);
      sum = in.column_max ? fmaxf(sum, p) : sum + p;
    }
  }
  t.partial[tid] = sum;
  __syncthreads();
  if (tid < kKeyTile && key0 + tid < in.num_slots) {
    float total = 0.0f;
    for (int i = 0; i < kRowHalves; ++i) {
      const float part = t.partial[i * kKeyTile + tid];
      total = in.column_max ? fmaxf(total, part) : total + part;
    }
    float& column = column_sums[int64_t{h} * in.num_slots + key0 + tid];
    column = in.column_max ? fmaxf(column, total) : column + total;
  }
}

}  // namespace

absl::Status ColumnSumsFromLse(const DevicePagedKv& kv, const DeviceScoreInput<__nv_bfloat16>& in,
                               const float* lse_log2, float* column_sums, cudaStream_t stream) {
  if (absl::Status s = CheckDevicePagedKv(kv); !s.ok()) return s;
  if (kv.dtype != KvDtype::kBF16 || (kv.head_dim != 64 && kv.head_dim != 128)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ColumnSumsFromLse: the arena holds ", KvDtypeName(kv.dtype), " of head_dim ",
        kv.head_dim, "; it takes bf16 of 64 or 128"));
  }
  if (in.num_heads <= 0 || in.num_heads % kv.num_kv_heads != 0 || in.num_slots < 0 ||
      in.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ColumnSumsFromLse: num_heads ", in.num_heads, " (a multiple of num_kv_heads ",
        kv.num_kv_heads, "), num_slots ", in.num_slots, " and num_rows ", in.num_rows,
        " (not negative)"));
  }
  if (in.num_rows == 0 || in.num_slots == 0) return absl::OkStatus();
  if (in.block_table == nullptr || in.q == nullptr || in.visible == nullptr ||
      lse_log2 == nullptr || column_sums == nullptr) {
    return absl::InvalidArgumentError(
        "ColumnSumsFromLse: block_table, q, visible, lse_log2 and column_sums are required");
  }
  const dim3 grid((in.num_slots + kKeyTile - 1) / kKeyTile, in.num_heads);
  if (kv.head_dim == 64) {
    ColumnSumsFromLseKernel<64><<<grid, kThreads, 0, stream>>>(kv, in, lse_log2, column_sums);
  } else {
    ColumnSumsFromLseKernel<128><<<grid, kThreads, 0, stream>>>(kv, in, lse_log2, column_sums);
  }
  return LastLaunchStatus("ColumnSumsFromLseKernel");
}

}  // namespace winnow::kernels::cuda
