// CUDA device discovery. The CUDA kernels arrive in a later issue; this is the seam through
// which the engine will ask what GPUs it has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace winnow::kernels::cuda
