// The transformer forward on one GPU: the same varlen batch, the same semantics and the same
// ForwardOutput as the CPU forward (model/cpu_forward.h), computed with cuBLAS GEMMs, FlashInfer's
// paged attention and the kernels of kernels/cuda (docs/gpu.md, "CUDA worker").
//
// What lives where. The weights are on the device as bf16, dequantised from the loaded model's
// weights (model/model.h) on the host at load (2 bytes per parameter, whatever the file's
// quantisation). The K/V data lives in a device arena of pool.num_blocks() x
// layout.bytes_per_block() bytes, laid out exactly as the host pool's (cache/block_pool.h); the
// host BlockPool keeps the bookkeeping (free list, references, prefix index) and the sequences'
// block tables, so block ids mean the same on both sides. Activations are bf16 with a float32
// residual stream (kernels/cuda/ops.h); the logits are float32 and are copied to the host for
// the sampler.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "kernels/cuda/sparse_attention.h"
#include "model/cuda_kv_device.h"
#include "model/forward_backend.h"
#include "model/model.h"

namespace winnow::kernels::cuda {
class GraphCache;
}  // namespace winnow::kernels::cuda

namespace winnow::model {

class CudaModel : public ForwardBackend {
 public:
  // Uploads `model`'s weights to GPU `device` and allocates the device KV arena for `pool`,
  // whose K/V must be bf16 (the activation type the attention kernels read queries in) and
  // whose head_dim must be one the attention kernels are instantiated for (64, 128). Both must
  // outlive the CudaModel. InvalidArgument names what does not fit; ResourceExhausted /
  // Internal carry the CUDA error when memory cannot be had.
  // With `limits`, the activations for such batches are allocated here (a larger batch still
  // runs: its buffers grow).
  // `threads` (the worker's, which must outlive the CudaModel) run the host side of the hooks.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const Model& model,
                                                           const cache::BlockPool& pool,
                                                           kernels::ThreadPool& threads,
                                                           int32_t device,
                                                           const ForwardLimits& limits = {});
  // Device bytes a CudaModel of `model` takes besides its KV arena, for batches within
  // `limits`: the bf16 weights, the activations, and the cuBLAS and FlashInfer workspaces.
  static int64_t DeviceBytesBesidesKv(const Model& model, const ForwardLimits& limits);
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // The forward on the GPU, over `pool`'s block tables and this model's device arena, with
  // the compression hooks: query capture (the post-RoPE rows are copied to the host, as bf16
  // values in float), a decode token's attention probabilities, and attention selection
  // (TokenSelect: the selector votes on the device, a decode token whose selection applies
  // attends to its slot list, kernels/cuda/sparse_attention.h); a selector on an entry of more
  // than one token is FailedPrecondition (the engine selects at decode only). Not
  // thread-safe: one engine thread owns it.
  absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                       ForwardOutput* out) override;

  // The device arena as the cache's block operations see it (cache/kv_device.h; the worker
  // attaches it to the pool) and as the compression hooks score it (cache/scoring_backend.h).
  cache::KvDevice& kv_device();
  cache::KvDevice* KvDeviceToAttach() override { return &kv_device(); }
  cache::ScoringBackend& Scoring(const cache::BlockPool& pool) override;

  // Decode-only forwards (one token per entry, no query capture) of up to kMaxGraphRows rows
  // replay CUDA graphs (kernels/cuda/graph_cache.h) per batch-size bucket (the next power of
  // two; the padding rows compute and are dropped): the work between two layers' attention
  // calls is one graph launch, while the attention (FlashInfer, whose schedule follows the
  // sequences' lengths) and the compression hooks run as before. A bucket's first forward runs
  // eagerly, its second captures. On by default; off launches every kernel.
  static constexpr int64_t kMaxGraphRows = 256;
  void set_cuda_graphs(bool on) { graphs_on_ = on; }
  bool cuda_graphs() const { return graphs_on_; }
  // Why capturing failed (the graphs then turned themselves off); OK while it has not.
  absl::Status graph_capture_error() const;
  // Graphs held: (layers + 1) per bucket seen since the buffers last moved.
  int64_t cuda_graph_count() const;

  int32_t device() const { return device_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  struct Weights;
  struct Scratch;
  struct HostInputs;
  CudaModel(const Model& model, kernels::ThreadPool& threads, int32_t device);

  absl::Status Init(const cache::BlockPool& pool);
  // Grows the activation buffers to hold a batch of `rows` rows with `logits_rows` logits rows.
  absl::Status ReserveActivations(int64_t rows, int64_t logits_rows);
  absl::Status Upload(const HostInputs& in);
  // The forward after its inputs: every layer (eager or through the graphs), then the logits.
  absl::Status RunAll(std::span<const BatchEntry> batch, const HostInputs& in, bool graphs,
                      const cache::BlockPool& pool, ForwardOutput* out);
  absl::Status RunLayer(int32_t layer, std::span<const BatchEntry> batch,
                        const HostInputs& in, const cache::BlockPool& pool);
  // The parts of a layer: what comes before the attention (norm with the previous layer's
  // residual, QKV, RoPE, KV append), the attention with the hooks around it, and what comes
  // after (output projection, norm, MLP). The first and last only queue kernels on rows of
  // fixed buffers, so a graph can hold them.
  absl::Status PreAttention(int32_t layer, int64_t rows);
  absl::Status Attend(int32_t layer, std::span<const BatchEntry> batch, const HostInputs& in,
                      const cache::BlockPool& pool);
  absl::Status PostAttention(int32_t layer, int64_t rows);
  absl::Status Embed(int64_t rows);
  // The rows a CUDA-graph forward of `batch` runs (its bucket), or 0 for an eager forward.
  int64_t GraphRows(std::span<const BatchEntry> batch, int64_t rows) const;
  // Every layer through the graphs of in.rows (a bucket; `in` padded to it).
  absl::Status RunLayersWithGraphs(std::span<const BatchEntry> batch, const HostInputs& in,
                                   const cache::BlockPool& pool);
  // The compression hooks that read `layer`'s rows on the device after its attention
  // (QueryCapture::layer_done, then device_plan), given the rows and their log-sum-exps.
  absl::Status RunCaptureHooks(int32_t layer, std::span<const BatchEntry> batch,
                               const HostInputs& in);
  // The query rows of `layer` the compression hooks read on the host (its K/V are in the arena,
  // its queries in Scratch::q), and the captured positions.
  absl::Status CaptureQueries(int32_t layer, std::span<const BatchEntry> batch,
                              const HostInputs& in, const cache::BlockPool& pool);
  // A decode token's attention probabilities (BatchEntry::attention_probs): the host buffer
  // for every layer's sized before the layers run; each layer's queued without a wait; handed
  // out after the forward's last wait.
  absl::Status ReserveProbabilities(std::span<const BatchEntry> batch);
  absl::Status AttentionProbabilities(int32_t layer, std::span<const BatchEntry> batch,
                                      const HostInputs& in);
  void FinishProbabilities(std::span<const BatchEntry> batch);
  // Asks the selectors of `batch` (TokenSelect, one decode token each) for their slots in
  // `layer` and uploads the lists of those that attend sparsely.
  absl::StatusOr<kernels::cuda::DeviceSparseDecode> SelectSlots(
      int32_t layer, std::span<const BatchEntry> batch, const HostInputs& in,
      const cache::BlockPool& pool);
  absl::Status Logits(const HostInputs& in, ForwardOutput* out);
  // y[m x n] = x[m x k] * w^T on the stream (bf16 in, bf16 or float32 out).
  absl::Status Linear(const void* w, int64_t n, int64_t k, const void* x, int64_t m, void* y,
                      bool float_output = false);

  const Model& model_;
  kernels::ThreadPool& threads_;
  int32_t device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<CudaKvDevice> kv_device_;
  int64_t weight_bytes_ = 0;
  int64_t arena_bytes_ = 0;
  int32_t pool_block_size_ = 0;
  bool graphs_on_ = true;
  std::unique_ptr<kernels::cuda::GraphCache> graphs_;
  // The activation buffers the graphs were captured with: they hold these addresses.
  std::vector<const void*> graph_buffers_;
};

}  // namespace winnow::model
