// CUDA runtime errors as absl::Status, so that a failing kernel launch or copy reaches the
// engine as an error it can report (and the requests of that iteration fail) instead of an
// abort inside a kernel wrapper.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace winnow::kernels::cuda {

inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

// The error of the last kernel launch (launches report configuration errors only this way).
inline absl::Status LastLaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace winnow::kernels::cuda

#define WINNOW_CUDA_RETURN_IF_ERROR(expr)                                           \
  do {                                                                              \
    if (absl::Status _winnow_cuda_status = ::winnow::kernels::cuda::CudaStatus(     \
            (expr), #expr);                                                         \
        !_winnow_cuda_status.ok()) {                                                \
      return _winnow_cuda_status;                                                   \
    }                                                                               \
  } while (0)
