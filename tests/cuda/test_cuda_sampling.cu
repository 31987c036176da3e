// The sampling pieces on the device against the host: math/philox.hpp's bits and uniforms
// against cuRAND's own curand_init / curand / curand_uniform, and cuda/topk.cuh against
// cpu/topk.hpp (same rows, same order) with and without Gumbel noise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include <curand_kernel.h>

#include <distillcache/core/buffer.hpp>
#include <distillcache/cpu/topk.hpp>
#include <distillcache/cuda/buffer.cuh>
#include <distillcache/cuda/copy.cuh>
#include <distillcache/cuda/topk.cuh>
#include <distillcache/math/philox.hpp>

namespace {

using Gpu = dc::Context<dc::cuda>;
const dc::Context<dc::cpu> kCpu{};
constexpr int kDraws = 9;  // crosses two counter blocks from any offset

// For each (seed, subsequence, offset): the first kDraws curand() values after curand_init,
// the first curand_uniform, and (device-side) math::curand_philox_bits for comparison.
__global__ void curand_draws_kernel(const unsigned long long* seeds,
                                    const unsigned long long* subs,
                                    const unsigned long long* offsets, int count,
                                    std::uint32_t* bits, float* uniforms,
                                    std::uint32_t* device_formula) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= count) return;
  curandStatePhilox4_32_10_t s;
  curand_init(seeds[t], subs[t], offsets[t], &s);
  for (int j = 0; j < kDraws; ++j) bits[t * kDraws + j] = curand(&s);
  curand_init(seeds[t], subs[t], offsets[t], &s);
  uniforms[t] = curand_uniform(&s);
  device_formula[t] = dc::math::curand_philox_bits(seeds[t], subs[t], offsets[t]);
}

template <class T>
dc::Buffer<T, dc::cuda> upload(const Gpu& ctx, const std::vector<T>& host) {
  dc::Buffer<T, dc::cuda> b(host.size());
  dc::copy_to_backend(ctx, b.data(), host.data(), host.size());
  return b;
}

}  // namespace

TEST_CASE("host Philox bits and uniforms == cuRAND's curand / curand_uniform") {
  Gpu ctx;
  std::vector<unsigned long long> seeds, subs, offsets;
  const unsigned long long seed_values[] = {0, 1, 0x0000000100000002ull, 20240611,
                                            0xdeadbeefcafef00dull, ~0ull};
  const unsigned long long sub_values[] = {0, 1, 31, 0xffffffffull, 0x100000000ull,
                                           0x8000000000000005ull, ~0ull};
  const unsigned long long offset_values[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 4 * 17 + 2,
                                              0x400000003ull, 0x123456789abcdefull,
                                              0xfffffffffffffff0ull, ~0ull - 8};
  for (auto a : seed_values)
    for (auto b : sub_values)
      for (auto c : offset_values) seeds.push_back(a), subs.push_back(b), offsets.push_back(c);
  const int count = int(seeds.size());
  auto d_seeds = upload(ctx, seeds), d_subs = upload(ctx, subs), d_offsets = upload(ctx, offsets);
  dc::Buffer<std::uint32_t, dc::cuda> d_bits{std::size_t(count) * kDraws}, d_formula{std::size_t(count)};
  dc::Buffer<float, dc::cuda> d_uniforms{std::size_t(count)};
  curand_draws_kernel<<<(count + 127) / 128, 128, 0, ctx.stream()>>>(
      d_seeds.data(), d_subs.data(), d_offsets.data(), count, d_bits.data(), d_uniforms.data(),
      d_formula.data());
  DC_CUDA_CHECK_LAUNCH("curand_draws_kernel");
  std::vector<std::uint32_t> bits(d_bits.size()), formula(d_formula.size());
  std::vector<float> uniforms(d_uniforms.size());
  dc::copy_to_host(ctx, bits.data(), d_bits.data(), bits.size());
  dc::copy_to_host(ctx, formula.data(), d_formula.data(), formula.size());
  dc::copy_to_host(ctx, uniforms.data(), d_uniforms.data(), uniforms.size());
  for (int t = 0; t < count; ++t) {
    INFO("seed ", seeds[std::size_t(t)], " subsequence ", subs[std::size_t(t)], " offset ",
         offsets[std::size_t(t)]);
    // The j-th draw after curand_init(offset) is the first one after curand_init(offset + j).
    for (int j = 0; j < kDraws; ++j)
      CHECK(bits[std::size_t(t) * kDraws + std::size_t(j)] ==
            dc::math::curand_philox_bits(seeds[std::size_t(t)], subs[std::size_t(t)],
                                         offsets[std::size_t(t)] + std::uint64_t(j)));
    CHECK(formula[std::size_t(t)] == bits[std::size_t(t) * kDraws]);
    CHECK(uniforms[std::size_t(t)] ==
          dc::math::curand_uniform_from_bits(bits[std::size_t(t) * kDraws]));
  }
}

TEST_CASE("device top-k per group == host top-k (same rows, same order)") {
  Gpu ctx;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const std::vector<std::vector<int>> layouts = {
      {1000},                                   // one group (shared granularity)
      {0, 5, 1, 300, 0, 64, 129, 2},            // empty, tiny and mid-sized groups
      std::vector<int>(90, 257),                // (layer, KV head) groups of one cache
      {4000, 3, 12000},                         // a long one, past CUB's small-segment path
  };
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    std::vector<std::int32_t> offsets = {0};
    for (int n : layouts[l]) offsets.push_back(offsets.back() + n);
    const auto rows = std::size_t(offsets.back());
    std::vector<float> scores(rows);
    for (auto& x : scores) x = normal(rng);
    // Every other layout: coarse scores (many exact ties) and shuffled positions, so ties are
    // settled by position and not by row order.
    std::vector<std::int32_t> positions(rows);
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g) {
      const auto b = positions.begin() + offsets[g], e = positions.begin() + offsets[g + 1];
      std::iota(b, e, 0);
      if (l % 2 == 1) std::shuffle(b, e, rng);
    }
    if (l % 2 == 1)
      for (auto& x : scores) x = std::round(x * 2.0f) / 2.0f;
    auto d_scores = upload(ctx, scores);
    auto d_positions = upload(ctx, positions);
    for (const int budget : {0, 1, 7, 256, 5000}) {
      for (const std::optional<dc::GumbelNoise> noise :
           {std::optional<dc::GumbelNoise>(), std::optional<dc::GumbelNoise>(dc::GumbelNoise{7, 0}),
            std::optional<dc::GumbelNoise>(dc::GumbelNoise{~0ull, 123456789})}) {
        INFO("layout ", l, " budget ", budget, " noise ", noise.has_value());
        const dc::GroupSamples want = dc::topk_groups(kCpu, scores, positions, offsets, budget, noise);
        const dc::GroupSamples got =
            dc::topk_groups(ctx, d_scores.data(), d_positions.data(), offsets, budget, noise);
        CHECK(got.offsets == want.offsets);
        CHECK(got.rows == want.rows);
      }
    }
  }
}

TEST_CASE("device top-k rejects NaN scores and bad layouts") {
  Gpu ctx;
  std::vector<float> scores = {1.0f, 2.0f, 3.0f, 4.0f};
  scores[2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::int32_t> positions = {0, 1, 2, 3};
  auto d_scores = upload(ctx, scores);
  auto d_positions = upload(ctx, positions);
  const std::vector<std::int32_t> offsets = {0, 2, 4};
  CHECK_THROWS_WITH_AS(dc::topk_groups(ctx, d_scores.data(), d_positions.data(), offsets, 1),
                       doctest::Contains("topk_groups: score of row 2 is NaN"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(ctx, d_scores.data(), d_positions.data(), offsets, -2),
                       doctest::Contains("topk_groups: negative budget -2"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::topk_groups(ctx, d_scores.data(), d_positions.data(),
                                       std::vector<std::int32_t>{0, 3, 2, 4}, 1),
                       doctest::Contains("group_offsets decrease at group 1"), dc::Error);
}
