// What FlashInfer's decode and prefill instantiations share: the attention variant and
// cache::KvLayout's block as FlashInfer's paged KV cache. Included only by
// kernels/cuda/flashinfer_{decode,prefill}.cuh.
#pragma once

#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include "kernels/cuda/flashinfer_attention.h"

namespace winnow::kernels::cuda {

// Plain softmax attention: no custom mask, sliding window, logits soft cap or ALiBi.
using FlashInferVariant = flashinfer::DefaultAttention<false, false, false, false>;

// cache::KvLayout's block as FlashInfer's HND page: strides of [page, kv_head, slot] in
// elements, with V at its own base pointer v_offset elements after K.
template <typename T>
flashinfer::paged_kv_t<T, int32_t> PagedKv(const FlashInferCall& c, int head_dim) {
  const int64_t strides[3] = {c.page_stride, int64_t{c.block_size} * head_dim, head_dim};
  T* k = static_cast<T*>(const_cast<void*>(c.arena));
  return flashinfer::paged_kv_t<T, int32_t>(
      c.num_kv_heads, c.block_size, head_dim, c.batch, flashinfer::QKVLayout::kHND, k,
      k + c.v_offset, strides, const_cast<int32_t*>(c.kv_indices),
      const_cast<int32_t*>(c.kv_indptr), const_cast<int32_t*>(c.last_page_len));
}

}  // namespace winnow::kernels::cuda
