#pragma once
// Host <-> device copies for Context<cuda>, stream-ordered on the context's stream.
//
// The CPU overloads in core/copy.hpp let the caller reuse the source as soon as they return, and
// generic code (KVCache::append, Transformer::forward) relies on that. cudaMemcpyAsync from
// pageable memory already behaves so (the data is staged before the call returns); from pinned
// memory it is truly asynchronous, so then we wait for the stream to keep the same contract.
// cudaMemcpyDefault lets unified addressing pick the direction, so device-to-device works too.
#include <cstddef>

#include <cuda_runtime.h>

#include "../core/copy.hpp"
#include "check.cuh"
#include "context.cuh"

namespace dc {

template <class T>
void copy_to_backend(const Context<cuda>& ctx, T* dst, const T* src, std::size_t count) {
  if (!count) return;
  DC_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDefault, ctx.stream()));
  cudaPointerAttributes attr{};
  DC_CUDA_CHECK(cudaPointerGetAttributes(&attr, src));
  if (attr.type == cudaMemoryTypeHost) DC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

// Waits for the copy (and everything queued before it), so the host can read dst on return.
template <class T>
void copy_to_host(const Context<cuda>& ctx, T* dst, const T* src, std::size_t count) {
  if (!count) return;
  DC_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDefault, ctx.stream()));
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
