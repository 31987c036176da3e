#pragma once
// Seeded normal test data, shared by the CPU and CUDA op tests.
#include <cstddef>
#include <random>
#include <vector>

namespace dc_test {

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

}  // namespace dc_test
