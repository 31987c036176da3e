#pragma once
// Context<cuda>: the execution state every CUDA op receives — one stream, one cuBLAS handle bound
// to it, and a growable device workspace for op-internal scratch (bf16 activations for cuBLAS,
// split-K attention partials).
//
// Ops take `const Context<cuda>&` (the generic transformer passes its context as const), so the
// workspace is `mutable`: growing it does not change what the context means.
//
// The stream is a *blocking* stream (cudaStreamCreate, not cudaStreamNonBlocking): it stays
// ordered with the legacy default stream, which Buffer<T, cuda>::fill_zero and plain cudaMemcpy
// calls in user code use. Everything the library launches goes to stream(), so one context's ops
// run in issue order without extra synchronisation.
#include <cstddef>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../core/backend.hpp"
#include "../core/error.hpp"
#include "check.cuh"

namespace dc {

template <>
struct Context<cuda> {
  // Uses the calling thread's current device (device 0 unless the caller chose another).
  Context() : Context(current_device()) {}

  explicit Context(int device) : device_(device) {
    DC_CUDA_CHECK(cudaSetDevice(device_));
    DC_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    DC_CUDA_CHECK(cudaStreamCreate(&stream_));
    const cublasStatus_t status = cublasCreate(&cublas_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      (void)cudaStreamDestroy(stream_);
      DC_FAIL("cublasCreate failed: ", cublasGetStatusName(status), " (",
              cublasGetStatusString(status), ")");
    }
    try {
      DC_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
      // Plain fp32 SGEMM: no TF32 down-conversion, so the float backend matches the CPU oracle.
      DC_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    } catch (...) {
      destroy();
      throw;
    }
  }

  ~Context() { destroy(); }

  Context(Context&& o) noexcept
      : device_(o.device_), sm_count_(o.sm_count_), stream_(std::exchange(o.stream_, nullptr)),
        cublas_(std::exchange(o.cublas_, nullptr)),
        workspace_(std::exchange(o.workspace_, nullptr)),
        workspace_bytes_(std::exchange(o.workspace_bytes_, 0)) {}
  Context& operator=(Context&& o) noexcept {
    if (this != &o) {
      destroy();
      device_ = o.device_;
      sm_count_ = o.sm_count_;
      stream_ = std::exchange(o.stream_, nullptr);
      cublas_ = std::exchange(o.cublas_, nullptr);
      workspace_ = std::exchange(o.workspace_, nullptr);
      workspace_bytes_ = std::exchange(o.workspace_bytes_, 0);
    }
    return *this;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaStream_t stream() const noexcept { return stream_; }
  cublasHandle_t cublas() const noexcept { return cublas_; }
  int device() const noexcept { return device_; }
  int sm_count() const noexcept { return sm_count_; }

  // Device scratch of at least `bytes`, 256-byte aligned. Valid until the next workspace() call
  // on this context; ops use it for data that lives only within one op. Growing first waits for
  // the stream, because queued kernels may still read the old allocation; growth happens a few
  // times at start-up (sizes are bounded by the model shape), so the wait costs nothing later.
  void* workspace(std::size_t bytes) const {
    if (bytes <= workspace_bytes_) return workspace_;
    constexpr std::size_t kGranule = std::size_t(1) << 20;  // grow in MiB steps, at least 2x
    std::size_t grown = (bytes + kGranule - 1) / kGranule * kGranule;
    if (grown < 2 * workspace_bytes_) grown = 2 * workspace_bytes_;
    DC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (workspace_) DC_CUDA_CHECK(cudaFree(workspace_));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    const cudaError_t status = cudaMalloc(&workspace_, grown);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      workspace_ = nullptr;
      DC_FAIL("out of device memory growing the CUDA workspace to ", grown, " bytes: ",
              cudaGetErrorName(status));
    }
    workspace_bytes_ = grown;
    return workspace_;
  }
  template <class T>
  T* workspace_as(std::size_t count) const {
    return static_cast<T*>(workspace(count * sizeof(T)));
  }

 private:
  // Without a driver cudaGetDeviceCount returns an error and leaves the count unwritten, so the
  // status is checked before the count is trusted.
  static int current_device() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      DC_FAIL("no usable CUDA device: cudaGetDeviceCount failed with ", cudaGetErrorName(status),
              " (", cudaGetErrorString(status), ")");
    }
    if (count <= 0) DC_FAIL("no usable CUDA device: the driver reports 0 devices");
    int device = 0;
    DC_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }

  void destroy() noexcept {
    // Pending work may still use the workspace; cudaFree waits for it. Errors are ignored here
    // because a destructor cannot report them.
    if (workspace_) (void)cudaFree(workspace_);
    if (cublas_) (void)cublasDestroy(cublas_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    cublas_ = nullptr;
    stream_ = nullptr;
  }

  int device_ = 0;
  int sm_count_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  mutable void* workspace_ = nullptr;
  mutable std::size_t workspace_bytes_ = 0;
};

}  // namespace dc
