// Shared by the CUDA kernel tests: random data, uploads and downloads that round through the
// CPU's own f16/bf16 conversions (kernels/cpu/kv_dtype.h), and tolerance checks that report the
// worst element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace winnow::testing {

// The KV dtype whose bytes a 16-bit device type holds, and its unit roundoff (half an ulp,
// relative): 2^-11 for fp16, 2^-8 for bf16.
template <typename T>
struct Half16;
template <>
struct Half16<__half> {
  static constexpr kernels::KvDtype kDtype = kernels::KvDtype::kF16;
  static constexpr double kRoundoff = 1.0 / 2048;
};
template <>
struct Half16<__nv_bfloat16> {
  static constexpr kernels::KvDtype kDtype = kernels::KvDtype::kBF16;
  static constexpr double kRoundoff = 1.0 / 256;
};

inline std::vector<float> RandomNormal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

// Fills every row of every block of `pool` (a host pool) with RandomNormal(all values, seed),
// block by block, KV head by KV head, slot by slot, K then V.
inline void FillRandom(cache::BlockPool& pool, uint32_t seed) {
  const cache::KvLayout& layout = pool.layout();
  const std::vector<float> values = RandomNormal(
      size_t{2} * pool.num_blocks() * layout.num_kv_heads * layout.block_size * layout.head_dim,
      seed);
  const float* next = values.data();
  for (int32_t b = 0; b < pool.num_blocks(); ++b) {
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      for (int32_t s = 0; s < layout.block_size; ++s) {
        for (bool v : {false, true}) {
          pool.WriteRow(b, h, s, v, next);
          next += layout.head_dim;
        }
      }
    }
  }
}

// The values as `dtype` stores them (the CPU's rounding), back in float.
inline std::vector<float> RoundedTo(kernels::KvDtype dtype, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 2);
  kernels::EncodeKv(dtype, values.data(), static_cast<int64_t>(values.size()), bytes.data());
  std::vector<float> out(values.size());
  kernels::DecodeKv(dtype, bytes.data(), static_cast<int64_t>(values.size()), out.data());
  return out;
}

template <typename T>
kernels::cuda::DeviceBuffer<T> Allocate(int64_t count) {
  absl::StatusOr<kernels::cuda::DeviceBuffer<T>> buffer =
      kernels::cuda::DeviceBuffer<T>::Allocate(count);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return buffer.ok() ? *std::move(buffer) : kernels::cuda::DeviceBuffer<T>();
}

// A device copy of plain values (float, int32_t, int64_t, std::byte).
template <typename T>
kernels::cuda::DeviceBuffer<T> Upload(const std::vector<T>& host) {
  kernels::cuda::DeviceBuffer<T> buffer = Allocate<T>(static_cast<int64_t>(host.size()));
  if (!host.empty()) {
    EXPECT_TRUE(buffer.CopyFromHost(std::span<const T>(host)).ok());
  }
  return buffer;
}

template <typename T>
std::vector<T> Download(const kernels::cuda::DeviceBuffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  EXPECT_TRUE(buffer.CopyToHost(std::span<T>(host)).ok());
  return host;
}

// Floats stored on the device as T (__half or __nv_bfloat16), encoded by the CPU.
template <typename T>
kernels::cuda::DeviceBuffer<T> Upload16(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 2);
  kernels::EncodeKv(Half16<T>::kDtype, values.data(), static_cast<int64_t>(values.size()),
                    bytes.data());
  kernels::cuda::DeviceBuffer<T> buffer = Allocate<T>(static_cast<int64_t>(values.size()));
  EXPECT_EQ(cudaMemcpy(buffer.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  return buffer;
}

template <typename T>
std::vector<float> Download16(const kernels::cuda::DeviceBuffer<T>& buffer) {
  std::vector<std::byte> bytes(buffer.size() * 2);
  EXPECT_EQ(cudaMemcpy(bytes.data(), buffer.data(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<float> out(buffer.size());
  kernels::DecodeKv(Half16<T>::kDtype, bytes.data(), static_cast<int64_t>(out.size()),
                    out.data());
  return out;
}

// Waits for the kernels launched so far and returns their (asynchronous) errors.
inline absl::Status Synchronize() {
  return kernels::cuda::CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Every |got - want| <= abs_tol + rel_tol * |want|; reports the count and the worst element.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                        double rel_tol, double abs_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double{got[i]} - want[i]);
    const double excess = err - (abs_tol + rel_tol * std::abs(double{want[i]}));
    if (!(excess <= 0)) ++bad;  // NaN counts as bad
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance; worst at " << worst << ": got "
                     << got[worst] << ", want " << want[worst];
}

}  // namespace winnow::testing
