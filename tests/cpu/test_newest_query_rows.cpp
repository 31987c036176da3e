// The rows the newest query attends to most (policy/newest_query_reserve.hpp, newest_query_pins.hpp)
// and the radix selection under them (cpu/radix_select.hpp), against oracles that sort
// everything: random groups with many equal masses, rows already kept, every kind of count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <distillcache/cpu/radix_select.hpp>
#include <distillcache/math/plackett_luce.hpp>
#include <distillcache/policy/newest_query_pins.hpp>
#include <distillcache/policy/newest_query_reserve.hpp>

#include "../support/threads.hpp"

namespace {

// Head granularity, `layers` x `heads` groups over positions [0, positions): each head holds a
// random subset (the newest position always), rows in a random order, newest-query masses from
// a few multiples of 1/64 (equal masses are common; sums of up to `heads` of them are exact).
dc::TokenFeatures random_head_features(int layers, int heads, int positions, std::mt19937& rng) {
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.num_layers = layers;
  f.latest_position = positions - 1;
  std::uniform_int_distribution<int> mass_step(0, 6);
  std::bernoulli_distribution held(0.7);
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      std::vector<int> kept;
      for (int p = 0; p < positions; ++p)
        if (p == positions - 1 || held(rng)) kept.push_back(p);
      std::shuffle(kept.begin(), kept.end(), rng);
      const int begin = f.size;
      for (int p : kept) {
        f.append_features(0.5f);
        f.group.push_back(f.num_groups());
        f.slot.push_back(f.size - begin);
        f.position.push_back(p);
        f.accumulated_mass.push_back(1.0f);
        f.last_query_mass.push_back(float(mass_step(rng)) / 64.0f);
        f.key_norm.push_back(1.0f);
        f.expected_attention.push_back(0.0f);
        ++f.size;
      }
      f.groups.push_back({l, l + 1, h, h + 1, begin, f.size});
    }
  f.validate();
  return f;
}

// Scores before a reserve: finite, some +inf (already kept), some -inf (never kept by score).
std::vector<float> random_scores(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::discrete_distribution<int> kind({6, 2, 1});
  std::vector<float> s(std::size_t(n), 0.0f);
  for (float& x : s) {
    const int k = kind(rng);
    x = k == 0 ? uniform(rng) : k == 1 ? INFINITY : -INFINITY;
  }
  return s;
}

// The oracle: per group inside `layers`, its layer's mean newest-query mass by position (sum over
// the heads holding it, divided by the layer's head count), every row not yet +inf ordered by
// (mass, position) descending, the first `reserve` raised.
std::vector<float> reserve_oracle(const dc::TokenFeatures& f, int reserve, std::vector<float> scores,
                                  const std::vector<int>& layers, int heads) {
  for (const dc::FeatureGroup& g : f.groups) {
    if (!layers.empty() && !std::binary_search(layers.begin(), layers.end(), g.layer_begin)) continue;
    std::vector<float> sum(std::size_t(f.latest_position + 1), 0.0f);
    for (const dc::FeatureGroup& other : f.groups)
      if (other.layer_begin == g.layer_begin)
        for (int r = other.row_begin; r < other.row_end; ++r)
          sum[std::size_t(f.position[std::size_t(r)])] += f.last_query_mass[std::size_t(r)];
    std::vector<std::pair<float, int>> free_rows;  // (mass, row)
    for (int r = g.row_begin; r < g.row_end; ++r)
      if (scores[std::size_t(r)] != INFINITY)
        free_rows.push_back({sum[std::size_t(f.position[std::size_t(r)])] / float(heads), r});
    std::sort(free_rows.begin(), free_rows.end(), [&](auto a, auto b) {
      return a.first != b.first ? a.first > b.first : f.position[std::size_t(a.second)] > f.position[std::size_t(b.second)];
    });
    for (std::size_t i = 0; i < free_rows.size() && i < std::size_t(reserve); ++i)
      scores[std::size_t(free_rows[i].second)] = INFINITY;
  }
  return scores;
}

}  // namespace

TEST_CASE("kth_largest_key: the k-th of the sorted keys, with how many equal it and how many of those are in") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + int(rng() % 300);
    // Narrow ranges (many duplicates), wide ones, floats' order bits, and one value.
    const int kind = trial % 4;
    std::vector<std::uint32_t> keys(static_cast<std::size_t>(n));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (auto& k : keys)
      k = kind == 0 ? std::uint32_t(rng() % 5) : kind == 1 ? std::uint32_t(rng())
          : kind == 2 ? dc::math::float_order_bits(normal(rng)) : 0x80000000u;
    const std::size_t k = 1 + rng() % std::uint32_t(n);
    std::vector<std::uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const std::uint32_t expected = sorted[k - 1];
    const auto equal = std::size_t(std::count(sorted.begin(), sorted.end(), expected));
    const auto taken = std::size_t(std::count(sorted.begin(), sorted.begin() + std::ptrdiff_t(k), expected));
    std::vector<std::uint32_t> scratch(static_cast<std::size_t>(n));
    const dc::cpu_detail::KthLargestKey got = dc::cpu_detail::kth_largest_key(keys.data(), scratch.data(), std::size_t(n), k);
    CAPTURE(trial);
    CHECK(got.key == expected);
    CHECK(got.equal == equal);
    CHECK(got.taken == taken);
  }
  std::vector<std::uint32_t> one = {7}, scratch(1);
  CHECK_THROWS_AS(dc::cpu_detail::kth_largest_key(one.data(), scratch.data(), 1, 2), dc::Error);
}

TEST_CASE("newest-query reserve: the rows a full sort by (layer mass, position) raises, for every count and thread count") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int heads = 1 + trial % 3, positions = 5 + int(rng() % 200);
    const dc::TokenFeatures f = random_head_features(3, heads, positions, rng);
    const std::vector<float> before = random_scores(f.size, rng);
    const std::vector<int> layers = trial % 2 ? std::vector<int>{} : std::vector<int>{0, 2};
    for (int reserve : {0, 1, 2, 7, positions / 3, positions - 2, positions, positions + 5}) {
      if (reserve < 0) continue;
      const std::vector<float> expected = reserve_oracle(f, reserve, before, layers, heads);
      for (int threads : {1, 2, 3}) {
        const std::vector<float> got = dc_test::with_threads(threads, [&] {
          std::vector<float> s = before;
          dc::reserve_newest_query_rows(f, reserve, s, layers);
          return s;
        });
        CAPTURE(trial);
        CAPTURE(reserve);
        CAPTURE(threads);
        CHECK(got == expected);
      }
    }
  }
}

TEST_CASE("newest-query reserve: two reserves in disjoint layers at once are each one alone; shared layers throw") {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 20; ++trial) {
    const int heads = 1 + trial % 3, positions = 20 + int(rng() % 150);
    const dc::TokenFeatures f = random_head_features(3, heads, positions, rng);
    const std::vector<float> before = random_scores(f.size, rng);
    const std::vector<int> first = {0, 2}, second = {1};
    const int rows_first = int(rng() % std::uint32_t(positions)), rows_second = int(rng() % std::uint32_t(positions));
    std::vector<float> expected = before;
    dc::reserve_newest_query_rows(f, rows_first, expected, first);
    dc::reserve_newest_query_rows(f, rows_second, expected, second);
    for (int threads : {1, 2}) {
      const std::vector<float> got = dc_test::with_threads(threads, [&] {
        std::vector<float> s = before;
        const std::vector<dc::NewestQueryReserve> both = {{first, rows_first}, {second, rows_second}};
        dc::reserve_newest_query_rows(f, both, s);
        return s;
      });
      CAPTURE(trial);
      CHECK(got == expected);
    }
  }
  std::mt19937 r(1);
  const dc::TokenFeatures f = random_head_features(3, 2, 30, r);
  std::vector<float> s = random_scores(f.size, r);
  const std::vector<int> a = {0, 1}, b = {1, 2};
  const std::vector<dc::NewestQueryReserve> overlapping = {{a, 3}, {b, 4}};
  CHECK_THROWS_WITH_AS(dc::reserve_newest_query_rows(f, overlapping, s), doctest::Contains("two reserves rank layers 1"),
                       dc::Error);
}

TEST_CASE("newest-query pins: the count positions of largest guide mass, ties to the newer, as a full sort gives") {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + int(rng() % 500);
    std::vector<float> mass(static_cast<std::size_t>(n));
    for (float& m : mass) m = trial % 2 ? float(rng() % 4) / 8.0f : float(rng() % 100000) / 1e5f;
    const int count = int(rng() % std::uint32_t(n + 3));
    std::vector<int> order(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p) order[std::size_t(p)] = p;
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return mass[std::size_t(a)] != mass[std::size_t(b)] ? mass[std::size_t(a)] > mass[std::size_t(b)] : a > b;
    });
    std::vector<char> expected(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < std::min(n, count); ++i) expected[std::size_t(order[std::size_t(i)])] = 1;
    CAPTURE(trial);
    CHECK(dc::pinned_positions(mass, count) == expected);
  }
}
