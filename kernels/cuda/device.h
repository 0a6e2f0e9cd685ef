// CUDA device discovery: what GPUs there are and how much of their memory is free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace winnow::kernels::cuda {

struct DeviceInfo {
  int32_t index = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int32_t compute_capability_major = 0;
  int32_t compute_capability_minor = 0;
};

// The visible CUDA devices; empty when there is no driver or no GPU.
std::vector<DeviceInfo> ListDevices();

struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// GPU `index`'s free and total memory as the driver reports them now (cudaMemGetInfo: what
// other processes and this one's CUDA context hold is not free).
absl::StatusOr<DeviceMemory> MemoryInfo(int32_t index);

}  // namespace winnow::kernels::cuda
