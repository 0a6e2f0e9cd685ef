#include "kernels/cuda/device.h"

#include <vector>

#include "kernels/cuda/device_buffer.h"
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

TEST_F(DeviceTest, BufferRoundTripsThroughTheDevice) {
  const std::vector<float> host = {1.5f, -2.0f, 3.25f};
  absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(host);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<float> back(host.size());
  ASSERT_TRUE(buffer->CopyToHost(std::span<float>(back)).ok());
  EXPECT_EQ(back, host);
  std::vector<float> too_long(host.size() + 1);
  EXPECT_FALSE(buffer->CopyToHost(std::span<float>(too_long)).ok());
}

}  // namespace
}  // namespace winnow::kernels::cuda
