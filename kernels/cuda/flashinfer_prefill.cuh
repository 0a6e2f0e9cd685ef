// FlashInferPrefill's definition: included only by the instantiation units in
// kernels/cuda/attention_inst/ (it pulls in FlashInfer's prefill templates).
#pragma once

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flashinfer_attention.h"
#include "kernels/cuda/flashinfer_common.cuh"

namespace winnow::kernels::cuda {

template <typename T, int HEAD_DIM, uint32_t CTA_TILE_Q, typename Params>
cudaError_t LaunchPrefill(const Params& params, T* tmp_v, float* tmp_s, cudaStream_t stream) {
  using namespace flashinfer;
  // K and V share their strides (only their base pointers differ); causal: token i of a
  // sequence with q new tokens and n slots sees slots [0, n - q + i], as on the CPU.
  return BatchPrefillWithPagedKVCacheDispatched<
      /*SAME_KV_STRIDES=*/true, CTA_TILE_Q, HEAD_DIM, HEAD_DIM, PosEncodingMode::kNone,
      /*USE_FP16_QK_REDUCTION=*/false, MaskMode::kCausal, FlashInferVariant, Params>(
      params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
}

template <typename T, int HEAD_DIM>
cudaError_t FlashInferPrefillUnchecked(const FlashInferCall& c) {
  using namespace flashinfer;
  using Params = BatchPrefillPagedParams<T, T, T, int32_t>;
  PrefillPlanInfo plan;
  if (c.replan) {
    cudaError_t status = PrefillPlan<int32_t>(
        c.float_workspace, c.float_workspace_bytes, c.int_workspace, c.host_int_workspace,
        c.int_workspace_bytes, plan, const_cast<int32_t*>(c.qo_indptr_host),
        const_cast<int32_t*>(c.kv_indptr_host), c.total_rows, c.batch, c.num_heads,
        c.num_kv_heads, HEAD_DIM, HEAD_DIM, c.block_size, /*enable_cuda_graph=*/false,
        /*sizeof_dtype_o=*/sizeof(T), /*window_left=*/-1, /*fixed_split_size=*/-1,
        /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/0, c.stream,
        /*kv_dtype_bytes=*/sizeof(T));
    if (status != cudaSuccess) return status;
    *c.plan = plan.ToVector();
  } else {
    plan.FromVector(*c.plan);
  }

  Params params(static_cast<T*>(const_cast<void*>(c.q)), PagedKv<T>(c, HEAD_DIM),
                /*maybe_custom_mask=*/nullptr,
                const_cast<int32_t*>(c.qo_indptr), /*maybe_mask_indptr=*/nullptr,
                /*maybe_q_rope_offset=*/nullptr, static_cast<T*>(c.out), c.lse,
                /*maybe_alibi_slopes=*/nullptr, c.num_heads,
                /*q_stride_n=*/c.num_heads * HEAD_DIM, /*q_stride_h=*/HEAD_DIM,
                /*window_left=*/-1, /*logits_soft_cap=*/0.0f, c.scale, /*rope_scale=*/1.0f,
                /*rope_theta=*/1.0f);
  void* ints = c.int_workspace;
  params.request_indices = GetPtrFromBaseOffset<int32_t>(ints, plan.request_indices_offset);
  params.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(ints, plan.qo_tile_indices_offset);
  params.kv_tile_indices = GetPtrFromBaseOffset<int32_t>(ints, plan.kv_tile_indices_offset);
  params.o_indptr = GetPtrFromBaseOffset<int32_t>(ints, plan.o_indptr_offset);
  params.kv_chunk_size_ptr = GetPtrFromBaseOffset<int32_t>(ints, plan.kv_chunk_size_ptr_offset);
  params.padded_batch_size = plan.padded_batch_size;
  params.max_total_num_rows = plan.total_num_rows;
  T* tmp_v = nullptr;
  float* tmp_s = nullptr;
  if (plan.split_kv) {
    params.merge_indptr = GetPtrFromBaseOffset<int32_t>(ints, plan.merge_indptr_offset);
    tmp_v = GetPtrFromBaseOffset<T>(c.float_workspace, plan.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(c.float_workspace, plan.s_offset);
  }
  // The planner picks the query tile; FlashInfer's FA2 planner chooses 16, 64 or 128 for head
  // dims below 512, the three instantiated here.
  switch (plan.cta_tile_q) {
    case 16:
      return LaunchPrefill<T, HEAD_DIM, 16>(params, tmp_v, tmp_s, c.stream);
    case 64:
      return LaunchPrefill<T, HEAD_DIM, 64>(params, tmp_v, tmp_s, c.stream);
    case 128:
      return LaunchPrefill<T, HEAD_DIM, 128>(params, tmp_v, tmp_s, c.stream);
    default:
      return cudaErrorNotSupported;
  }
}

template <typename T, int HEAD_DIM>
absl::Status FlashInferPrefill(const FlashInferCall& call) {
  try {
    return CudaStatus(FlashInferPrefillUnchecked<T, HEAD_DIM>(call), "FlashInfer batch prefill");
  } catch (const std::exception& e) {  // FlashInfer reports unsupported shapes by throwing
    return absl::InternalError(absl::StrCat("FlashInfer batch prefill: ", e.what()));
  }
}

}  // namespace winnow::kernels::cuda
