// The transformer forward on one GPU: the same varlen batch, the same semantics and the same
// ForwardOutput as Model::Forward (model/model.h), computed with cuBLAS GEMMs, FlashInfer's
// paged attention and the kernels of kernels/cuda (docs/gpu.md, "CUDA worker").
//
// What lives where. The weights are on the device as bf16, dequantised from the GGUF on the
// host at load (2 bytes per parameter, whatever the file's quantisation). The K/V data lives in
// a device arena of pool.num_blocks() x layout.bytes_per_block() bytes, laid out exactly as the
// host pool's (cache/block_pool.h); the host BlockPool keeps the bookkeeping (free list,
// references, prefix index) and the sequences' block tables, so block ids mean the same on both
// sides. Activations are bf16 with a float32 residual stream (kernels/cuda/ops.h); the logits
// are float32 and are copied to the host for the sampler.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "model/cuda_kv_device.h"
#include "model/model.h"

namespace winnow::model {

class CudaModel {
 public:
  // Uploads `model`'s weights to GPU `device` and allocates the device KV arena for `pool`,
  // whose K/V must be bf16 (the activation type the attention kernels read queries in) and
  // whose head_dim must be one the attention kernels are instantiated for (64, 128). Both must
  // outlive the CudaModel. InvalidArgument names what does not fit; ResourceExhausted /
  // Internal carry the CUDA error when memory cannot be had.
  // With `limits`, the activations for such batches are allocated here (a larger batch still
  // runs: its buffers grow).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const Model& model,
                                                           const cache::BlockPool& pool,
                                                           int32_t device,
                                                           const ForwardLimits& limits = {});
  // Device bytes a CudaModel of `model` takes besides its KV arena, for batches within
  // `limits`: the bf16 weights, the activations, and the cuBLAS and FlashInfer workspaces.
  static int64_t DeviceBytesBesidesKv(const Model& model, const ForwardLimits& limits);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Model::Forward on the GPU, over `pool`'s block tables and this model's device arena, with
  // the compression hooks: query capture (the post-RoPE rows are copied to the host, as bf16
  // values in float) and a decode token's attention probabilities. Attention selection
  // (TokenSelect) is not on the GPU: an entry with a selector is FailedPrecondition. Not
  // thread-safe: one engine thread owns it.
  absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                       ForwardOutput* out);

  // The device arena as the cache's compaction and scoring see it (cache/kv_device.h); the
  // worker attaches it to the pool.
  cache::KvDevice& kv_device();

  int32_t device() const { return device_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  struct Weights;
  struct Scratch;
  struct HostInputs;
  CudaModel(const Model& model, int32_t device);

  absl::Status Init(const cache::BlockPool& pool);
  // Grows the activation buffers to hold a batch of `rows` rows with `logits_rows` logits rows.
  absl::Status ReserveActivations(int64_t rows, int64_t logits_rows);
  absl::Status Upload(const HostInputs& in);
  absl::Status RunLayer(int32_t layer, std::span<const BatchEntry> batch,
                        const HostInputs& in, const cache::BlockPool& pool);
  // The compression hooks of `layer` (its K/V are in the arena, its queries in Scratch::q).
  absl::Status CaptureQueries(int32_t layer, std::span<const BatchEntry> batch,
                              const HostInputs& in, const cache::BlockPool& pool);
  absl::Status AttentionProbabilities(int32_t layer, std::span<const BatchEntry> batch,
                                      const HostInputs& in);
  absl::Status Logits(const HostInputs& in, ForwardOutput* out);
  // y[m x n] = x[m x k] * w^T on the stream (bf16 in, bf16 or float32 out).
  absl::Status Linear(const void* w, int64_t n, int64_t k, const void* x, int64_t m, void* y,
                      bool float_output = false);

  const Model& model_;
  int32_t device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<CudaKvDevice> kv_device_;
  int64_t weight_bytes_ = 0;
  int64_t arena_bytes_ = 0;
  int32_t pool_block_size_ = 0;
};

}  // namespace winnow::model
