#pragma once
// Uploads host fp32 weights (what every loader produces) to the device, converting the matrices
// to W (float or bf16, rounded to nearest even by dc::to_bf16). Norm weights stay fp32, as on
// every backend. Conversion is host-side, one tensor at a time, so peak host memory is the
// checkpoint plus one converted tensor.
#include <cstddef>
#include <type_traits>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/tensor.hpp"
#include "weights.hpp"
#include "../cuda/buffer.cuh"
#include "../cuda/context.cuh"
#include "../cuda/copy.cuh"

namespace dc {
namespace cuda_detail {

template <class W>
Tensor<W, cuda> upload_tensor(const Tensor<float, cpu>& host, const Context<cuda>& ctx,
                              std::vector<W>& staging) {
  if (host.empty()) return {};  // e.g. lm_head with tied embeddings
  Tensor<W, cuda> dev(host.shape());
  const std::size_t count = static_cast<std::size_t>(host.numel());
  if constexpr (std::is_same_v<W, float>) {
    copy_to_backend(ctx, dev.data(), host.data(), count);
  } else {
    // The previous tensor's copy may still read staging (pinned sources are waited for by
    // copy_to_backend; pageable ones are staged before it returns), so reuse is safe.
    staging.resize(count);
    for (std::size_t i = 0; i < count; ++i) staging[i] = from_float<W>(host.data()[i]);
    copy_to_backend(ctx, dev.data(), staging.data(), count);
  }
  return dev;
}

}  // namespace cuda_detail

template <class W>
Weights<cuda, W> upload_weights(const HostWeights& host, const Context<cuda>& ctx) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, bf16>,
                "CUDA weights are stored as float or bf16");
  std::vector<W> staging;
  std::vector<float> unused;
  Weights<cuda, W> dev = transform_weights<cuda, W>(
      host, [&](const Tensor<float, cpu>& t) { return cuda_detail::upload_tensor<W>(t, ctx, staging); },
      [&](const Tensor<float, cpu>& t) { return cuda_detail::upload_tensor<float>(t, ctx, unused); });
  // The weights may be used from any stream (each Transformer owns its own context).
  synchronize(ctx);
  return dev;
}

}  // namespace dc
