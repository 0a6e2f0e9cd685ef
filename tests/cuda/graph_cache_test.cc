// kernels/cuda/graph_cache.h: a key's work runs eagerly once, is then captured and replayed as
// it was captured; work that a graph cannot hold runs eagerly and turns the cache off.
#include "kernels/cuda/graph_cache.h"

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

// A 64-byte device buffer and a stream of its own to queue work on.
class GraphCacheTest : public ::winnow::testing::CudaTest {
 protected:
  void SetUp() override {
    ::winnow::testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    buffer_ = *DeviceBuffer<uint8_t>::Allocate(64);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> host(buffer_.size());
    EXPECT_TRUE(buffer_.CopyToHost(std::span<uint8_t>(host)).ok());
    return host;
  }
  absl::Status Fill(int value) {
    return CudaStatus(cudaMemsetAsync(buffer_.data(), value, 64, stream_), "cudaMemsetAsync");
  }

  DeviceBuffer<uint8_t> buffer_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(GraphCacheTest, RunsOnceEagerlyThenReplaysTheWorkAsCaptured) {
  GraphCache graphs;
  int value = 7;
  int calls = 0;
  const auto fill = [&]() -> absl::Status {
    ++calls;
    return Fill(value);
  };
  ASSERT_TRUE(graphs.Run(1, stream_, fill).ok());  // eager
  EXPECT_EQ(graphs.size(), 0);
  ASSERT_TRUE(graphs.Run(1, stream_, fill).ok());  // captured, then launched
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Bytes(), std::vector<uint8_t>(64, 7));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(graphs.size(), 1);
  // The replay repeats the captured memset (value 7), without calling `fill`.
  value = 9;
  ASSERT_EQ(cudaMemset(buffer_.data(), 0, 64), cudaSuccess);
  ASSERT_TRUE(graphs.Run(1, stream_, fill).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Bytes(), std::vector<uint8_t>(64, 7));
  EXPECT_EQ(calls, 2);
  // Another key starts eagerly.
  ASSERT_TRUE(graphs.Run(2, stream_, fill).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Bytes(), std::vector<uint8_t>(64, 9));
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(graphs.capture_error().ok());
  graphs.Clear();
  EXPECT_EQ(graphs.size(), 0);
}

TEST_F(GraphCacheTest, WorkAGraphCannotHoldRunsEagerlyAndTurnsItOff) {
  GraphCache graphs;
  int calls = 0;
  // Waiting for a stream cannot be captured.
  const auto fill_and_wait = [&]() -> absl::Status {
    ++calls;
    if (absl::Status s = Fill(5); !s.ok()) return s;
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  };
  ASSERT_TRUE(graphs.Run(1, stream_, fill_and_wait).ok());  // eager
  EXPECT_TRUE(graphs.capture_error().ok());
  ASSERT_TRUE(graphs.Run(1, stream_, fill_and_wait).ok());
  EXPECT_FALSE(graphs.capture_error().ok());
  EXPECT_EQ(graphs.size(), 0);
  EXPECT_EQ(calls, 3);  // eager, the failed capture, then eager again
  EXPECT_EQ(Bytes(), std::vector<uint8_t>(64, 5));
  ASSERT_TRUE(graphs.Run(1, stream_, fill_and_wait).ok());  // eager from now on
  EXPECT_EQ(calls, 4);
}

}  // namespace
}  // namespace winnow::kernels::cuda
