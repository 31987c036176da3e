#pragma once
// Error checks for CUDA runtime, cuBLAS and cuRAND calls. Each failure throws dc::Error carrying
// the call's source text, the library's error name and description, and the caller's file:line
// (DC_FAIL expands at the call site), so a failed launch deep in a layer names itself.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <curand.h>

#include "../core/error.hpp"

namespace dc::cuda_detail {

// cuRAND has no status-to-string function; these are the names from curand.h.
inline const char* curand_status_name(curandStatus_t s) {
  switch (s) {
    case CURAND_STATUS_SUCCESS: return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH: return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED: return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED: return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR: return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE: return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED: return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE: return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE: return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH: return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR: return "CURAND_STATUS_INTERNAL_ERROR";
  }
  return "CURAND_STATUS_<unknown>";
}

}  // namespace dc::cuda_detail

#define DC_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    const cudaError_t dc_cuda_status_ = (expr);                                               \
    if (dc_cuda_status_ != cudaSuccess)                                                       \
      DC_FAIL("CUDA call `" #expr "` failed: ", cudaGetErrorName(dc_cuda_status_), " (",      \
              cudaGetErrorString(dc_cuda_status_), ")");                                      \
  } while (0)

#define DC_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    const cublasStatus_t dc_cublas_status_ = (expr);                                          \
    if (dc_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                           \
      DC_FAIL("cuBLAS call `" #expr "` failed: ", cublasGetStatusName(dc_cublas_status_), " (", \
              cublasGetStatusString(dc_cublas_status_), ")");                                 \
  } while (0)

#define DC_CURAND_CHECK(expr)                                                                 \
  do {                                                                                        \
    const curandStatus_t dc_curand_status_ = (expr);                                          \
    if (dc_curand_status_ != CURAND_STATUS_SUCCESS)                                           \
      DC_FAIL("cuRAND call `" #expr "` failed: ",                                             \
              ::dc::cuda_detail::curand_status_name(dc_curand_status_));                      \
  } while (0)

// After a <<<...>>> launch: reports launch-configuration errors (and any earlier sticky error)
// with the kernel's name. Execution errors surface at the next synchronising call.
#define DC_CUDA_CHECK_LAUNCH(kernel_name)                                                     \
  do {                                                                                        \
    const cudaError_t dc_cuda_status_ = cudaGetLastError();                                   \
    if (dc_cuda_status_ != cudaSuccess)                                                       \
      DC_FAIL("CUDA launch of ", kernel_name, " failed: ", cudaGetErrorName(dc_cuda_status_), \
              " (", cudaGetErrorString(dc_cuda_status_), ")");                                \
  } while (0)
