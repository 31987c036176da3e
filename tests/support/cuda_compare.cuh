#pragma once
// Host <-> device copies and the normalised error the CUDA-vs-CPU tests compare by (ggml's
// test-backend-ops style): max|got - want| / max(1e-6, max|want|), NaN in got reading as +inf.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <distillcache/distillcache.cuh>

namespace dc_test {

template <class T>
dc::Tensor<T, dc::cuda> upload(const dc::Context<dc::cuda>& ctx, const std::vector<T>& host) {
  dc::Tensor<T, dc::cuda> t(dc::Shape{std::int64_t(host.size())});
  dc::copy_to_backend(ctx, t.data(), host.data(), host.size());
  return t;
}

template <class T>
std::vector<T> download(const dc::Context<dc::cuda>& ctx, const dc::Tensor<T, dc::cuda>& t) {
  std::vector<T> host(std::size_t(t.numel()));
  dc::copy_to_host(ctx, host.data(), t.data(), host.size());
  return host;
}

// Each value rounded to bf16 (nearest even), as a bf16 cache or weight stores it.
inline std::vector<dc::bf16> to_bf16_vector(const std::vector<float>& v) {
  std::vector<dc::bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = dc::to_bf16(v[i]);
  return out;
}

inline float normalised_error(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) return std::numeric_limits<float>::infinity();
  float diff = 0.0f, scale = 0.0f;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<float>::infinity();
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / std::max(1e-6f, scale);
}

}  // namespace dc_test
