# The CUDA kernels' dependencies beyond the toolkit (docs/gpu.md, "Dependencies"):
#   winnow_cublas                   cuBLAS + cuBLASLt: the toolkit's when it has them (the CUDA
#                                   devel images), else the nvidia-cublas wheel's;
#   WINNOW_FLASHINFER_INCLUDE_DIRS  FlashInfer's headers and the CCCL they need, first.
# scripts/fetch-cuda-deps.sh (run by `make deps` / `make build`) puts the wheels' files under
# WINNOW_CUDA_DEPS_DIR.
set(WINNOW_CUDA_DEPS_DIR "${CMAKE_SOURCE_DIR}/third_party/cuda" CACHE PATH
  "Where scripts/fetch-cuda-deps.sh put cuBLAS (cublas/) and FlashInfer's headers (flashinfer/)")
set(_winnow_fetch_hint "run scripts/fetch-cuda-deps.sh (make deps does), or configure with \
-DWINNOW_CUDA=OFF for a CPU-only build")

add_library(winnow_cublas INTERFACE)
find_file(WINNOW_TOOLKIT_CUBLASLT_H cublasLt.h PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(TARGET CUDA::cublasLt AND WINNOW_TOOLKIT_CUBLASLT_H)
  target_link_libraries(winnow_cublas INTERFACE CUDA::cublasLt CUDA::cublas)
  message(STATUS "winnow: cuBLAS from the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR})")
else()
  set(_cublas_dir "${WINNOW_CUDA_DEPS_DIR}/cublas")
  find_path(WINNOW_CUBLAS_INCLUDE_DIR cublasLt.h PATHS "${_cublas_dir}/include" NO_DEFAULT_PATH)
  find_library(WINNOW_CUBLASLT_LIBRARY cublasLt PATHS "${_cublas_dir}/lib" NO_DEFAULT_PATH)
  find_library(WINNOW_CUBLAS_LIBRARY cublas PATHS "${_cublas_dir}/lib" NO_DEFAULT_PATH)
  if(NOT WINNOW_CUBLAS_INCLUDE_DIR OR NOT WINNOW_CUBLASLT_LIBRARY OR NOT WINNOW_CUBLAS_LIBRARY)
    message(FATAL_ERROR "winnow: cuBLAS is neither in the CUDA toolkit nor in ${_cublas_dir}: "
      "${_winnow_fetch_hint}")
  endif()
  # Imported shared libraries outside the system paths: CMake puts their directory on the
  # executables' build RPATH, so build/winnow and the tests find them without LD_LIBRARY_PATH.
  foreach(lib cublasLt cublas)
    string(TOUPPER "${lib}" upper)
    add_library(winnow_${lib}_shared SHARED IMPORTED)
    set_target_properties(winnow_${lib}_shared PROPERTIES
      IMPORTED_LOCATION "${WINNOW_${upper}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${WINNOW_CUBLAS_INCLUDE_DIR}")
    target_link_libraries(winnow_cublas INTERFACE winnow_${lib}_shared)
  endforeach()
  message(STATUS "winnow: cuBLAS from ${_cublas_dir}")
endif()

set(_flashinfer_dir "${WINNOW_CUDA_DEPS_DIR}/flashinfer")
set(WINNOW_FLASHINFER_INCLUDE_DIRS
  "${_flashinfer_dir}/cccl/libcudacxx/include"
  "${_flashinfer_dir}/cccl/cub"
  "${_flashinfer_dir}/cccl/thrust"
  "${_flashinfer_dir}/include")
if(NOT EXISTS "${_flashinfer_dir}/include/flashinfer/attention/prefill.cuh"
   OR NOT EXISTS "${_flashinfer_dir}/cccl/libcudacxx/include/cuda/std/version"
   OR NOT EXISTS "${_flashinfer_dir}/.version")
  message(FATAL_ERROR "winnow: FlashInfer's headers are missing from ${_flashinfer_dir}: "
    "${_winnow_fetch_hint}")
endif()
file(READ "${_flashinfer_dir}/.version" _flashinfer_version)
string(STRIP "${_flashinfer_version}" _flashinfer_version)
message(STATUS "winnow: FlashInfer headers ${_flashinfer_version} from ${_flashinfer_dir}")
