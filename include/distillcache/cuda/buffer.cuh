#pragma once
// Buffer<T, cuda>: owning, move-only device memory with the surface of Buffer<T, cpu>
// (data/size/bytes/empty/fill_zero). There is no operator[]: the memory is not host-readable.
//
// cudaMalloc returns 256-byte aligned memory, so kernels may use 16-byte vector loads on any
// buffer whose element offset keeps that alignment. cudaFree waits for pending device work, so a
// buffer may be destroyed while kernels that read it are still queued.
#include <cstddef>
#include <limits>
#include <utility>

#include <cuda_runtime.h>

#include "../core/buffer.hpp"
#include "check.cuh"

namespace dc {

template <class T>
class Buffer<T, cuda> {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t count) { allocate(count); }
  ~Buffer() { release(); }

  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
        device_(std::exchange(other.device_, kHostDevice)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      device_ = std::exchange(other.device_, kHostDevice);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  // The CUDA device the memory was allocated on (the current device then); kHostDevice if empty.
  int device() const noexcept { return device_; }

  // Host-synchronous, like the CPU version: the memory is zero when this returns. It runs on the
  // legacy default stream, which is ordered after prior work on every blocking stream (the
  // Context<cuda> stream is one), and then waits for it.
  void fill_zero() {
    if (!size_) return;
    DC_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), cudaStreamLegacy));
    DC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  // Stream-ordered variant for hot paths.
  void fill_zero_async(cudaStream_t stream) {
    if (size_) DC_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), stream));
  }

 private:
  void allocate(std::size_t count) {
    if (count == 0) return;
    DC_CHECK(count <= std::numeric_limits<std::size_t>::max() / sizeof(T), "device buffer of ",
             count, " elements overflows size_t");
    int device = kHostDevice;
    DC_CUDA_CHECK(cudaGetDevice(&device));
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, count * sizeof(T));
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // an allocation failure is not sticky; clear it for later checks
      DC_FAIL("out of device memory allocating ", count * sizeof(T), " bytes: ",
              cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
    }
    data_ = static_cast<T*>(p);
    size_ = count;
    device_ = device;
  }
  void release() noexcept {
    if (data_) (void)cudaFree(data_);  // a destructor cannot throw; errors resurface later
    data_ = nullptr;
    size_ = 0;
    device_ = kHostDevice;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = kHostDevice;
};

}  // namespace dc
