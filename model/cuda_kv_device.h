// The CUDA worker's device arena as the cache sees it: its block operations (cache/kv_device.h:
// MakePrivate's block copies, compaction by kernels/cuda/compaction.h) and its scoring backend
// (cache/scoring_backend.h: kernels/cuda/scoring.h and column_sums.h) run on the GPU, on the
// forward's stream, over the arena the forward writes. The host sends block tables, query rows
// and slot lists, and gets back only what the policies read: probabilities, column sums, value
// norms, TokenSelect's vote. Not thread-safe: the engine thread owns it, as it owns the
// CudaModel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_device.h"
#include "cache/scoring_backend.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/paged_kv.h"
#include "kernels/cuda/scoring.h"

namespace winnow::model {

class CudaKvDevice : public cache::KvDevice, public cache::ScoringBackend {
 public:
  // `kv` describes the arena (device memory that outlives this object); work is queued on
  // `stream`; the policies' host work runs on `host_threads` (the worker's). Column sums of
  // device rows that come with their log-sum-exps run on tensor cores
  // (kernels/cuda/column_sums.h), other rows on the direct kernel (kernels/cuda/scoring.h).
  CudaKvDevice(const kernels::cuda::DevicePagedKv& kv, cudaStream_t stream,
               kernels::ThreadPool& host_threads)
      : kv_(kv), stream_(stream), host_threads_(host_threads) {}

  absl::Status CopyBlock(int32_t from, int32_t to) override;
  absl::Status CompactLayer(std::span<const int32_t> table,
                            const cache::policies::LayerKeep& keep) override;
  absl::Status AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                      float* log_normalizer) override;
  absl::Status AccumulateAttentionColumns(const kernels::ScoreInput& in, float* column_sums,
                                          const cache::DeviceRows& device) override;
  absl::Status ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                          float* norms) override;
  absl::Status ValueNormsDeferred(std::span<const int32_t> table, int32_t num_slots,
                                  float* norms) override;
  absl::Status TokenSelectVote(std::span<const int32_t> table, std::span<const float> query,
                               int32_t num_heads, int32_t begin, int32_t end, float scale,
                               bool gqa_mod, float* vote) override;
  absl::Status ColumnSumsDeferred(const kernels::ScoreInput& in, float* column_sums,
                                  const cache::DeviceRows& device) override;
  absl::Status CompactToWindowTopK(const cache::WindowTopKRequest& request) override;
  absl::Status Flush() override;
  kernels::ThreadPool& host_threads() override { return host_threads_; }

  // A download of the forward's that completes with the deferred calls' (Flush).
  absl::Status QueueDownload(const float* device, int64_t count, float* host) {
    return downloads_.Queue(device, count, host, stream_);
  }

 private:
  template <typename T>
  using Buf = kernels::cuda::DeviceBuffer<T>;

  // Uploads the table and `visible` of `in` into table_ / visible_ (the q pointer is the
  // caller's), and sizes lse_ for its rows. (probs_ is AttentionProbabilities' alone: the
  // column sums of a long prefill chunk never need rows x keys floats.)
  absl::Status UploadScoreInput(const kernels::ScoreInput& in);
  // Uploads in.q (host float rows) into q_; the device input over table_, visible_ and q_.
  absl::StatusOr<kernels::cuda::DeviceScoreInput<float>> UploadHostQuery(
      const kernels::ScoreInput& in);
  template <typename T>
  absl::Status Upload(std::span<const T> host, Buf<T>& dst) {
    return stager_.Upload(host, dst, stream_);
  }
  // Waits for the queued work, so that downloads into host memory are complete.
  absl::Status Sync();
  // sums_ = the column sums of `in`'s rows (device.q: bf16 rows on the device; null: in.q on
  // the host), num_heads x in.num_slots, queued without waiting; UploadScoreInput(in) first.
  absl::Status ColumnSumsOnDevice(const kernels::ScoreInput& in, const cache::DeviceRows& device);

  kernels::cuda::DevicePagedKv kv_;
  cudaStream_t stream_;
  kernels::ThreadPool& host_threads_;
  // Grown on demand and reused: the transient of one call.
  Buf<int32_t> table_, visible_, slots_, offsets_;
  Buf<float> q_, probs_, lse_, sums_, scores_;
  Buf<int32_t> kept_;
  Buf<std::byte> scratch_;
  kernels::cuda::PinnedStager stager_;
  kernels::cuda::PinnedDownloads downloads_;  // the deferred calls' results, until Flush
};

}  // namespace winnow::model
