// FlashInferDecode's definition: included only by the instantiation units in
// kernels/cuda/attention_inst/ (it pulls in FlashInfer's decode templates).
#pragma once

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flashinfer_attention.h"
#include "kernels/cuda/flashinfer_common.cuh"

namespace winnow::kernels::cuda {

template <typename T, int HEAD_DIM>
cudaError_t FlashInferDecodeUnchecked(const FlashInferCall& c) {
  using namespace flashinfer;
  using Params = BatchDecodeParams<T, T, T, int32_t>;
  constexpr PosEncodingMode kNoRope = PosEncodingMode::kNone;  // keys are cached after RoPE
  DecodePlanInfo plan;
  if (c.replan) {
    cudaError_t status = cudaSuccess;
    DISPATCH_GQA_GROUP_SIZE(c.num_heads / c.num_kv_heads, GROUP_SIZE, {
      status = DecodePlan<HEAD_DIM, kNoRope, FlashInferVariant, Params>(
          c.float_workspace, c.float_workspace_bytes, c.int_workspace, c.host_int_workspace,
          c.int_workspace_bytes, plan, const_cast<int32_t*>(c.kv_indptr_host), c.batch,
          c.num_heads, c.block_size, /*enable_cuda_graph=*/false, c.stream,
          BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, HEAD_DIM, kNoRope,
                                                              FlashInferVariant, Params>);
    });
    if (status != cudaSuccess) return status;
    *c.plan = plan.ToVector();
  } else {
    plan.FromVector(*c.plan);
  }

  Params params(static_cast<T*>(const_cast<void*>(c.q)), /*q_rope_offset=*/nullptr,
                PagedKv<T>(c, HEAD_DIM), static_cast<T*>(c.out), c.lse,
                /*maybe_alibi_slopes=*/nullptr, c.num_heads,
                /*q_stride_n=*/c.num_heads * HEAD_DIM, /*q_stride_h=*/HEAD_DIM,
                /*window_left=*/-1, /*logits_soft_cap=*/0.0f, c.scale, /*rope_scale=*/1.0f,
                /*rope_theta=*/1.0f);
  params.request_indices = GetPtrFromBaseOffset<int32_t>(c.int_workspace,
                                                         plan.request_indices_offset);
  params.kv_tile_indices = GetPtrFromBaseOffset<int32_t>(c.int_workspace,
                                                         plan.kv_tile_indices_offset);
  params.o_indptr = GetPtrFromBaseOffset<int32_t>(c.int_workspace, plan.o_indptr_offset);
  params.kv_chunk_size_ptr = GetPtrFromBaseOffset<int32_t>(c.int_workspace,
                                                           plan.kv_chunk_size_ptr_offset);
  params.padded_batch_size = plan.padded_batch_size;
  T* tmp_v = nullptr;
  float* tmp_s = nullptr;
  if (plan.split_kv) {
    tmp_v = GetPtrFromBaseOffset<T>(c.float_workspace, plan.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(c.float_workspace, plan.s_offset);
  }
  return BatchDecodeWithPagedKVCacheDispatched<HEAD_DIM, kNoRope, FlashInferVariant>(
      params, tmp_v, tmp_s, /*enable_pdl=*/false, c.stream);
}

template <typename T, int HEAD_DIM>
absl::Status FlashInferDecode(const FlashInferCall& call) {
  try {
    return CudaStatus(FlashInferDecodeUnchecked<T, HEAD_DIM>(call), "FlashInfer batch decode");
  } catch (const std::exception& e) {  // FlashInfer reports unsupported shapes by throwing
    return absl::InternalError(absl::StrCat("FlashInfer batch decode: ", e.what()));
  }
}

}  // namespace winnow::kernels::cuda
