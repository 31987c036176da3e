#pragma once
// The k-th largest of n unsigned 32-bit keys by radix selection: one histogram of the top 8
// bits, then of the next 8 among the keys that share the chosen top digit, and so on, 4 passes
// at most. No comparisons between keys, so nothing for the branch predictor to miss: on the
// thousand-odd masses of a newest-query reserve (policy/newest_query_reserve.hpp) nth_element's
// partitioning mispredicted about every other element and was most of the reserve's time.
// Floats go through math::float_order_bits, which keeps their order.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../core/error.hpp"
#include "gather_pack.hpp"

namespace dc::cpu_detail {

// The k-th largest key, how many keys equal it, and how many of those the k largest hold
// (taken = equal where no key equal to it is left out).
struct KthLargestKey {
  std::uint32_t key = 0;
  std::size_t equal = 0, taken = 0;
};

// The k-th largest (k = 1: the largest) of keys[0, n). Overwrites keys and scratch (n entries
// each) with candidates.
inline KthLargestKey kth_largest_key(std::uint32_t* keys, std::uint32_t* scratch, std::size_t n, std::size_t k) {
  DC_CHECK(k >= 1 && k <= n, "kth_largest_key: k = ", k, " of ", n, " keys");
  std::uint32_t* candidates = keys;
  std::uint32_t* next = scratch;
  // Digits above the highest bit where the smallest and largest key differ are the same in every
  // key: start below them (masses of one group mostly share their sign and top exponent bits).
  std::uint32_t lowest = keys[0], highest = keys[0];
  for (std::size_t i = 1; i < n; ++i) {
    lowest = std::min(lowest, keys[i]);
    highest = std::max(highest, keys[i]);
  }
  if (lowest == highest) return {lowest, n, k};
  // The largest candidate's digit at each pass: the walk down the buckets starts there, not at
  // 255 (on a few hundred keys the walk from 255 was most of a pass).
  std::uint32_t top_key = highest;
  for (int shift = (std::bit_width(lowest ^ highest) - 1) / 8 * 8;; shift -= 8) {
    // Two histograms, even and odd keys: runs of keys with one digit (every float of [0.5, 1)
    // has the same top 8 bits) would otherwise wait on the last increment of the same counter.
    std::uint32_t even[256] = {}, odd[256] = {};
    std::size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      ++even[(candidates[i] >> shift) & 255u];
      ++odd[(candidates[i + 1] >> shift) & 255u];
    }
    if (i < n) ++even[(candidates[i] >> shift) & 255u];
    // The digit of the k-th largest: walk the buckets from the top.
    std::uint32_t digit = (top_key >> shift) & 255u;
    std::size_t above = 0;
    while (above + even[digit] + odd[digit] < k) {
      above += even[digit] + odd[digit];
      --digit;
    }
    k -= above;
    const std::size_t in_digit = even[digit] + odd[digit];
    if (shift == 0) return {(candidates[0] & ~255u) | digit, in_digit, k};  // they share the upper 24 bits
    if (in_digit != n) {  // keep the candidates with this digit (without a branch)
      n = pack_keys_with_digit(candidates, n, shift, digit, next);
      std::swap(candidates, next);
      top_key = 0;  // (vectorised)
      for (std::size_t j = 0; j < n; ++j) top_key = std::max(top_key, candidates[j]);
    }
    if (n == 1) return {candidates[0], 1, 1};
  }
}

}  // namespace dc::cpu_detail
