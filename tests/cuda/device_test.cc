#include "kernels/cuda/device.h"

#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

class DeviceTest : public testing::CudaTest {};

TEST_F(DeviceTest, ListsAtLeastOneDeviceWithMemory) {
  const std::vector<DeviceInfo> devices = ListDevices();
  ASSERT_FALSE(devices.empty());
  EXPECT_FALSE(devices[0].name.empty());
  EXPECT_GT(devices[0].total_memory_bytes, 0);
  EXPECT_GE(devices[0].compute_capability_major, 7);
}

}  // namespace
}  // namespace winnow::kernels::cuda
