#include "kernels/cuda/device.h"

#include <vector>

#include "base/fatal_error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

class DeviceTest : public testing::CudaTest {};

// No GPU needed: which runtime errors leave the context unusable, and that their status says
// so (base/fatal_error.h), so that the engine stops and the daemon exits for a restart.
TEST(CudaStatusTest, StickyErrorsAreFatalOthersAreNot) {
  for (cudaError_t sticky : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                             cudaErrorECCUncorrectable}) {
    const absl::Status st = CudaStatus(sticky, "a kernel");
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
    EXPECT_TRUE(base::IsFatal(st)) << st;
  }
  for (cudaError_t passing : {cudaErrorMemoryAllocation, cudaErrorInvalidValue,
                              cudaErrorInvalidConfiguration}) {
    const absl::Status st = CudaStatus(passing, "a call");
    EXPECT_FALSE(st.ok());
    EXPECT_FALSE(base::IsFatal(st)) << st;
  }
  EXPECT_TRUE(CudaStatus(cudaSuccess, "a call").ok());
}

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
