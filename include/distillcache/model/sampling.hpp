#pragma once
// Next-token selection from host logits: greedy argmax, or temperature + top-k sampling.
//
// Sampling draws one uniform number per token from the caller's generator, so a fixed seed gives
// the same text on every run and thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/finite.hpp"

namespace dc {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: whole vocabulary
};

inline std::int32_t argmax(std::span<const float> logits) {
  check_logits(logits, "argmax");
  std::size_t best = 0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

template <class Rng>
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, Rng& rng) {
  DC_CHECK(std::isfinite(opt.temperature) && opt.temperature >= 0.0f,
           "temperature must be finite and >= 0, got ", opt.temperature);
  DC_CHECK(opt.top_k >= 0, "top_k must be >= 0, got ", opt.top_k);
  if (opt.temperature == 0.0f) return argmax(logits);
  check_logits(logits, "sample_token");  // -inf entries get weight 0; the top one is finite

  // Candidate set: the top-k logits (ties broken by lower id), or all of them.
  std::vector<std::int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const std::size_t k = opt.top_k > 0 ? std::min<std::size_t>(std::size_t(opt.top_k), ids.size())
                                      : ids.size();
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[std::size_t(a)] > logits[std::size_t(b)] ||
           (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
  };
  if (k < ids.size()) std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), by_logit);
  ids.resize(k);

  float max_logit = -INFINITY;
  for (auto id : ids) max_logit = std::max(max_logit, logits[std::size_t(id)]);
  std::vector<double> weights(k);
  double total = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    weights[i] = std::exp(double(logits[std::size_t(ids[i])] - max_logit) / opt.temperature);
    total += weights[i];
  }
  // Inverse-CDF draw with one uniform: independent of the standard library's distributions.
  const double u = double(rng() - Rng::min()) / (double(Rng::max() - Rng::min()) + 1.0) * total;
  double acc = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    acc += weights[i];
    if (u < acc) return ids[i];
  }
  return ids[k - 1];
}

}  // namespace dc
