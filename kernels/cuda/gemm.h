// Dense GEMMs for the model's linear layers on the GPU, through cuBLAS: the weights keep the
// layout of the CPU weights (row-major [out_features x in_features], kernels/cpu/matmul.h), so
//   Y[m x n] = X[m x k] * W[n x k]^T
// with X, W in FP16 or BF16, FP32 accumulation, and Y in the input type or FP32 (logits).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace winnow::kernels::cuda {

enum class GemmType : uint8_t { kF16, kBF16, kF32 };

const char* GemmTypeName(GemmType type);

struct GemmArgs {
  GemmType input = GemmType::kBF16;   // X and W: kF16 or kBF16
  GemmType output = GemmType::kBF16;  // Y: the input type or kF32
  int64_t m = 0;                      // rows of X and Y (tokens); 0 is a no-op
  int64_t n = 0;                      // rows of W, columns of Y (out features)
  int64_t k = 0;                      // columns of X and W (in features)
  const void* x = nullptr;            // device, row-major [m x k]
  const void* w = nullptr;            // device, row-major [n x k]
  void* y = nullptr;                  // device, row-major [m x n]
  // Elements between consecutive rows of x, w and y; 0 means packed (k, k and n). A strided x
  // is how one attention head's rows are read out of the forward's [tokens x heads x dim] Q.
  int64_t ldx = 0;
  int64_t ldw = 0;
  int64_t ldy = 0;
  float alpha = 1.0f;  // Y = alpha * X * W^T
};

// InvalidArgument naming the field when `args` describes no GEMM this class runs.
absl::Status ValidateGemmArgs(const GemmArgs& args);

// Owns a cuBLAS handle and its workspace (a fixed workspace keeps the calls capturable in CUDA
// graphs: cuBLAS allocates nothing while running). One per worker thread: a handle is not to be
// shared between threads that run at once.
class Gemm {
 public:
  // What cuBLAS recommends for Hopper (and ample for older GPUs).
  static constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

  static absl::StatusOr<std::unique_ptr<Gemm>> Create();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Enqueues Y = X * W^T on `stream` (asynchronous: the result is ready when the stream is).
  absl::Status Run(const GemmArgs& args, cudaStream_t stream);
  // Enqueues `batch` GEMMs of one shape: args.x, args.w and args.y are device arrays of `batch`
  // device pointers, the i-th GEMM reading x[i] and w[i] and writing y[i]. Inputs may repeat
  // (GQA's query heads share their KV head's keys); outputs must not overlap.
  absl::Status RunBatched(const GemmArgs& args, int32_t batch, cudaStream_t stream);

 private:
  Gemm(cublasHandle_t handle, void* workspace) : handle_(handle), workspace_(workspace) {}
  // Points the handle at `stream` and at this object's workspace.
  absl::Status Bind(cudaStream_t stream);

  cublasHandle_t handle_;
  void* workspace_;
};

}  // namespace winnow::kernels::cuda
