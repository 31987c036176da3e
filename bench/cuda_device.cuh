#pragma once
// Whether the CUDA benchmarks can run here: a device exists and the runtime can use it (a machine
// with nvcc but no GPU or driver says so with a skip line, and the benchmark exits 0).
#include <cstdio>

#include <cuda_runtime.h>

namespace dc_bench {

inline bool usable_cuda_device() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);  // leaves count unwritten on error
  if (status == cudaSuccess && count <= 0) status = cudaErrorNoDevice;
  if (status == cudaSuccess) status = cudaFree(nullptr);
  if (status == cudaSuccess) return true;
  std::printf("SKIPPED: no usable CUDA device (%s); CUDA benchmarks not run\n", cudaGetErrorString(status));
  return false;
}

}  // namespace dc_bench
