// kernels/cuda/graph_cache.h: a key's work runs eagerly once, is then captured and replayed as
// it was captured; work that a graph cannot hold runs eagerly and turns the cache off.
#include "kernels/cuda/graph_cache.h"

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "tests/cuda/cuda_test_util.h"

namespace winnow::kernels::cuda {
namespace {

class GraphCacheTest : public ::winnow::testing::CudaTest {};

std::vector<uint8_t> Bytes(const DeviceBuffer<uint8_t>& buffer) {
  std::vector<uint8_t> host(buffer.size());
  EXPECT_TRUE(buffer.CopyToHost(std::span<uint8_t>(host)).ok());
  return host;
}

TEST_F(GraphCacheTest, RunsOnceEagerlyThenReplaysTheWorkAsCaptured) {
  auto buffer = DeviceBuffer<uint8_t>::Allocate(64);
  ASSERT_TRUE(buffer.ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  GraphCache graphs;
  int value = 7;
  int calls = 0;
  const auto fill = [&]() -> absl::Status {
    ++calls;
    return CudaStatus(cudaMemsetAsync(buffer->data(), value, 64, stream), "cudaMemsetAsync");
  };
  ASSERT_TRUE(graphs.Run(1, stream, fill).ok());  // eager
  EXPECT_EQ(graphs.size(), 0);
  ASSERT_TRUE(graphs.Run(1, stream, fill).ok());  // captured, then launched
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(Bytes(*buffer), std::vector<uint8_t>(64, 7));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(graphs.size(), 1);
  // The replay repeats the captured memset (value 7), without calling `fill`.
  value = 9;
  ASSERT_EQ(cudaMemset(buffer->data(), 0, 64), cudaSuccess);
  ASSERT_TRUE(graphs.Run(1, stream, fill).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(Bytes(*buffer), std::vector<uint8_t>(64, 7));
  EXPECT_EQ(calls, 2);
  // Another key starts eagerly.
  ASSERT_TRUE(graphs.Run(2, stream, fill).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(Bytes(*buffer), std::vector<uint8_t>(64, 9));
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(graphs.capture_error().ok());
  graphs.Clear();
  EXPECT_EQ(graphs.size(), 0);
  cudaStreamDestroy(stream);
}

TEST_F(GraphCacheTest, WorkAGraphCannotHoldRunsEagerlyAndTurnsItOff) {
  auto buffer = DeviceBuffer<uint8_t>::Allocate(64);
  ASSERT_TRUE(buffer.ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  GraphCache graphs;
  int calls = 0;
  // Waiting for a stream cannot be captured.
  const auto fill_and_wait = [&]() -> absl::Status {
    ++calls;
    if (absl::Status s = CudaStatus(cudaMemsetAsync(buffer->data(), 5, 64, stream), "memset");
        !s.ok()) {
      return s;
    }
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  ASSERT_TRUE(graphs.Run(1, stream, fill_and_wait).ok());  // eager
  EXPECT_TRUE(graphs.capture_error().ok());
  ASSERT_TRUE(graphs.Run(1, stream, fill_and_wait).ok());
  EXPECT_FALSE(graphs.capture_error().ok());
  EXPECT_EQ(graphs.size(), 0);
  EXPECT_EQ(calls, 3);  // eager, the failed capture, then eager again
  EXPECT_EQ(Bytes(*buffer), std::vector<uint8_t>(64, 5));
  ASSERT_TRUE(graphs.Run(1, stream, fill_and_wait).ok());  // eager from now on
  EXPECT_EQ(calls, 4);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace winnow::kernels::cuda
