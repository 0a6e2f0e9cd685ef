// CUDA runtime errors as absl::Status, so that a failing kernel launch or copy reaches the
// engine as an error it can report (and the requests of that iteration fail) instead of an
// abort inside a kernel wrapper.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/fatal_error.h"

namespace winnow::kernels::cuda {

// Errors after which the context is unusable, so that every later call fails too ("sticky":
// a kernel's illegal address or instruction, a device-side assert, an uncorrectable ECC error).
inline bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// INTERNAL naming the call and the error; marked fatal (base/fatal_error.h) when it is sticky,
// so that the engine stops and the daemon exits for its supervisor to restart it.
inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  absl::Status status = absl::InternalError(absl::StrCat(
      what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
  return IsStickyCudaError(error) ? base::MarkFatal(std::move(status)) : status;
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
