// KV append on the GPU: the new tokens' K and V rows of one layer written into the paged device
// pool at their (block, slot), in the pool's dtype (f16 or bf16; kernels/cuda/paged_kv.h). The
// CUDA counterpart of the "store the new tokens' K/V" loop of CpuForward::AppendKv
// (BlockPool::WriteRow -> kernels::EncodeKv), bit for bit: float(T) rounded to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_kv.h"

namespace winnow::kernels::cuda {

// For each row r < rows with slot_mapping[r] >= 0: block = slot_mapping[r] / kv.block_size,
// in-block slot = slot_mapping[r] % kv.block_size (the host computes slot_mapping[r] =
// block_table[slot / block_size] * block_size + slot % block_size, as CpuForward::AppendKv
// does), and for every KV head h the row k[r * src_stride + h * head_dim ...] (and likewise v)
// is stored into that slot's K (and V) row of head h. A negative slot_mapping entry skips the
// row (padding rows of a captured graph). k, v: T (activations, post-RoPE K), rows src_stride
// elements apart (num_kv_heads * head_dim for separate buffers; a fused QKV row length
// otherwise).
template <typename T>
absl::Status KvAppend(const DevicePagedKv& kv, const T* k, const T* v, int64_t src_stride,
                      const int64_t* slot_mapping, int64_t rows, cudaStream_t stream);

}  // namespace winnow::kernels::cuda
