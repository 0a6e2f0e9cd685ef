// Row gather on the GPU: the rows of a batch whose logits were asked for, packed so that the
// output head's GEMM reads only those (model/cuda_model.cc). The CUDA counterpart of the
// `source_rows` loop of CpuForward::Logits (model/cpu_forward.cc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace winnow::kernels::cuda {

// out[i * cols + c] = src[row_ids[i] * cols + c] for i < num_rows. row_ids are device indices
// the host built from the batch (each in [0, src_rows)); one outside that range gives a zero
// row instead of a read out of bounds.
template <typename T>
absl::Status GatherRows(const T* src, int64_t src_rows, int64_t cols, const int32_t* row_ids,
                        int64_t num_rows, T* out, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
