// The transformer forward on the CPU: the varlen batch of model/batch.h over the paged KV cache
// in a pool's host arena, with kernels/cpu on the caller's thread pool. Its stages mirror the
// CUDA forward's (model/cuda_model.h): the batch's rows, the embeddings, then per layer the
// pre-attention (norm, QKV, RoPE), each sequence's K/V append and compression hooks, the
// attention and the post-attention (output projection, MLP), then the logits of the rows that
// asked for them.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "cache/host_scoring.h"
#include "kernels/cpu/thread_pool.h"
#include "model/cpu_activations.h"
#include "model/forward_backend.h"
#include "model/model.h"

namespace winnow::kernels {
struct AttentionSequence;  // kernels/cpu/attention.h
}  // namespace winnow::kernels

namespace winnow::model {

class CpuForward : public ForwardBackend {
 public:
  // `model` and `threads` (the worker's, or the caller's) must outlive the forward. With
  // kQ8 activations the matrices that have an integer kernel multiply 8-bit activations.
  CpuForward(const Model& model, kernels::ThreadPool& threads,
             CpuActivations activations = CpuActivations::kF32);
  ~CpuForward() override;
  CpuForward(const CpuForward&) = delete;
  CpuForward& operator=(const CpuForward&) = delete;

  absl::Status Forward(std::span<const BatchEntry> batch, cache::BlockPool& pool,
                       ForwardOutput* out) override;
  cache::ScoringBackend& Scoring(const cache::BlockPool& pool) override;

  const Model& model() const { return model_; }

 private:
  struct Scratch;
  struct Pass;

  Pass LayOutRows(std::span<const BatchEntry> batch);
  absl::Status Embed(std::span<const BatchEntry> batch, const Pass& pass);
  absl::Status PreAttention(int32_t layer, const Pass& pass);
  void AppendKv(const BatchEntry& entry, int32_t layer, int32_t first_row,
                cache::BlockPool& pool, kernels::AttentionSequence* attention);
  absl::Status AttachAttentionHooks(const BatchEntry& entry, int32_t layer, int32_t first_row,
                                    kernels::AttentionSequence* attention,
                                    std::vector<int32_t>* selected);
  void FoldCapturedRows(const BatchEntry& entry, int32_t layer,
                        kernels::AttentionSequence* attention);
  absl::Status Attend(std::span<const BatchEntry> batch, int32_t layer,
                      const cache::BlockPool& pool, const Pass& pass);
  absl::Status PostAttention(int32_t layer, const Pass& pass);
  absl::Status Logits(std::span<const BatchEntry> batch, const Pass& pass, ForwardOutput* out);
  // RMSNorm of every row of the residual stream into the norm scratch.
  void NormRows(const std::vector<float>& weight, int64_t rows);
  // RMSNorm of `rows` hidden-size rows of x into out (which may be x).
  void NormRows(const std::vector<float>& weight, const float* x, int64_t rows, float* out);
  // QK-norm: `heads` head_dim-long vectors of x normalised in place.
  void NormHeads(const std::vector<float>& weight, float* x, int64_t heads);
  void CaptureQueries(std::span<const BatchEntry> batch, std::span<const int32_t> first_row,
                      int32_t layer, const float* q, int64_t q_dim,
                      const cache::BlockPool& pool);

  const Model& model_;
  kernels::ThreadPool& threads_;
  const CpuActivations activations_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<cache::HostScoring> scoring_;  // over the last pool Scoring was asked for
};

}  // namespace winnow::model
