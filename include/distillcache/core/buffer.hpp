#pragma once
// Owning, move-only, typed memory on one backend.
//
// Buffer<T, cpu> is 64-byte aligned host memory (one cache line, the widest vector load), so the
// CPU loops can vectorise without peeling. Buffer<T, cuda> lives in cuda/buffer.cuh and uses
// cudaMalloc. Both expose the same small surface: data(), size(), bytes(), empty().
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "backend.hpp"
#include "error.hpp"

namespace dc {

template <class T, Backend B>
class Buffer;

template <class T>
class Buffer<T, cpu> {
 public:
  static constexpr std::size_t kAlignment = 64;

  Buffer() = default;
  explicit Buffer(std::size_t count) { allocate(count); }
  ~Buffer() { release(); }

  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
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
  static constexpr int device() noexcept { return kHostDevice; }

  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

  void fill_zero() {
    if (size_) std::memset(static_cast<void*>(data_), 0, bytes());
  }

 private:
  void allocate(std::size_t count) {
    if (count == 0) return;
    DC_CHECK(count <= std::numeric_limits<std::size_t>::max() / sizeof(T) - kAlignment,
             "buffer of ", count, " elements overflows size_t");
    const std::size_t bytes = (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (!p) DC_FAIL("out of host memory allocating ", bytes, " bytes");
    data_ = static_cast<T*>(p);
    size_ = count;
  }
  void release() noexcept {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dc
