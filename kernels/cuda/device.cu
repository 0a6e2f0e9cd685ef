#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

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

}  // namespace winnow::kernels::cuda
