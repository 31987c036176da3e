#pragma once
// Host <-> device copies for Context<cuda>, stream-ordered on the context's stream.
//
// The CPU overloads in core/copy.hpp let the caller reuse the source as soon as they return, and
// generic code (KVCache::append, kv_compact's keep-set, upload staging) relies on that. The CUDA
// documentation does not promise that cudaMemcpyAsync from pageable memory has read the source
// when it returns, and from pinned memory it certainly has not, so for any source that is not
// device (or managed) memory we wait for the stream: the same contract, at one synchronisation
// per host-to-device copy (small, per step: positions, tokens, keep-sets).
// cudaMemcpyDefault lets unified addressing pick the direction, so device-to-device works too.
#include <cstddef>

#include <cuda_runtime.h>

#include "../core/copy.hpp"
#include "check.cuh"
#include "context.cuh"

namespace dc {

namespace cuda_detail {

// After a copy from src queued on ctx's stream: waits for the stream unless src is device (or
// managed) memory, so the caller may reuse a host source on return (see above).
inline void wait_if_host_source(const Context<cuda>& ctx, const void* src) {
  cudaPointerAttributes attr{};
  DC_CUDA_CHECK(cudaPointerGetAttributes(&attr, src));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

}  // namespace cuda_detail

template <class T>
void copy_to_backend(const Context<cuda>& ctx, T* dst, const T* src, std::size_t count) {
  if (!count) return;
  DC_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDefault, ctx.stream()));
  cuda_detail::wait_if_host_source(ctx, src);
}

// The strided block of core/copy.hpp's copy_rows_to_backend in one cudaMemcpy2DAsync (and at
// most one wait, where copying row by row waited once per row).
template <class T>
void copy_rows_to_backend(const Context<cuda>& ctx, T* dst, std::size_t dst_stride, const T* src,
                          std::size_t count, std::size_t rows) {
  if (!count || !rows) return;
  DC_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * sizeof(T), src, count * sizeof(T), count * sizeof(T),
                                  rows, cudaMemcpyDefault, ctx.stream()));
  cuda_detail::wait_if_host_source(ctx, src);
}

// Waits for the copy (and everything queued before it), so the host can read dst on return.
template <class T>
void copy_to_host(const Context<cuda>& ctx, T* dst, const T* src, std::size_t count) {
  if (!count) return;
  DC_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDefault, ctx.stream()));
  DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

// The strided block of core/copy.hpp's copy_rows_to_host in one cudaMemcpy2DAsync, then waits.
template <class T>
void copy_rows_to_host(const Context<cuda>& ctx, T* dst, const T* src, std::size_t src_stride,
                       std::size_t count, std::size_t rows) {
  if (!count || !rows) return;
  DC_CUDA_CHECK(cudaMemcpy2DAsync(dst, count * sizeof(T), src, src_stride * sizeof(T), count * sizeof(T),
                                  rows, cudaMemcpyDefault, ctx.stream()));
  DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

// Device-to-device, stream-ordered; returns without waiting.
template <class T>
void copy_on_backend(const Context<cuda>& ctx, T* dst, const T* src, std::size_t count) {
  if (!count) return;
  DC_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream()));
}

inline void synchronize(const Context<cuda>& ctx) {
  DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

}  // namespace dc
