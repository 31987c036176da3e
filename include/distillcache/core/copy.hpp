#pragma once
// Host <-> backend copies. The CPU overloads are plain memcpy; cuda/copy.cuh adds the CUDA ones
// (stream-ordered cudaMemcpyAsync), so generic code calls copy_* without knowing the backend.
#include <cstddef>
#include <cstring>

#include "backend.hpp"

namespace dc {

template <class T>
void copy_to_backend(const Context<cpu>&, T* dst, const T* src, std::size_t count) {
  if (count) std::memcpy(dst, src, count * sizeof(T));
}

template <class T>
void copy_to_host(const Context<cpu>&, T* dst, const T* src, std::size_t count) {
  if (count) std::memcpy(dst, src, count * sizeof(T));
}

// rows rows of count elements, row r read at src + r * src_stride and written densely at
// dst + r * count: one call for a strided block (e.g. the valid slots of every statistics row).
template <class T>
void copy_rows_to_host(const Context<cpu>&, T* dst, const T* src, std::size_t src_stride,
                       std::size_t count, std::size_t rows) {
  if (!count) return;
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + r * count, src + r * src_stride, count * sizeof(T));
}

// rows rows of count elements, read densely at src + r * count and written at dst + r *
// dst_stride: one call for a strided block (e.g. the new slots of every KV head's positions).
template <class T>
void copy_rows_to_backend(const Context<cpu>&, T* dst, std::size_t dst_stride, const T* src,
                          std::size_t count, std::size_t rows) {
  if (!count) return;
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * count, count * sizeof(T));
}

// Copy between two buffers of the same backend.
template <class T>
void copy_on_backend(const Context<cpu>&, T* dst, const T* src, std::size_t count) {
  if (count) std::memcpy(dst, src, count * sizeof(T));
}

inline void synchronize(const Context<cpu>&) {}

}  // namespace dc
