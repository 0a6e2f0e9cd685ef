#include "scheduler/device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace winnow::scheduler {
namespace {

TEST(DeviceTest, ParsesCpuAndCudaOrdinals) {
  ASSERT_TRUE(ParseDevice("cpu").ok());
  EXPECT_EQ(*ParseDevice("cpu"), Device{});
  EXPECT_EQ(ParseDevice("cpu")->ToString(), "cpu");
  EXPECT_EQ(*ParseDevice("cuda"), (Device{Device::Kind::kCuda, 0}));
  EXPECT_EQ(*ParseDevice("cuda:0"), (Device{Device::Kind::kCuda, 0}));
  EXPECT_EQ(*ParseDevice("cuda:3"), (Device{Device::Kind::kCuda, 3}));
  EXPECT_EQ(ParseDevice("cuda:12")->ToString(), "cuda:12");
}

TEST(DeviceTest, RejectsWhatIsNoDevice) {
  for (const char* text : {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda0",
                           "cuda:0:1", "cuda: 1", "cuda:99999999999"}) {
    absl::StatusOr<Device> d = ParseDevice(text);
    ASSERT_FALSE(d.ok()) << "'" << text << "' parsed as " << d->ToString();
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << d.status();
  }
}

TEST(DeviceTest, BuildWithoutCudaAcceptsOnlyCpu) {
  if (BuiltWithCuda()) GTEST_SKIP() << "this build has CUDA";
  EXPECT_TRUE(CheckBuiltFor(Device{}).ok());
  absl::Status cuda = CheckBuiltFor(*ParseDevice("cuda:0"));
  ASSERT_FALSE(cuda.ok());
  EXPECT_NE(cuda.message().find("built without CUDA"), std::string::npos) << cuda;
  EXPECT_EQ(DefaultDevice(), Device{});
}

TEST(DeviceTest, KvDtypeFollowsTheDevice) {
  const Device cpu;
  const Device cuda{Device::Kind::kCuda, 0};
  EXPECT_EQ(*KvDtypeFor(cpu, std::nullopt), kernels::KvDtype::kF16);
  EXPECT_EQ(*KvDtypeFor(cpu, kernels::KvDtype::kQ8_0), kernels::KvDtype::kQ8_0);
  EXPECT_EQ(*KvDtypeFor(cuda, std::nullopt), kernels::KvDtype::kBF16);
  EXPECT_EQ(*KvDtypeFor(cuda, kernels::KvDtype::kBF16), kernels::KvDtype::kBF16);
  absl::StatusOr<kernels::KvDtype> f32 = KvDtypeFor(cuda, kernels::KvDtype::kF32);
  ASSERT_FALSE(f32.ok());
  EXPECT_EQ(f32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f32.status().message().find("f32 does not run on device cuda:0"), std::string::npos)
      << f32.status();
}

TEST(DeviceTest, GpuMemoryFractionAppliesToCudaOnlyAndMustBeAFraction) {
  const char* path = std::getenv("WINNOW_TEST_MODEL");
  if (path == nullptr) GTEST_SKIP() << "WINNOW_TEST_MODEL not set";
  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::Model& m = **model;
  absl::StatusOr<int64_t> cpu = KvBytesForGpuMemory(Device{}, m, 0.9, {});
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.status().message().find("cuda device only"), std::string::npos) << cpu.status();
  for (double bad : {0.0, -0.5, 1.01}) {
    absl::StatusOr<int64_t> kv = KvBytesForGpuMemory(Device{Device::Kind::kCuda, 0}, m, bad, {});
    ASSERT_FALSE(kv.ok()) << bad;
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(kv.status().message().find("must be in (0, 1]"), std::string::npos) << kv.status();
  }
}

TEST(DeviceTest, DefaultIsCpuWithoutAVisibleGpu) {
  const Device d = DefaultDevice();
  EXPECT_TRUE(d == Device{} || d == (Device{Device::Kind::kCuda, 0}));
  EXPECT_EQ(DescribeDevice(Device{}), "cpu");
}

}  // namespace
}  // namespace winnow::scheduler
