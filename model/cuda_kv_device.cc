#include "model/cuda_kv_device.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "base/status_macros.h"
#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/compaction.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scoring.h"
#include "kernels/cuda/window_top_k.h"

namespace winnow::model {

namespace kc = kernels::cuda;

// CompactToWindowTopK passes the policy's enums to the kernel's by value.
static_assert(static_cast<int>(cache::policies::Pooling::kNone) ==
                  static_cast<int>(kc::KeyPooling::kNone) &&
              static_cast<int>(cache::policies::Pooling::kAvg) ==
                  static_cast<int>(kc::KeyPooling::kAvg) &&
              static_cast<int>(cache::policies::Pooling::kMax) ==
                  static_cast<int>(kc::KeyPooling::kMax));
static_assert(static_cast<int>(cache::policies::GroupAggregation::kSum) ==
                  static_cast<int>(kc::HeadFolding::kSum) &&
              static_cast<int>(cache::policies::GroupAggregation::kMean) ==
                  static_cast<int>(kc::HeadFolding::kMean) &&
              static_cast<int>(cache::policies::GroupAggregation::kMax) ==
                  static_cast<int>(kc::HeadFolding::kMax));

namespace {

// Copies `count` device floats into host memory, in the stream's order (waited for by Sync).
absl::Status Download(const float* device, int64_t count, float* host, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  return kc::CudaStatus(cudaMemcpyAsync(host, device, count * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream),
                        "cudaMemcpyAsync device->host");
}

bool ColumnMax(const kernels::ScoreInput& in) {
  return in.reduce == kernels::ColumnReduce::kMax;
}

}  // namespace

absl::Status CudaKvDevice::Sync() {
  return kc::CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (KV device)");
}

absl::Status CudaKvDevice::CopyBlock(int32_t from, int32_t to) {
  const int64_t bytes = kv_.bytes_per_block;
  return kc::CudaStatus(cudaMemcpyAsync(kv_.arena + to * bytes, kv_.arena + from * bytes, bytes,
                                        cudaMemcpyDeviceToDevice, stream_),
                        "cudaMemcpyAsync CopyBlock");
}

absl::Status CudaKvDevice::CompactLayer(std::span<const int32_t> table,
                                        const cache::policies::LayerKeep& keep) {
  const int32_t kept = keep.kept();
  WINNOW_RETURN_IF_ERROR(Upload(table, table_));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(scratch_, kc::CompactionScratchBytes(kv_, kept)));
  if (keep.merge.empty()) {
    std::vector<int32_t> slots;
    slots.reserve(static_cast<size_t>(kv_.num_kv_heads) * kept);
    for (const std::vector<int32_t>& head : keep.heads) {
      slots.insert(slots.end(), head.begin(), head.end());
    }
    WINNOW_RETURN_IF_ERROR(Upload(std::span<const int32_t>(slots), slots_));
    return kc::CompactLayer(kv_, table_.data(), table_.data(), slots_.data(), kept,
                            scratch_.data(), stream_);
  }
  // Merge groups as offsets into one source list; a head without merges is groups of one.
  std::vector<int32_t> offsets = {0};
  std::vector<int32_t> sources;
  for (int32_t h = 0; h < kv_.num_kv_heads; ++h) {
    const bool merged = !keep.merge[h].empty();
    for (int32_t i = 0; i < kept; ++i) {
      if (merged) {
        sources.insert(sources.end(), keep.merge[h][i].begin(), keep.merge[h][i].end());
      } else {
        sources.push_back(keep.heads[h][i]);
      }
      offsets.push_back(static_cast<int32_t>(sources.size()));
    }
  }
  WINNOW_RETURN_IF_ERROR(Upload(std::span<const int32_t>(offsets), offsets_));
  WINNOW_RETURN_IF_ERROR(Upload(std::span<const int32_t>(sources), slots_));
  return kc::MergeLayer(kv_, table_.data(), offsets_.data(), slots_.data(), kept,
                        scratch_.data(), stream_);
}

absl::Status CudaKvDevice::UploadScoreInput(const kernels::ScoreInput& in) {
  const int32_t blocks = (in.num_slots + kv_.block_size - 1) / kv_.block_size;
  WINNOW_RETURN_IF_ERROR(Upload(std::span<const int32_t>(in.block_table, blocks), table_));
  WINNOW_RETURN_IF_ERROR(Upload(std::span<const int32_t>(in.visible, in.num_rows), visible_));
  return kc::Reserve(lse_, std::max<int64_t>(1, int64_t{in.num_heads} * in.num_rows));
}

absl::StatusOr<kc::DeviceScoreInput<float>> CudaKvDevice::UploadHostQuery(
    const kernels::ScoreInput& in) {
  const int64_t q_floats = int64_t{in.num_rows} * in.num_heads * kv_.head_dim;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(q_, q_floats));
  // Pageable: the copy returns once `in.q` has been read (the caller waits for results anyway).
  WINNOW_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(q_.data(), in.q, q_floats * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
  return kc::DeviceScoreInput<float>{table_.data(), in.num_slots,  q_.data(),
                                     in.num_rows,   visible_.data(), in.num_heads,
                                     in.scale,      ColumnMax(in)};
}

absl::Status CudaKvDevice::AttentionProbabilities(const kernels::ScoreInput& in, float* probs,
                                                  float* log_normalizer) {
  if (in.num_rows == 0) return absl::OkStatus();
  WINNOW_RETURN_IF_ERROR(UploadScoreInput(in));
  const int64_t rows = int64_t{in.num_heads} * in.num_rows;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(probs_, std::max<int64_t>(1, rows * in.num_slots)));
  WINNOW_ASSIGN_OR_RETURN(const kc::DeviceScoreInput<float> d, UploadHostQuery(in));
  WINNOW_RETURN_IF_ERROR(
      kc::AttentionProbabilities(kv_, d, probs_.data(), lse_.data(), stream_));
  WINNOW_RETURN_IF_ERROR(Download(probs_.data(), rows * in.num_slots, probs, stream_));
  if (log_normalizer != nullptr) {
    WINNOW_RETURN_IF_ERROR(Download(lse_.data(), rows, log_normalizer, stream_));
  }
  return Sync();
}

absl::Status CudaKvDevice::ColumnSumsOnDevice(const kernels::ScoreInput& in,
                                              const cache::DeviceRows& device) {
  const int64_t sums = int64_t{in.num_heads} * in.num_slots;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(sums_, sums));
  WINNOW_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sums_.data(), 0, sums * sizeof(float), stream_));
  if (device.q == nullptr) {
    WINNOW_ASSIGN_OR_RETURN(const kc::DeviceScoreInput<float> d, UploadHostQuery(in));
    return kc::AccumulateAttentionColumns(kv_, d, sums_.data(), lse_.data(), stream_);
  }
  // The forward's own rows: bf16, the CUDA worker's activation and KV dtype.
  kc::DeviceScoreInput<__nv_bfloat16> d{table_.data(),   in.num_slots,
                                        static_cast<const __nv_bfloat16*>(device.q),
                                        in.num_rows,     visible_.data(),
                                        in.num_heads,    in.scale,
                                        ColumnMax(in)};
  if (device.lse_log2 != nullptr && kv_.dtype == kernels::KvDtype::kBF16 &&
      (kv_.head_dim == 64 || kv_.head_dim == 128)) {
    return kc::ColumnSumsFromLse(kv_, d, device.lse_log2, sums_.data(), stream_);
  }
  return kc::AccumulateAttentionColumns(kv_, d, sums_.data(), lse_.data(), stream_);
}

absl::Status CudaKvDevice::ColumnSumsDeferred(const kernels::ScoreInput& in,
                                              float* column_sums,
                                              const cache::DeviceRows& device) {
  const int64_t count = int64_t{in.num_heads} * in.num_slots;
  if (in.num_rows == 0) {
    std::fill(column_sums, column_sums + count, 0.0f);
    return absl::OkStatus();
  }
  WINNOW_RETURN_IF_ERROR(UploadScoreInput(in));
  WINNOW_RETURN_IF_ERROR(ColumnSumsOnDevice(in, device));
  return downloads_.Queue(sums_.data(), count, column_sums, stream_);
}

absl::Status CudaKvDevice::CompactToWindowTopK(const cache::WindowTopKRequest& r) {
  const int32_t n = r.num_slots;
  const int32_t window = std::clamp(r.window, 1, n);
  if (r.keep < 1 || r.keep >= n || r.device_rows.q == nullptr || r.kept_slots == nullptr ||
      r.visible.empty()) {
    return absl::InvalidArgumentError("CompactToWindowTopK: bad request");
  }
  kernels::ScoreInput in;
  in.block_table = r.block_table.data();
  in.num_slots = n;
  in.num_rows = static_cast<int32_t>(r.visible.size());
  in.visible = r.visible.data();
  in.num_heads = r.num_heads;
  in.scale = r.scale;
  WINNOW_RETURN_IF_ERROR(UploadScoreInput(in));
  WINNOW_RETURN_IF_ERROR(ColumnSumsOnDevice(in, r.device_rows));
  kc::WindowScoreShape shape;
  shape.num_heads = r.num_heads;
  shape.num_kv_heads = kv_.num_kv_heads;
  shape.num_slots = n;
  shape.prefix = n - window;
  shape.kernel = r.kernel;
  shape.pooling = static_cast<kc::KeyPooling>(r.pooling);
  shape.folding = static_cast<kc::HeadFolding>(r.folding);
  WINNOW_RETURN_IF_ERROR(
      kc::Reserve(scores_, std::max<int64_t>(1, int64_t{kv_.num_kv_heads} * shape.prefix)));
  WINNOW_RETURN_IF_ERROR(kc::PoolAndFoldWindowScores(sums_.data(), shape, scores_.data(), stream_));
  const int64_t kept = int64_t{kv_.num_kv_heads} * r.keep;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(kept_, kept));
  WINNOW_RETURN_IF_ERROR(kc::TopKWithWindow(scores_.data(), kv_.num_kv_heads, shape.prefix, n,
                                            r.keep, kept_.data(), stream_));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(scratch_, kc::CompactionScratchBytes(kv_, r.keep)));
  WINNOW_RETURN_IF_ERROR(kc::CompactLayer(kv_, table_.data(), table_.data(), kept_.data(), r.keep,
                                          scratch_.data(), stream_));
  return downloads_.Queue(kept_.data(), kept, r.kept_slots, stream_);
}

absl::Status CudaKvDevice::Flush() { return downloads_.Finish(stream_); }

absl::Status CudaKvDevice::AccumulateAttentionColumns(const kernels::ScoreInput& in,
                                                      float* column_sums,
                                                      const cache::DeviceRows& device) {
  if (in.num_rows == 0) return absl::OkStatus();
  WINNOW_RETURN_IF_ERROR(UploadScoreInput(in));
  const int64_t sums = int64_t{in.num_heads} * in.num_slots;
  WINNOW_RETURN_IF_ERROR(ColumnSumsOnDevice(in, device));
  std::vector<float> chunk(sums);
  WINNOW_RETURN_IF_ERROR(Download(sums_.data(), sums, chunk.data(), stream_));
  WINNOW_RETURN_IF_ERROR(Sync());
  if (ColumnMax(in)) {
    for (int64_t i = 0; i < sums; ++i) column_sums[i] = std::max(column_sums[i], chunk[i]);
  } else {
    for (int64_t i = 0; i < sums; ++i) column_sums[i] += chunk[i];
  }
  return absl::OkStatus();
}

absl::Status CudaKvDevice::ValueNorms(std::span<const int32_t> table, int32_t num_slots,
                                      float* norms) {
  if (num_slots == 0) return absl::OkStatus();
  WINNOW_RETURN_IF_ERROR(Upload(table, table_));
  const int64_t count = int64_t{kv_.num_kv_heads} * num_slots;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(sums_, count));
  WINNOW_RETURN_IF_ERROR(kc::ValueNorms(kv_, table_.data(), num_slots, sums_.data(), stream_));
  WINNOW_RETURN_IF_ERROR(Download(sums_.data(), count, norms, stream_));
  return Sync();
}

absl::Status CudaKvDevice::ValueNormsDeferred(std::span<const int32_t> table,
                                              int32_t num_slots, float* norms) {
  if (num_slots == 0) return absl::OkStatus();
  WINNOW_RETURN_IF_ERROR(Upload(table, table_));
  const int64_t count = int64_t{kv_.num_kv_heads} * num_slots;
  WINNOW_RETURN_IF_ERROR(kc::Reserve(sums_, count));  // stream order: after earlier downloads
  WINNOW_RETURN_IF_ERROR(kc::ValueNorms(kv_, table_.data(), num_slots, sums_.data(), stream_));
  return downloads_.Queue(sums_.data(), count, norms, stream_);
}

absl::Status CudaKvDevice::TokenSelectVote(std::span<const int32_t> table,
                                           std::span<const float> query, int32_t num_heads,
                                           int32_t begin, int32_t end, float scale,
                                           bool gqa_mod, float* vote) {
  if (begin == end) return absl::OkStatus();
  const int32_t blocks = (end + kv_.block_size - 1) / kv_.block_size;
  WINNOW_RETURN_IF_ERROR(Upload(table.first(blocks), table_));
  WINNOW_RETURN_IF_ERROR(Upload(query, q_));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(sums_, end - begin));
  WINNOW_RETURN_IF_ERROR(kc::Reserve(lse_, num_heads));
  WINNOW_RETURN_IF_ERROR(kc::TokenSelectVote(kv_, table_.data(), q_.data(), num_heads, begin, end,
                                             scale, gqa_mod, sums_.data(), lse_.data(),
                                             stream_));
  WINNOW_RETURN_IF_ERROR(Download(sums_.data(), end - begin, vote, stream_));
  return Sync();
}

}  // namespace winnow::model
