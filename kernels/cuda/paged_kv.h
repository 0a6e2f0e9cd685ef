// The paged KV arena as the CUDA kernels see it: the same layout as the CPU pool
// (cache/block_pool.h), held in device memory. A block holds ONE layer's
//   K[kv_head][slot][row] followed by V[kv_head][slot][row],
// a row being one token's head_dim values of one KV head. The device pool stores rows as f16 or
// bf16 only (2 bytes a value, row_bytes = 2 * head_dim): the CPU pool's f32 and q8_0 have no
// device kernels (f32 doubles the KV bytes that decode must read; q8_0 would need its own
// dequantising attention), so CheckDevicePagedKv rejects them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_dtype.h"

namespace winnow::kernels::cuda {

struct DevicePagedKv {
  std::byte* arena = nullptr;  // device memory, num_blocks * bytes_per_block bytes
  int64_t bytes_per_block = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  KvDtype dtype = KvDtype::kF16;

  int64_t row_bytes() const { return int64_t{head_dim} * 2; }
};

// The largest head_dim the kernels accept (scoring keeps a key row in registers, 8 values a
// lane).
inline constexpr int32_t kMaxDeviceHeadDim = 256;

// The device view of an arena laid out as `geometry` describes (cache::KvLayout::View gives it;
// its own arena pointer is ignored).
inline DevicePagedKv DevicePagedKvFor(const PagedKvView& geometry, std::byte* device_arena) {
  return DevicePagedKv{device_arena,          geometry.bytes_per_block, geometry.block_size,
                       geometry.num_kv_heads, geometry.head_dim,        geometry.dtype};
}

// InvalidArgument, naming the field, unless the view is one the kernels can read: f16 or bf16
// rows, positive sizes, head_dim <= kMaxDeviceHeadDim, and bytes_per_block matching the layout.
absl::Status CheckDevicePagedKv(const DevicePagedKv& kv);

}  // namespace winnow::kernels::cuda
