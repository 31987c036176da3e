#pragma once
// What the CUDA benchmarks share: whether they can run here (a device exists and the runtime can
// use it; a machine with nvcc but no GPU or driver says so with a skip line, and the benchmark
// exits 0), the GPU's peak memory bandwidth, and random fills made on the device (gigabytes of
// weights or cache in milliseconds, where a host generator would take minutes).
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include <distillcache/distillcache.cuh>

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

// The GPU's peak memory bandwidth in bytes/s: double data rate x memory clock x bus width.
inline double peak_bandwidth() {
  int device = 0, clock_khz = 0, bus_bits = 0;
  DC_CUDA_CHECK(cudaGetDevice(&device));
  DC_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  DC_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

// Device memory still free, in bytes.
inline double free_device_bytes() {
  std::size_t free = 0, total = 0;
  DC_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return double(free);
}

// p[i] = uniform in [lo, hi) from a hash of (seed, i), stored as T (float or bf16).
template <class T>
__global__ void fill_uniform_kernel(T* p, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::uint64_t x = seed + std::uint64_t(i) * 0x9e3779b97f4a7c15ull;  // splitmix64
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    dc::cuda_detail::store_float(p + i, lo + (hi - lo) * float(x >> 40) * 0x1p-24f);
  }
}

template <class T>
void fill_uniform(const dc::Context<dc::cuda>& ctx, T* p, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  constexpr int kThreads = 256;
  fill_uniform_kernel<T><<<dc::cuda_detail::grid_for(n, kThreads, 8 * ctx.sm_count()), kThreads, 0, ctx.stream()>>>(
      p, n, lo, hi, seed);
  DC_CUDA_CHECK_LAUNCH("fill_uniform_kernel");
}

}  // namespace dc_bench
