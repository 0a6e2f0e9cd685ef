#include "kernels/cuda/paged_kv.h"

#include "absl/strings/str_cat.h"

namespace winnow::kernels::cuda {

absl::Status CheckDevicePagedKv(const DevicePagedKv& kv) {
  if (kv.dtype != KvDtype::kF16 && kv.dtype != KvDtype::kBF16) {
    return absl::InvalidArgumentError(
        "device KV pool: dtype must be f16 or bf16 (f32 and q8_0 pools are CPU-only)");
  }
  if (kv.arena == nullptr) return absl::InvalidArgumentError("device KV pool: arena is null");
  if (kv.block_size <= 0 || kv.num_kv_heads <= 0 || kv.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device KV pool: block_size (", kv.block_size, "), num_kv_heads (", kv.num_kv_heads,
        ") and head_dim (", kv.head_dim, ") must be positive"));
  }
  if (kv.head_dim > kMaxDeviceHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("device KV pool: head_dim ", kv.head_dim,
                                                   " exceeds ", kMaxDeviceHeadDim));
  }
  const int64_t expected = 2 * int64_t{kv.num_kv_heads} * kv.block_size * kv.row_bytes();
  if (kv.bytes_per_block != expected) {
    return absl::InvalidArgumentError(absl::StrCat("device KV pool: bytes_per_block is ",
                                                   kv.bytes_per_block, ", the layout needs ",
                                                   expected));
  }
  return absl::OkStatus();
}

}  // namespace winnow::kernels::cuda
