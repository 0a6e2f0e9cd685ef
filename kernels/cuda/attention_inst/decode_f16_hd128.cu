// One FlashInfer instantiation per translation unit keeps each nvcc run short (docs/gpu.md).
#include "kernels/cuda/flashinfer_decode.cuh"

namespace winnow::kernels::cuda {
template absl::Status FlashInferDecode<half, 128>(const FlashInferCall& call);
}  // namespace winnow::kernels::cuda
