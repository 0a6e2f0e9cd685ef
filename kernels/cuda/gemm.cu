#include "kernels/cuda/gemm.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace winnow::kernels::cuda {
namespace {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(status), " (",
                                          cublasGetStatusString(status), ")"));
}

cudaDataType_t CudaType(GemmType type) {
  switch (type) {
    case GemmType::kF16:
      return CUDA_R_16F;
    case GemmType::kBF16:
      return CUDA_R_16BF;
    case GemmType::kF32:
      break;
  }
  return CUDA_R_32F;
}

absl::Status CheckDimension(int64_t value, const char* name, int64_t min) {
  if (value < min || value > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM ", name, " = ", value, ": must be in [", min, ", ", INT_MAX, "]"));
  }
  return absl::OkStatus();
}

struct LeadingDims {
  int x, w, y;
};
// Validated by ValidateGemmArgs: each fits an int.
LeadingDims LeadingDimsOf(const GemmArgs& args) {
  return {static_cast<int>(args.ldx != 0 ? args.ldx : args.k),
          static_cast<int>(args.ldw != 0 ? args.ldw : args.k),
          static_cast<int>(args.ldy != 0 ? args.ldy : args.n)};
}

}  // namespace

const char* GemmTypeName(GemmType type) {
  switch (type) {
    case GemmType::kF16:
      return "f16";
    case GemmType::kBF16:
      return "bf16";
    case GemmType::kF32:
      break;
  }
  return "f32";
}

absl::Status ValidateGemmArgs(const GemmArgs& args) {
  if (args.input != GemmType::kF16 && args.input != GemmType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM input type ", GemmTypeName(args.input), ": must be f16 or bf16"));
  }
  if (args.output != args.input && args.output != GemmType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GEMM output type ", GemmTypeName(args.output), ": must be the input type (",
        GemmTypeName(args.input), ") or f32"));
  }
  if (absl::Status s = CheckDimension(args.m, "m", 0); !s.ok()) return s;
  if (absl::Status s = CheckDimension(args.n, "n", 1); !s.ok()) return s;
  if (absl::Status s = CheckDimension(args.k, "k", 1); !s.ok()) return s;
  if (args.ldx != 0) {
    if (absl::Status s = CheckDimension(args.ldx, "ldx", args.k); !s.ok()) return s;
  }
  if (args.ldw != 0) {
    if (absl::Status s = CheckDimension(args.ldw, "ldw", args.k); !s.ok()) return s;
  }
  if (args.ldy != 0) {
    if (absl::Status s = CheckDimension(args.ldy, "ldy", args.n); !s.ok()) return s;
  }
  if (args.m > 0 && (args.x == nullptr || args.w == nullptr || args.y == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GEMM ", args.x == nullptr ? "x" : (args.w == nullptr ? "w" : "y"), " is null"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create() {
  cublasHandle_t handle = nullptr;
  if (absl::Status s = CublasStatus(cublasCreate(&handle), "cublasCreate"); !s.ok()) return s;
  void* workspace = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMalloc(&workspace, Gemm::kWorkspaceBytes), "cudaMalloc workspace");
      !s.ok()) {
    cublasDestroy(handle);
    return s;
  }
  return std::unique_ptr<Gemm>(new Gemm(handle, workspace));
}

Gemm::~Gemm() {
  cublasDestroy(handle_);
  cudaFree(workspace_);
}

absl::Status Gemm::Bind(cudaStream_t stream) {
  // cublasSetStream resets the workspace to cuBLAS's own pool, so set ours after it.
  if (absl::Status s = CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  return CublasStatus(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes),
                      "cublasSetWorkspace");
}

// cuBLAS is column-major: a row-major [r x c] matrix is its column-major transpose. So
// Y^T[n x m] = W[n x k] * X^T[k x m], where the row-major W is read as the column-major
// [k x n] W^T transposed back (OP_T), and the row-major X is already the column-major X^T.
absl::Status Gemm::Run(const GemmArgs& args, cudaStream_t stream) {
  if (absl::Status s = ValidateGemmArgs(args); !s.ok()) return s;
  if (args.m == 0) return absl::OkStatus();
  if (absl::Status s = Bind(stream); !s.ok()) return s;
  const LeadingDims ld = LeadingDimsOf(args);
  const float beta = 0.0f;
  return CublasStatus(
      cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(args.n),
                   static_cast<int>(args.m), static_cast<int>(args.k), &args.alpha, args.w,
                   CudaType(args.input), ld.w, args.x, CudaType(args.input), ld.x, &beta, args.y,
                   CudaType(args.output), ld.y, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

absl::Status Gemm::RunBatched(const GemmArgs& args, int32_t batch, cudaStream_t stream) {
  if (absl::Status s = ValidateGemmArgs(args); !s.ok()) return s;
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM batch = ", batch, ": negative"));
  }
  if (args.m == 0 || batch == 0) return absl::OkStatus();
  if (absl::Status s = Bind(stream); !s.ok()) return s;
  const LeadingDims ld = LeadingDimsOf(args);
  const float beta = 0.0f;
  return CublasStatus(
      cublasGemmBatchedEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(args.n),
                          static_cast<int>(args.m), static_cast<int>(args.k), &args.alpha,
                          static_cast<const void* const*>(args.w), CudaType(args.input), ld.w,
                          static_cast<const void* const*>(args.x), CudaType(args.input), ld.x,
                          &beta, static_cast<void* const*>(args.y), CudaType(args.output), ld.y,
                          batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmBatchedEx");
}

}  // namespace winnow::kernels::cuda
