// The seam between kernels/cuda/paged_attention.cu and FlashInfer: one plain struct per call,
// and one explicit instantiation per (element type, head dim) in kernels/cuda/attention_inst/,
// so that only those small translation units compile FlashInfer's templates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace winnow::kernels::cuda {

// One FlashInfer call over `batch` sequences. The arena's K of block b, KV head h, slot s starts
// at element b * page_stride + h * block_size * head_dim + s * head_dim, and its V
// v_offset elements later (cache::KvLayout's block layout in FlashInfer's HND strides).
struct FlashInferCall {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int64_t page_stride = 0;  // elements per block (K and V of every KV head)
  int64_t v_offset = 0;     // elements from a block's K to its V
  const void* arena = nullptr;

  int32_t batch = 0;
  int32_t total_rows = 0;  // query rows of these sequences
  const int32_t* kv_indptr_host = nullptr;  // [batch + 1]: the planner reads host copies
  const int32_t* qo_indptr_host = nullptr;  // [batch + 1], prefill only
  const int32_t* kv_indptr = nullptr;       // device copies of the page table
  const int32_t* kv_indices = nullptr;
  const int32_t* last_page_len = nullptr;
  const int32_t* qo_indptr = nullptr;       // prefill only

  const void* q = nullptr;  // rows x num_heads x head_dim, from this batch's first row
  void* out = nullptr;
  // Optional, rows x num_heads from this batch's first row: each row's log2 of the sum over its
  // keys of 2^(scale * log2(e) * q.k), FlashInfer's log-sum-exp (kernels/cuda/column_sums.h).
  float* lse = nullptr;
  float scale = 1.0f;

  void* float_workspace = nullptr;
  size_t float_workspace_bytes = 0;
  void* int_workspace = nullptr;
  void* host_int_workspace = nullptr;
  size_t int_workspace_bytes = 0;
  cudaStream_t stream = nullptr;

  // The schedule (FlashInfer's plan info). With `replan` the planner computes it from the host
  // indptr copies, uploads it into int_workspace and stores it here; without, the one stored
  // by an earlier call with the same lengths is used as it stands (its upload is still in
  // int_workspace), which spares the planning and the upload.
  std::vector<int64_t>* plan = nullptr;
  bool replan = true;
};

// GQA group sizes (num_heads / num_kv_heads) FlashInfer's decode kernel is compiled for; other
// groups go through the prefill kernel, which takes any.
inline bool DecodeSupportsGroup(int32_t group) {
  return group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 ||
         group == 16;
}

// T: half or __nv_bfloat16 (q, KV and out); HEAD_DIM: 64 or 128.
template <typename T, int HEAD_DIM>
absl::Status FlashInferDecode(const FlashInferCall& call);
template <typename T, int HEAD_DIM>
absl::Status FlashInferPrefill(const FlashInferCall& call);

}  // namespace winnow::kernels::cuda
