// An owned allocation of device memory: freed when the buffer is destroyed, movable, never
// copied. Allocation and copies return absl::Status (out-of-memory is an error the caller
// reports, not an abort).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t count) {
    DeviceBuffer buffer;
    if (count > 0) {
      WINNOW_CUDA_RETURN_IF_ERROR(
          cudaMalloc(reinterpret_cast<void**>(&buffer.data_), sizeof(T) * count));
    }
    buffer.size_ = count;
    return buffer;
  }
  // A device copy of `host`.
  static absl::StatusOr<DeviceBuffer> FromHost(std::span<const T> host) {
    WINNOW_ASSIGN_OR_RETURN(DeviceBuffer buffer, Allocate(static_cast<int64_t>(host.size())));
    WINNOW_RETURN_IF_ERROR(buffer.CopyFromHost(host));
    return buffer;
  }

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(T)); }

  // Synchronous copies of the first host.size() elements.
  absl::Status CopyFromHost(std::span<const T> host) {
    if (static_cast<int64_t>(host.size()) > size_) {
      return absl::OutOfRangeError("DeviceBuffer::CopyFromHost: host span larger than buffer");
    }
    return CudaStatus(cudaMemcpy(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice),
                      "cudaMemcpy host->device");
  }
  absl::Status CopyToHost(std::span<T> host) const {
    if (static_cast<int64_t>(host.size()) > size_) {
      return absl::OutOfRangeError("DeviceBuffer::CopyToHost: host span larger than buffer");
    }
    return CudaStatus(cudaMemcpy(host.data(), data_, host.size_bytes(), cudaMemcpyDeviceToHost),
                      "cudaMemcpy device->host");
  }

 private:
  void Release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

// Grows `buffer` to hold at least `count` elements (at least doubling, so a growing batch
// reallocates rarely); the contents are not kept.
template <typename T>
absl::Status Reserve(DeviceBuffer<T>& buffer, int64_t count) {
  if (buffer.size() >= count) return absl::OkStatus();
  WINNOW_ASSIGN_OR_RETURN(
      buffer, DeviceBuffer<T>::Allocate(count > 2 * buffer.size() ? count : 2 * buffer.size()));
  return absl::OkStatus();
}

// Copies `host` into the front of `buffer` (grown as needed) in `stream`'s order. From pageable
// memory the call returns once `host` has been read, so the caller may change it after.
template <typename T>
absl::Status UploadAsync(DeviceBuffer<T>& buffer, const std::vector<T>& host,
                         cudaStream_t stream) {
  WINNOW_RETURN_IF_ERROR(Reserve(buffer, host.empty() ? 1 : static_cast<int64_t>(host.size())));
  if (host.empty()) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(buffer.data(), host.data(), host.size() * sizeof(T),
                                    cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync host->device");
}

// An owned allocation of page-locked host memory (cudaMallocHost): copies from it to the device
// are truly asynchronous, so the host must not overwrite what a pending copy has yet to read.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(int64_t count) {
    PinnedBuffer buffer;
    if (count > 0) {
      WINNOW_CUDA_RETURN_IF_ERROR(
          cudaMallocHost(reinterpret_cast<void**>(&buffer.data_), sizeof(T) * count));
    }
    buffer.size_ = count;
    return buffer;
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

// Uploads small host arrays (block tables, slot lists) on a stream without waiting for it: a
// copy from pageable memory makes cudaMemcpyAsync drain the stream first, so each array is
// first copied into a page-locked staging buffer, back to back, and sent from there. The staged
// bytes must stay until their copy has run: when the buffer is full the stream is drained and
// staging starts over (PagedAttention stages its page tables the same way).
class PinnedStager {
 public:
  template <typename T>
  absl::Status Upload(std::span<const T> host, DeviceBuffer<T>& dst, cudaStream_t stream) {
    WINNOW_RETURN_IF_ERROR(Reserve(dst, host.empty() ? 1 : static_cast<int64_t>(host.size())));
    if (host.empty()) return absl::OkStatus();
    const int64_t bytes = static_cast<int64_t>(host.size_bytes());
    const int64_t aligned = (bytes + 15) / 16 * 16;
    if (used_ + aligned > staging_.size()) {
      WINNOW_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      used_ = 0;
      if (aligned > staging_.size()) {
        WINNOW_ASSIGN_OR_RETURN(staging_, PinnedBuffer<std::byte>::Allocate(
                                              std::max<int64_t>(4 * aligned, int64_t{1} << 20)));
      }
    }
    std::byte* staged = staging_.data() + used_;
    std::memcpy(staged, host.data(), bytes);
    used_ += aligned;
    return CudaStatus(
        cudaMemcpyAsync(dst.data(), staged, bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (staged)");
  }

 private:
  PinnedBuffer<std::byte> staging_;
  int64_t used_ = 0;
};

// Device-to-host copies completed together: each is queued into page-locked staging, so the
// copy itself waits for nothing, and Finish() waits for the stream once and moves every staged
// result to its host destination. Staging grows while copies are pending (a new page-locked
// block when the current one is full) and is merged into one block at Finish, so a steady
// workload stops allocating after its first rounds.
class PinnedDownloads {
 public:
  template <typename T>
  absl::Status Queue(const T* device, int64_t count, T* host, cudaStream_t stream) {
    if (count <= 0) return absl::OkStatus();
    const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
    if (blocks_.empty() || used_ + bytes > blocks_.back().size()) {
      WINNOW_ASSIGN_OR_RETURN(PinnedBuffer<std::byte> block,
                              PinnedBuffer<std::byte>::Allocate(
                                  std::max<int64_t>(4 * bytes, int64_t{1} << 20)));
      blocks_.push_back(std::move(block));
      used_ = 0;
    }
    std::byte* staged = blocks_.back().data() + used_;
    used_ += (bytes + 15) / 16 * 16;
    pending_.push_back({staged, host, bytes});
    return CudaStatus(cudaMemcpyAsync(staged, device, bytes, cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync (download)");
  }

  // Waits for the stream and copies every pending result out; on an error, drops them.
  absl::Status Finish(cudaStream_t stream) {
    if (pending_.empty()) return absl::OkStatus();
    const cudaError_t synced = cudaStreamSynchronize(stream);
    // After a failure the results are dropped: their destinations may not outlive the error.
    if (synced == cudaSuccess) {
      for (const Pending& p : pending_) std::memcpy(p.host, p.staged, p.bytes);
    }
    pending_.clear();
    WINNOW_RETURN_IF_ERROR(CudaStatus(synced, "cudaStreamSynchronize (downloads)"));
    used_ = 0;
    if (blocks_.size() > 1) {
      int64_t total = 0;
      for (const PinnedBuffer<std::byte>& b : blocks_) total += b.size();
      blocks_.clear();
      WINNOW_ASSIGN_OR_RETURN(PinnedBuffer<std::byte> merged,
                              PinnedBuffer<std::byte>::Allocate(total));
      blocks_.push_back(std::move(merged));
    }
    return absl::OkStatus();
  }

 private:
  struct Pending {
    const std::byte* staged;
    void* host;
    int64_t bytes;
  };
  std::vector<PinnedBuffer<std::byte>> blocks_;  // the last one fills
  int64_t used_ = 0;                             // bytes of blocks_.back() in use
  std::vector<Pending> pending_;
};

}  // namespace winnow::kernels::cuda
