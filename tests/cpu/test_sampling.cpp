// The random sampling pieces: Philox4x32-10 against Random123's published known answers, the
// cuRAND (seed, subsequence, offset) mapping, Gumbel-top-k per group against exact
// Plackett-Luce probabilities (chi-square), the deterministic top-B, and the Plackett-Luce
// log-probability and first-pick entropy against brute force and finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <distillcache/cpu/topk.hpp>
#include <distillcache/math/philox.hpp>
#include <distillcache/math/plackett_luce.hpp>
#include <distillcache/rl/plackett_luce.hpp>

namespace {

using dc::math::PhiloxBlock;
const dc::Context<dc::cpu> kCpu{};

std::uint32_t word(const PhiloxBlock& b, int i) {
  return i == 0 ? b.w0 : i == 1 ? b.w1 : i == 2 ? b.w2 : b.w3;
}
PhiloxBlock block(std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) {
  PhiloxBlock r;
  r.w0 = a, r.w1 = b, r.w2 = c, r.w3 = d;
  return r;
}
void check_block(const PhiloxBlock& got, const PhiloxBlock& want) {
  for (int i = 0; i < 4; ++i) CHECK(word(got, i) == word(want, i));
}

// Exact Plackett-Luce probability of an ordered sample, as the direct product of the
// successive softmax probabilities (long double: no shift needed up to |s| ~ 10^4).
long double pl_prob_direct(const std::vector<double>& s, const std::vector<int>& order) {
  std::vector<char> used(s.size(), 0);
  long double p = 1.0L;
  for (int i : order) {
    long double denom = 0.0L;
    for (std::size_t k = 0; k < s.size(); ++k)
      if (!used[k]) denom += std::exp(static_cast<long double>(s[k]));
    p *= std::exp(static_cast<long double>(s[std::size_t(i)])) / denom;
    used[std::size_t(i)] = 1;
  }
  return p;
}

// Every ordered sample of k distinct items out of n.
void enumerate_ordered(int n, int k, std::vector<int>& prefix, std::vector<std::vector<int>>& out) {
  if (int(prefix.size()) == k) {
    out.push_back(prefix);
    return;
  }
  for (int i = 0; i < n; ++i) {
    if (std::find(prefix.begin(), prefix.end(), i) != prefix.end()) continue;
    prefix.push_back(i);
    enumerate_ordered(n, k, prefix, out);
    prefix.pop_back();
  }
}
std::vector<std::vector<int>> ordered_samples(int n, int k) {
  std::vector<std::vector<int>> out;
  std::vector<int> prefix;
  enumerate_ordered(n, k, prefix, out);
  return out;
}

// P(X >= chi2) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, chi2/2),
// by its power series below a + 1 and its continued fraction (modified Lentz) above.
double chi2_survival(double chi2, int df) {
  const double a = 0.5 * df, x = 0.5 * chi2;
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {  // P(a, x) = prefix * sum_n x^n / (a (a+1) ... (a+n))
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-17; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - std::exp(log_prefix) * sum;
  }
  constexpr double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

// The significance level of the chi-square tests: a correct sampler fails one with
// probability 1e-4.
constexpr double kChi2Alpha = 1e-4;

// |got - want| within rel * |want| (+ a tiny absolute floor for gradients that are ~0).
bool close(double got, double want, double rel, double abs_floor = 1e-9) {
  return std::fabs(got - want) <= rel * std::fabs(want) + abs_floor;
}

std::vector<std::int32_t> iota_positions(std::size_t n) {
  std::vector<std::int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

}  // namespace

// ---- Philox and the cuRAND mapping ---------------------------------------------------------

TEST_CASE("philox4x32_10 reproduces Random123's known-answer vectors") {
  // Random123 tests/kat_vectors, "philox4x32 10" lines: counter, key -> output.
  check_block(dc::math::philox4x32_10(block(0, 0, 0, 0), 0, 0),
              block(0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8));
  check_block(dc::math::philox4x32_10(block(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff),
                                      0xffffffff, 0xffffffff),
              block(0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd));
  check_block(dc::math::philox4x32_10(block(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344),
                                      0xa4093822, 0x299f31d0),
              block(0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1));
}

TEST_CASE("curand_philox_bits follows curand_init's seed / subsequence / offset layout") {
  // Seed 0, subsequence 0: the first four draws are the zero-counter known answer.
  const std::uint32_t kat[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (int i = 0; i < 4; ++i) CHECK(dc::math::curand_philox_bits(0, 0, std::uint64_t(i)) == kat[i]);

  const std::uint64_t seeds[] = {0, 1, 0x0000000100000002ull, 0xdeadbeefcafef00dull,
                                 0xffffffffffffffffull};
  const std::uint64_t subs[] = {0, 1, 7, 0xffffffffull, 0x100000000ull, 0x8000000000000005ull,
                                0xffffffffffffffffull};
  for (const std::uint64_t seed : seeds) {
    const auto k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
    for (const std::uint64_t sub : subs) {
      // Offsets 0..11: three successive counter blocks, words in order (what successive
      // curand() calls after curand_init(seed, sub, 0) return).
      for (std::uint64_t off = 0; off < 12; ++off) {
        const PhiloxBlock b = dc::math::philox4x32_10(
            block(std::uint32_t(off / 4), 0, std::uint32_t(sub), std::uint32_t(sub >> 32)), k0, k1);
        CHECK(dc::math::curand_philox_bits(seed, sub, off) == word(b, int(off % 4)));
      }
      // Large offsets: block offset / 4 in the counter's low 64 bits.
      for (const std::uint64_t off :
           {0x400000000ull + 3, 0x123456789abcdefull, 0xfffffffffffffffeull, ~0ull}) {
        const std::uint64_t blk = off / 4;
        const PhiloxBlock b = dc::math::philox4x32_10(
            block(std::uint32_t(blk), std::uint32_t(blk >> 32), std::uint32_t(sub),
                  std::uint32_t(sub >> 32)),
            k0, k1);
        CHECK(dc::math::curand_philox_bits(seed, sub, off) == word(b, int(off % 4)));
      }
    }
  }
  // The subsequence really is the high half: subsequence 2^32 sets word 3 only.
  check_block(dc::math::curand_philox_counter(0x100000000ull, 0), block(0, 0, 0, 1));
  check_block(dc::math::curand_philox_counter(3, 0x500000002ull), block(2, 5, 3, 0));
}

TEST_CASE("uniforms follow curand_uniform and stay inside (0, 1)") {
  CHECK(dc::math::curand_uniform_from_bits(0) == std::ldexp(1.0f, -33));
  CHECK(dc::math::curand_uniform_from_bits(1) == std::ldexp(3.0f, -33));
  CHECK(dc::math::curand_uniform_from_bits(0x80000000u) == 0.5f);
  CHECK(dc::math::curand_uniform_from_bits(0xffffffffu) == 1.0f);  // why the clamp exists
  CHECK(dc::math::clamp_below_one(1.0f) == std::nextafter(1.0f, 0.0f));
  CHECK(dc::math::clamp_below_one(0.25f) == 0.25f);
  CHECK(std::isfinite(dc::math::gumbel_from_uniform(dc::math::clamp_below_one(1.0f))));
  CHECK(dc::math::gumbel_from_uniform(std::exp(-1.0)) == doctest::Approx(0.0).epsilon(1e-15));
  // The uniform a row's noise uses is exactly the bits' uniform.
  for (std::uint64_t row = 0; row < 64; ++row) {
    const float u = dc::math::curand_philox_uniform(42, row, 8);
    CHECK(u > 0.0f);
    CHECK(u < 1.0f);
    CHECK(u == dc::math::curand_uniform_from_bits(dc::math::curand_philox_bits(42, row, 8)));
    CHECK(dc::math::gumbel_noise(42, 2, row) == dc::math::gumbel_from_uniform(u));
  }
}

TEST_CASE("gumbel_noise is standard Gumbel and independent across streams and seeds") {
  // Mean = Euler-Mascheroni, variance = pi^2/6; 200k rows give a standard error of 0.003 on the
  // mean and ~0.01 on the variance. The correlation between two streams (or two seeds) of the
  // same rows has standard error 1/sqrt(n) = 0.0022.
  constexpr int n = 200000;
  const double euler = 0.57721566490153286, var = std::numbers::pi * std::numbers::pi / 6.0;
  double sum = 0, sq = 0, cross_stream = 0, cross_seed = 0, sum1 = 0, sum2 = 0;
  for (int r = 0; r < n; ++r) {
    const double g = dc::math::gumbel_noise(7, 0, std::uint64_t(r));
    const double h = dc::math::gumbel_noise(7, 1, std::uint64_t(r));
    const double k = dc::math::gumbel_noise(8, 0, std::uint64_t(r));
    sum += g, sq += g * g, sum1 += h, sum2 += k;
    cross_stream += (g - euler) * (h - euler);
    cross_seed += (g - euler) * (k - euler);
  }
  const double mean = sum / n;
  CHECK(std::fabs(mean - euler) < 0.015);
  CHECK(std::fabs(sq / n - mean * mean - var) < 0.06);
  CHECK(std::fabs(sum1 / n - euler) < 0.015);
  CHECK(std::fabs(sum2 / n - euler) < 0.015);
  CHECK(std::fabs(cross_stream / n / var) < 0.012);
  CHECK(std::fabs(cross_seed / n / var) < 0.012);
}

TEST_CASE("chi2_survival (the tests' p-values) matches closed forms") {
  for (const double x : {0.01, 0.5, 1.0, 3.0, 10.0, 15.137, 40.0}) {
    CHECK(chi2_survival(x, 1) == doctest::Approx(std::erfc(std::sqrt(x / 2.0))).epsilon(1e-10));
    CHECK(chi2_survival(x, 2) == doctest::Approx(std::exp(-x / 2.0)).epsilon(1e-10));
    // df = 4: Q(2, x/2) = e^{-x/2} (1 + x/2).
    CHECK(chi2_survival(x, 4) == doctest::Approx(std::exp(-x / 2.0) * (1.0 + x / 2.0)).epsilon(1e-10));
  }
}

// ---- Top-k per group -----------------------------------------------------------------------

TEST_CASE("Gumbel top-k samples follow the exact Plackett-Luce probabilities") {
  // Three groups in one call (6, 5 and 2 rows), B = 3: ordered samples of 3 (120 and 60
  // outcomes) and of all 2 rows (2 outcomes). 200k draws, stream = draw index, fixed seed.
  // Pearson chi-square against the enumerated probabilities; the sampler is rejected when the
  // statistic's p-value is below kChi2Alpha = 1e-4. With a fixed seed the outcome is
  // deterministic; alpha says how unlucky a correct sampler would have to be to fail. (This
  // seed gives p = 1.0e-3, 0.51 and 0.28 for the three groups; other seeds spread as they should.)
  const std::vector<std::int32_t> offsets = {0, 6, 11, 13};
  const std::vector<float> scores = {0.3f, -0.6f, 1.1f, 0.0f, -1.0f, 0.5f,  // group 0
                                     0.8f, 0.2f,  -0.4f, 0.9f, 0.0f,       // group 1
                                     -0.7f, 0.4f};                         // group 2
  const auto positions = iota_positions(scores.size());
  constexpr int budget = 3, draws = 200000;

  std::vector<std::vector<long long>> counts(3);
  for (int g = 0; g < 3; ++g) {
    const int n = offsets[std::size_t(g) + 1] - offsets[std::size_t(g)];
    counts[std::size_t(g)].assign(std::size_t(std::pow(n, std::min(n, budget))), 0);
  }
  for (int d = 0; d < draws; ++d) {
    const dc::GroupSamples s = dc::topk_groups(kCpu, scores, positions, offsets, budget,
                                               dc::GumbelNoise{20240611, std::uint64_t(d)});
    REQUIRE(s.groups() == 3);
    for (int g = 0; g < 3; ++g) {
      const int begin = offsets[std::size_t(g)];
      const int n = offsets[std::size_t(g) + 1] - begin;
      std::size_t code = 0;
      for (const std::int32_t row : s.group(g)) code = code * std::size_t(n) + std::size_t(row - begin);
      ++counts[std::size_t(g)][code];
    }
  }
  for (int g = 0; g < 3; ++g) {
    const int begin = offsets[std::size_t(g)];
    const int n = offsets[std::size_t(g) + 1] - begin;
    const int k = std::min(n, budget);
    std::vector<double> s(scores.begin() + begin, scores.begin() + begin + n);
    std::vector<double> hot = s;  // a wrong model, 5 % sharper: must be rejected (power)
    for (auto& x : hot) x *= 1.05;
    double chi2 = 0, chi2_wrong = 0, seen = 0;
    for (const auto& order : ordered_samples(n, k)) {
      std::size_t code = 0;
      for (int i : order) code = code * std::size_t(n) + std::size_t(i);
      const double observed = double(counts[std::size_t(g)][code]);
      const double expected = draws * double(pl_prob_direct(s, order));
      const double expected_wrong = draws * double(pl_prob_direct(hot, order));
      REQUIRE(expected > 20.0);  // the chi-square approximation holds
      chi2 += (observed - expected) * (observed - expected) / expected;
      chi2_wrong += (observed - expected_wrong) * (observed - expected_wrong) / expected_wrong;
      seen += observed;
    }
    CHECK(seen == draws);  // every sample was an ordered set of distinct rows of its group
    const int df = int(ordered_samples(n, k).size()) - 1;
    INFO("group ", g, ": chi2 ", chi2, " on ", df, " df, p = ", chi2_survival(chi2, df),
         "; 5 % sharper model: chi2 ", chi2_wrong, ", p = ", chi2_survival(chi2_wrong, df));
    CHECK(chi2_survival(chi2, df) > kChi2Alpha);
    if (df > 1) CHECK(chi2_survival(chi2_wrong, df) < kChi2Alpha);
  }
}

TEST_CASE("Gumbel top-k: B = 1 is a softmax draw; B >= n orders the whole group") {
  const std::vector<float> scores = {1.0f, 0.0f, -1.0f};
  const std::vector<std::int32_t> offsets = {0, 3};
  const auto positions = iota_positions(3);
  constexpr int draws = 60000;
  std::vector<int> first(3, 0);
  for (int d = 0; d < draws; ++d) {
    const auto one = dc::topk_groups(kCpu, scores, positions, offsets, 1, dc::GumbelNoise{3, std::uint64_t(d)});
    const auto all = dc::topk_groups(kCpu, scores, positions, offsets, 10, dc::GumbelNoise{3, std::uint64_t(d)});
    REQUIRE(one.rows.size() == 1);
    REQUIRE(all.rows.size() == 3);
    CHECK(all.rows[0] == one.rows[0]);  // same noise: the first pick of both
    ++first[std::size_t(one.rows[0])];
  }
  const double z = std::exp(1.0) + 1.0 + std::exp(-1.0);
  const double p[3] = {std::exp(1.0) / z, 1.0 / z, std::exp(-1.0) / z};
  double chi2 = 0;
  for (int i = 0; i < 3; ++i) chi2 += std::pow(first[std::size_t(i)] - draws * p[i], 2) / (draws * p[i]);
  CHECK(chi2_survival(chi2, 2) > kChi2Alpha);
}

TEST_CASE("Gumbel top-k is the sort of s + gumbel_noise(seed, stream, row)") {
  // A direct reference: perturb with the keyed noise, full sort (descending score, then older
  // position, then row), first B per group. Big enough to take the OpenMP path.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::int32_t> offsets = {0};
  for (int n : {0, 1, 7, 300, 4096, 30000, 2, 900}) offsets.push_back(offsets.back() + n);
  const auto rows = std::size_t(offsets.back());
  std::vector<float> scores(rows);
  for (auto& x : scores) x = normal(rng);
  std::vector<std::int32_t> positions(rows);
  for (std::size_t g = 0; g + 1 < offsets.size(); ++g) {  // each group: a shuffled 0..n-1
    const auto b = positions.begin() + offsets[g], e = positions.begin() + offsets[g + 1];
    std::iota(b, e, 0);
    std::shuffle(b, e, rng);
  }
  for (const int budget : {0, 1, 5, 256, 100000}) {
    for (const bool noisy : {false, true}) {
      const dc::GumbelNoise key{99, 17};
      std::vector<float> value(scores);
      if (noisy)
        for (std::size_t r = 0; r < rows; ++r)
          value[r] = dc::math::perturbed_score(scores[r], dc::math::gumbel_noise(key.seed, key.stream, r));
      const auto got = noisy ? dc::topk_groups(kCpu, scores, positions, offsets, budget, key)
                             : dc::topk_groups(kCpu, scores, positions, offsets, budget);
      REQUIRE(got.offsets == dc::sample_offsets(offsets, budget));
      for (int g = 0; g + 1 < int(offsets.size()); ++g) {
        std::vector<std::int32_t> order(std::size_t(offsets[std::size_t(g) + 1] - offsets[std::size_t(g)]));
        std::iota(order.begin(), order.end(), offsets[std::size_t(g)]);
        std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
          const float va = value[std::size_t(a)], vb = value[std::size_t(b)];
          if (va != vb) return va > vb;
          if (positions[std::size_t(a)] != positions[std::size_t(b)])
            return positions[std::size_t(a)] < positions[std::size_t(b)];
          return a < b;
        });
        order.resize(std::min(order.size(), std::size_t(budget)));
        const auto picked = got.group(g);
        CHECK(std::vector<std::int32_t>(picked.begin(), picked.end()) == order);
      }
    }
  }
}

TEST_CASE("Gumbel top-k: same key, same sample; other stream or seed, other sample") {
  const auto scores = std::vector<float>(64, 0.0f);  // all tied: the noise alone orders them
  const std::vector<std::int32_t> offsets = {0, 32, 64};
  const auto positions = iota_positions(64);
  const auto a = dc::topk_groups(kCpu, scores, positions, offsets, 8, dc::GumbelNoise{1, 0});
  const auto b = dc::topk_groups(kCpu, scores, positions, offsets, 8, dc::GumbelNoise{1, 0});
  const auto c = dc::topk_groups(kCpu, scores, positions, offsets, 8, dc::GumbelNoise{1, 1});
  const auto d = dc::topk_groups(kCpu, scores, positions, offsets, 8, dc::GumbelNoise{2, 0});
  CHECK(a.rows == b.rows);
  CHECK(a.rows != c.rows);
  CHECK(a.rows != d.rows);
}

TEST_CASE("deterministic top-B: descending score, ties to the older position") {
  //                     row:  0     1     2     3     4      5     6     7
  const std::vector<float> scores = {1.0f, 2.0f, 1.0f, 2.0f, -0.0f, 0.0f, 1.0f, -INFINITY};
  const std::vector<std::int32_t> positions = {50, 40, 10, 41, 3, 2, 30, 0};
  const std::vector<std::int32_t> offsets = {0, 8};
  const auto top = dc::topk_groups(kCpu, scores, positions, offsets, 8);
  // 2.0 at positions 40 (row 1), 41 (row 3); 1.0 at 10 (2), 30 (6), 50 (0); -0 == +0, so
  // position 2 (row 5) before 3 (row 4); -inf last.
  CHECK(top.rows == std::vector<std::int32_t>{1, 3, 2, 6, 0, 5, 4, 7});
  CHECK(dc::topk_groups(kCpu, scores, positions, offsets, 3).rows == std::vector<std::int32_t>{1, 3, 2});
  CHECK(dc::topk_groups(kCpu, scores, positions, offsets, 0).rows.empty());
  // Equal scores and positions (not a real cache, still deterministic): smaller row first.
  const std::vector<float> flat(4, 1.0f);
  const std::vector<std::int32_t> same(4, 7);
  CHECK(dc::topk_groups(kCpu, flat, same, std::vector<std::int32_t>{0, 4}, 2).rows ==
        std::vector<std::int32_t>{0, 1});
  // +inf first, also under noise.
  const std::vector<float> inf_first = {0.0f, INFINITY, 5.0f};
  const auto noisy = dc::topk_groups(kCpu, inf_first, iota_positions(3), std::vector<std::int32_t>{0, 3}, 1,
                                     dc::GumbelNoise{0, 0});
  CHECK(noisy.rows == std::vector<std::int32_t>{1});
}

TEST_CASE("topk_groups layout: min(B, n) per group, empty groups, no groups") {
  const std::vector<float> scores = {3, 1, 2, 9, 8};
  const auto positions = iota_positions(5);
  const auto s = dc::topk_groups(kCpu, scores, positions, std::vector<std::int32_t>{0, 3, 3, 5}, 2);
  CHECK(s.offsets == std::vector<std::int32_t>{0, 2, 2, 4});
  CHECK(s.rows == std::vector<std::int32_t>{0, 2, 3, 4});
  CHECK(s.group(1).empty());
  const auto none = dc::topk_groups(kCpu, std::span<const float>(), std::span<const std::int32_t>(),
                                    std::vector<std::int32_t>{0}, 4);
  CHECK(none.groups() == 0);
  CHECK(none.rows.empty());
}

TEST_CASE("topk_groups rejects bad arguments") {
  const std::vector<float> scores = {1, 2, NAN, 4};
  const std::vector<float> good = {1, 2, 3, 4};
  const auto positions = iota_positions(4);
  const std::vector<std::int32_t> offsets = {0, 2, 4};
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, scores, positions, offsets, 1),
                       doctest::Contains("topk_groups: score of row 2 is NaN"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, positions, offsets, -1),
                       doctest::Contains("topk_groups: negative budget -1"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, iota_positions(3), offsets, 1),
                       doctest::Contains("4 scores for 3 positions"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, positions, std::vector<std::int32_t>{0, 3}, 1),
                       doctest::Contains("group_offsets end at 3 but there are 4 rows"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, positions, std::vector<std::int32_t>{1, 4}, 1),
                       doctest::Contains("group_offsets[0] is 1, expected 0"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, positions, std::vector<std::int32_t>{0, 3, 2, 4}, 1),
                       doctest::Contains("group_offsets decrease at group 1 (3 then 2)"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(kCpu, good, positions, std::vector<std::int32_t>{}, 1),
                       doctest::Contains("group_offsets is empty"), dc::Error);
  const auto s = dc::topk_groups(kCpu, good, positions, offsets, 1);
  CHECK_THROWS_WITH_AS(s.group(2), doctest::Contains("GroupSamples::group: group 2 of 2"), dc::Error);
}

// ---- Plackett-Luce log-probability ---------------------------------------------------------

TEST_CASE("Plackett-Luce log p matches the direct product and sums to 1") {
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 1.5);
  for (const int n : {1, 2, 4, 6}) {
    std::vector<double> s(static_cast<std::size_t>(n));
    for (auto& x : s) x = normal(rng);
    for (int k = 0; k <= std::min(n, 3); ++k) {
      long double total = 0.0L;
      for (const auto& order : ordered_samples(n, k)) {
        const std::vector<std::int32_t> pi(order.begin(), order.end());
        const double log_p = dc::plackett_luce_log_prob(s, pi);
        CHECK(close(log_p, double(std::log(pl_prob_direct(s, order))), 1e-12, 1e-13));
        total += std::exp(static_cast<long double>(log_p));
      }
      INFO("n ", n, " k ", k);
      CHECK(double(total) == doctest::Approx(1.0).epsilon(1e-12));
    }
  }
  // float scores take the same path.
  const std::vector<float> sf = {0.5f, -1.0f, 2.0f};
  const std::vector<std::int32_t> pi = {2, 0};
  CHECK(dc::plackett_luce_log_prob(sf, pi) ==
        doctest::Approx(double(std::log(pl_prob_direct({0.5, -1.0, 2.0}, {2, 0})))).epsilon(1e-7));
}

TEST_CASE("Plackett-Luce gradient matches central finite differences") {
  std::mt19937 rng(12);
  std::normal_distribution<double> normal(0.0, 2.0);
  constexpr double h = 1e-5;
  for (const int n : {1, 3, 6, 17}) {
    std::vector<double> s(static_cast<std::size_t>(n));
    for (auto& x : s) x = normal(rng);
    for (const int k : {0, 1, 3, n}) {
      if (k > n) continue;
      std::vector<std::int32_t> pi(static_cast<std::size_t>(n));
      std::iota(pi.begin(), pi.end(), 0);
      std::shuffle(pi.begin(), pi.end(), rng);
      pi.resize(std::size_t(k));
      std::vector<double> grad(static_cast<std::size_t>(n));
      dc::plackett_luce_log_prob(s, pi, grad);
      double sum = 0;
      for (int i = 0; i < n; ++i) {
        auto plus = s, minus = s;
        plus[std::size_t(i)] += h, minus[std::size_t(i)] -= h;
        const double fd = (dc::plackett_luce_log_prob(plus, pi) - dc::plackett_luce_log_prob(minus, pi)) / (2 * h);
        INFO("n ", n, " k ", k, " i ", i, " fd ", fd, " grad ", grad[std::size_t(i)]);
        CHECK(close(grad[std::size_t(i)], fd, 1e-3, 1e-8));
        sum += grad[std::size_t(i)];
      }
      CHECK(std::fabs(sum) < 1e-12);  // log p is invariant to adding a constant to every score
    }
  }
}

TEST_CASE("Plackett-Luce: no overflow with scores spread over +-300 nats") {
  // Scores in [-300, 300]: exp() of them overflows float and the plain softmax of the spread
  // underflows to exact 0/1; log p must stay finite, exact and shift-invariant.
  std::mt19937 rng(13);
  std::uniform_real_distribution<double> spread(-300.0, 300.0);
  std::vector<double> s(10);
  for (auto& x : s) x = spread(rng);
  std::vector<std::int32_t> likely(10), unlikely(10);
  std::iota(likely.begin(), likely.end(), 0);
  std::sort(likely.begin(), likely.end(), [&](int a, int b) { return s[std::size_t(a)] > s[std::size_t(b)]; });
  unlikely.assign(likely.rbegin(), likely.rend());
  for (auto pi : {likely, unlikely}) {
    pi.resize(4);
    std::vector<double> grad(10), grad_shifted(10);
    const double log_p = dc::plackett_luce_log_prob(s, pi, grad);
    const std::vector<int> order(pi.begin(), pi.end());
    CHECK(std::isfinite(log_p));
    CHECK(close(log_p, double(std::log(pl_prob_direct(s, order))), 1e-12, 1e-10));
    auto shifted = s;
    for (auto& x : shifted) x += 250.0;
    CHECK(close(dc::plackett_luce_log_prob(shifted, pi, grad_shifted), log_p, 1e-12, 1e-9));
    for (int i = 0; i < 10; ++i) {
      CHECK(std::isfinite(grad[std::size_t(i)]));
      CHECK(close(grad_shifted[std::size_t(i)], grad[std::size_t(i)], 1e-9, 1e-12));
      auto plus = s, minus = s;
      plus[std::size_t(i)] += 1e-4, minus[std::size_t(i)] -= 1e-4;
      const double fd = (dc::plackett_luce_log_prob(plus, pi) - dc::plackett_luce_log_prob(minus, pi)) / 2e-4;
      CHECK(close(grad[std::size_t(i)], fd, 1e-3, 1e-6));
    }
  }
  // float scores at +-300 (exp(300) is inf in float).
  const std::vector<float> sf = {300.0f, -300.0f, 299.0f, 0.0f};
  std::vector<float> gf(4);
  const double lp = dc::plackett_luce_log_prob(sf, std::vector<std::int32_t>{1, 0}, gf);
  CHECK(std::isfinite(lp));
  for (float g : gf) CHECK(std::isfinite(g));
  CHECK(lp == doctest::Approx(double(std::log(pl_prob_direct({300, -300, 299, 0}, {1, 0})))).epsilon(1e-9));
}

TEST_CASE("Plackett-Luce over groups: the sum of the groups, global rows, gradient for every row") {
  std::mt19937 rng(14);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<std::int32_t> offsets = {0, 5, 5, 12, 14};
  std::vector<float> scores(14);
  for (auto& x : scores) x = normal(rng);
  const auto positions = iota_positions(14);
  const auto sample = dc::topk_groups(kCpu, scores, positions, offsets, 3, dc::GumbelNoise{4, 2});
  std::vector<float> grad(14, 123.0f);
  const double total = dc::plackett_luce_log_prob_groups(scores, offsets, sample, grad);
  double want = 0;
  for (int g = 0; g < 4; ++g) {
    const int begin = offsets[std::size_t(g)], n = offsets[std::size_t(g) + 1] - begin;
    const std::span<const float> local(scores.data() + begin, std::size_t(n));
    std::vector<std::int32_t> pi;
    for (const std::int32_t r : sample.group(g)) pi.push_back(r - begin);
    std::vector<float> local_grad(static_cast<std::size_t>(n));
    want += dc::plackett_luce_log_prob(local, pi, local_grad);
    for (int i = 0; i < n; ++i) CHECK(grad[std::size_t(begin + i)] == local_grad[std::size_t(i)]);
  }
  CHECK(total == want);
  // A sample the groups do not own, or a wrong group count, is rejected.
  dc::GroupSamples bad = sample;
  bad.rows[0] = 7;  // row of group 2 in group 0
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob_groups(scores, offsets, bad),
                       doctest::Contains("pick 0 of group 0 is row 7, outside the group [0, 5)"), dc::Error);
  bad = sample;
  bad.offsets.pop_back();
  bad.rows.resize(std::size_t(bad.offsets.back()));
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob_groups(scores, offsets, bad),
                       doctest::Contains("samples of 3 groups for 4 groups"), dc::Error);
}

TEST_CASE("plackett_luce_log_prob rejects bad samples") {
  const std::vector<double> s = {0.0, 1.0, 2.0};
  using V = std::vector<std::int32_t>;
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob(s, V{0, 2, 0}),
                       doctest::Contains("row 0 is picked twice in one sample"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob(s, V{3}),
                       doctest::Contains("pick 0 is row 3, outside its group [0, 3)"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob(s, V{0, 1, 2, 0}),
                       doctest::Contains("a sample of 4 picks from a group of 3 rows"), dc::Error);
  std::vector<double> short_grad(2);
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob(s, V{0}, short_grad),
                       doctest::Contains("gradient of 2 entries for 3 scores"), dc::Error);
  const std::vector<double> inf = {0.0, INFINITY};
  CHECK_THROWS_WITH_AS(dc::plackett_luce_log_prob(inf, V{0}),
                       doctest::Contains("score of row 1 is not finite"), dc::Error);
}

// ---- First-pick entropy --------------------------------------------------------------------

TEST_CASE("first-pick entropy and its gradient") {
  std::mt19937 rng(15);
  std::normal_distribution<double> normal(0.0, 2.0);
  for (const int n : {1, 2, 5, 40}) {
    std::vector<double> s(static_cast<std::size_t>(n));
    for (auto& x : s) x = normal(rng);
    std::vector<double> grad(static_cast<std::size_t>(n));
    const double h_val = dc::first_pick_entropy(s, grad);
    long double z = 0, want = 0;
    for (double x : s) z += std::exp(static_cast<long double>(x));
    for (double x : s) {
      const long double p = std::exp(static_cast<long double>(x)) / z;
      want -= p * std::log(p);
    }
    CHECK(close(h_val, double(want), 1e-12, 1e-14));
    for (int i = 0; i < n; ++i) {
      auto plus = s, minus = s;
      plus[std::size_t(i)] += 1e-5, minus[std::size_t(i)] -= 1e-5;
      const double fd = (dc::first_pick_entropy(plus) - dc::first_pick_entropy(minus)) / 2e-5;
      CHECK(close(grad[std::size_t(i)], fd, 1e-3, 1e-9));
    }
  }
  CHECK(dc::first_pick_entropy(std::vector<double>(8, 3.0)) == doctest::Approx(std::log(8.0)));
  // A dominant row at +-300: entropy ~0, finite gradient.
  std::vector<float> g(3);
  const double h = dc::first_pick_entropy(std::vector<float>{300.0f, -300.0f, 0.0f}, g);
  CHECK(h >= 0.0);
  CHECK(h < 1e-100);
  for (float x : g) CHECK(std::isfinite(x));
}

TEST_CASE("first-pick entropy over groups") {
  const std::vector<double> s = {0.1, -0.3, 2.0, 0.7, 0.7, -1.0};
  const std::vector<std::int32_t> offsets = {0, 3, 3, 4, 6};
  std::vector<double> grad(6, 9.0);
  const double total = dc::first_pick_entropy_groups(s, offsets, grad);
  std::vector<double> g0(3), g2(2);
  const double want = dc::first_pick_entropy(std::span<const double>(s.data(), 3), g0) + 0.0 +
                      dc::first_pick_entropy(std::span<const double>(s.data() + 4, 2), g2);
  CHECK(total == doctest::Approx(want).epsilon(1e-15));
  CHECK(grad == std::vector<double>{g0[0], g0[1], g0[2], 0.0, g2[0], g2[1]});
  CHECK_THROWS_WITH_AS(dc::first_pick_entropy_groups(s, std::vector<std::int32_t>{0, 7}),
                       doctest::Contains("first_pick_entropy_groups: group_offsets end at 7 but there are 6 rows"),
                       dc::Error);
  CHECK_THROWS_WITH_AS(dc::first_pick_entropy(std::vector<double>{NAN}),
                       doctest::Contains("first_pick_entropy: score of row 0 is not finite"), dc::Error);
}
