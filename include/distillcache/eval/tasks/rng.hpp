#pragma once
// The random choices of the task generators, made the same on every platform.
//
// std::mt19937_64's output sequence is fixed by the standard, but std::uniform_int_distribution
// and std::shuffle are not (libstdc++, libc++ and MSVC give different prompts for one seed), so
// the distributions here are written out: rejection sampling for a uniform integer, Fisher-Yates
// for shuffles, and a partial Fisher-Yates for sampling without replacement.
#include <cstdint>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "../../core/error.hpp"

namespace dc::tasks {

// SplitMix64's finaliser: spreads a counter or a hash over all 64 bits.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a of a name, so a task's stream depends on its name and not on where it sits in a list.
inline std::uint64_t hash_name(std::string_view s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

class TaskRng {
 public:
  explicit TaskRng(std::uint64_t seed) : engine_(seed) {}
  // One stream per (seed, task, length, sample): changing one never moves the others.
  TaskRng(std::uint64_t seed, std::string_view task, int length, int sample)
      : engine_(mix64(mix64(mix64(seed) ^ hash_name(task)) ^ std::uint64_t(length)) ^
                std::uint64_t(sample)) {}

  std::uint64_t bits() { return engine_(); }

  // Uniform in [0, n), n >= 1: draws below the largest multiple of n are accepted, so every
  // residue is equally likely.
  std::uint64_t below(std::uint64_t n) {
    DC_CHECK(n >= 1, "TaskRng::below: empty range");
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x;
    do x = engine_();
    while (x >= limit);
    return x % n;
  }
  // Uniform in [lo, hi], both included.
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    DC_CHECK(lo <= hi, "TaskRng::between: lo ", lo, " > hi ", hi);
    return lo + std::int64_t(below(std::uint64_t(hi - lo) + 1));
  }

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
  template <class T>
  const T& choice(const std::vector<T>& v) {
    DC_CHECK(!v.empty(), "TaskRng::choice: empty list");
    return v[below(v.size())];
  }
  // k distinct indices of [0, n), in the order drawn.
  std::vector<std::size_t> sample(std::size_t n, std::size_t k) {
    DC_CHECK(k <= n, "TaskRng::sample: ", k, " of ", n);
    std::vector<std::size_t> idx(n);
    for (std::size_t i = 0; i < n; ++i) idx[i] = i;
    for (std::size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + below(n - i)]);
    idx.resize(k);
    return idx;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace dc::tasks
