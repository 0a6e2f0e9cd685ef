// Shared by the CUDA tests: they run whenever a GPU is visible and skip, saying why,
// when none is (these tests are compiled by every build that has nvcc).
#pragma once

#include <gtest/gtest.h>

#include "kernels/cuda/device.h"

namespace winnow::testing {

// Derive CUDA test fixtures from this: SetUp skips the test when no GPU is visible.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::ListDevices().empty()) {
      GTEST_SKIP() << "no CUDA device visible (no driver or no GPU): CUDA test skipped";
    }
  }
};

}  // namespace winnow::testing
