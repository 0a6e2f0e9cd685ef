#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> devices;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back({i, prop.name, static_cast<int64_t>(prop.totalGlobalMem), prop.major,
                       prop.minor});
  }
  return devices;
}

absl::StatusOr<DeviceMemory> MemoryInfo(int32_t index) {
  WINNOW_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  size_t free_bytes = 0, total_bytes = 0;
  WINNOW_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

}  // namespace winnow::kernels::cuda
