// One FlashInfer instantiation per translation unit keeps each nvcc run short (docs/gpu.md).
#include "kernels/cuda/flashinfer_prefill.cuh"

namespace winnow::kernels::cuda {
template absl::Status FlashInferPrefill<__nv_bfloat16, 64>(const FlashInferCall& call);
}  // namespace winnow::kernels::cuda
