// The bf16 KV cache on CUDA against the CPU's: the same bits written (round to nearest even,
// NaN kept quiet), the same bits moved by compaction, the cache's storage and copies. Attention
// over bf16 K/V, statistics included, is checked beside the fp32 case in test_cuda_ops.cu.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include <distillcache/distillcache.cuh>

#include "../support/cuda_compare.cuh"
#include "../support/random.hpp"

namespace {

using Gpu = dc::Context<dc::cuda>;
const dc::Context<dc::cpu> kCpu{};
using dc_test::download;
using dc_test::normalised_error;
using dc_test::random_vector;
using dc_test::upload;

using dc_test::to_bf16_vector;

bool same_bits(const std::vector<dc::bf16>& a, const std::vector<dc::bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(dc::bf16)) == 0;
}

}  // namespace

TEST_CASE("cuda kv_write into a bf16 cache writes the CPU's bits, norms from the fp32 rows") {
  Gpu ctx;
  const dc::AttentionShape s{8, 2, 64, 0, 0.125f, 40};
  const int n = 5, first = 11;
  auto k = random_vector(std::size_t(n) * s.num_kv_heads * s.head_dim, 60, 3.0f);
  const auto v = random_vector(k.size(), 61);
  // Rounding's corner cases: ties (to even, both ways), NaN, infinities, the largest finite
  // float (rounds to infinity), a subnormal, signed zero.
  const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0x7f800001u, 0x7f800000u,
                                    0xff800000u, 0x7f7fffffu, 0x00000001u, 0x80000000u};
  for (std::size_t i = 0; i < std::size(specials); ++i) std::memcpy(&k[3 * i], &specials[i], sizeof(float));
  const std::size_t cache = std::size_t(s.num_kv_heads) * s.capacity * s.head_dim;
  auto kc = to_bf16_vector(random_vector(cache, 62));
  auto vc = to_bf16_vector(random_vector(cache, 63));
  const int rows = dc::stat_rows_per_kv_head(s.num_heads / s.num_kv_heads);
  std::vector<float> stats(std::size_t(s.num_kv_heads) * rows * s.capacity, 7.0f);
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto stats_d = upload(ctx, stats);
  auto k_d = upload(ctx, k);
  auto v_d = upload(ctx, v);
  dc::kv_write(kCpu, kc.data(), vc.data(), k.data(), v.data(), n, first, s, stats.data());
  dc::kv_write(ctx, kc_d.data(), vc_d.data(), k_d.data(), v_d.data(), n, first, s, stats_d.data());
  CHECK(same_bits(download(ctx, kc_d), kc));
  CHECK(same_bits(download(ctx, vc_d), vc));
  // The norms row of a slot whose K holds NaN/inf is not finite on either side; the rest must
  // agree as fp32 sums do (order of summation only).
  const auto got = download(ctx, stats_d);
  for (std::size_t i = 0; i < stats.size(); ++i) {
    if (!std::isfinite(stats[i])) {
      CHECK(!std::isfinite(got[i]));
      continue;
    }
    CHECK(std::fabs(got[i] - stats[i]) <= 1e-5f * std::max(1.0f, std::fabs(stats[i])));
  }
}

TEST_CASE("cuda kv_compact on a bf16 cache moves the CPU's bits, batches included") {
  struct Case {
    const char* name;
    int kv_heads, head_dim, heads, len;
    int drop_every;  // keep all slots but every drop_every-th (per head shifted by h)
  };
  const Case cases[] = {
      {"3 heads, hd 64, drop every 3rd", 3, 64, 9, 300, 3},
      {"hd 80, GQA 2, drop every 2nd", 2, 80, 4, 257, 2},
      // 8 KV heads x (K and V: 2 x 128 bf16, and 10 statistics floats) = 4.3 KiB per slot:
      // 20000 moved slots span two 64 MiB scratch batches.
      {"20000 slots, Mistral shape, drop every 7th", 8, 128, 32, 20000, 7},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Gpu ctx;
    const int capacity = c.len + 3;
    const int rows = dc::stat_rows_per_kv_head(c.heads / c.kv_heads);
    const std::size_t kv = std::size_t(c.kv_heads) * capacity * c.head_dim;
    std::vector<dc::bf16> kc(kv), vc(kv);
    for (std::size_t i = 0; i < kv; ++i) {  // distinct bit patterns (NaN payloads included)
      kc[i].bits = std::uint16_t(i * 2654435761u >> 7);
      vc[i].bits = std::uint16_t(i * 40503u + 11u);
    }
    std::vector<float> stats(std::size_t(c.kv_heads) * rows * capacity);
    for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = float(i % 4194304) + 0.5f;
    const int count = c.len - (c.len + c.drop_every - 1) / c.drop_every;
    std::vector<std::int32_t> keep;
    for (int h = 0; h < c.kv_heads; ++h) {
      int taken = 0;
      for (int j = 0; j < c.len && taken < count; ++j)
        if ((j + h) % c.drop_every != 0) keep.push_back(j), ++taken;
      while (taken < count) keep.push_back(keep.back() + 1), ++taken;  // (never: count fits)
    }
    REQUIRE(int(keep.size()) == c.kv_heads * count);
    auto kc_d = upload(ctx, kc);
    auto vc_d = upload(ctx, vc);
    auto stats_d = upload(ctx, stats);
    dc::kv_compact(kCpu, kc.data(), vc.data(), stats.data(), c.kv_heads, c.head_dim, rows, capacity, keep, count);
    dc::kv_compact(ctx, kc_d.data(), vc_d.data(), stats_d.data(), c.kv_heads, c.head_dim, rows, capacity, keep,
                   count);
    CHECK(same_bits(download(ctx, kc_d), kc));
    CHECK(same_bits(download(ctx, vc_d), vc));
    CHECK(download(ctx, stats_d) == stats);
  }
}

TEST_CASE("KVCache<cuda> stores bf16 K/V and copies them between caches") {
  Gpu ctx;
  const dc::CacheShape shape{2, 4, 2, 64, 0, {}};
  dc::KVCache<dc::cuda> a(shape, 32, dc::DType::bf16), b(shape, 32, dc::DType::bf16);
  CHECK(a.kv_type() == dc::DType::bf16);
  CHECK(a.bytes_per_slot_layer() < dc::KVCache<dc::cuda>(shape, 32).bytes_per_slot_layer());
  a.append(ctx, 10);
  const std::size_t n = std::size_t(2) * 32 * 64;
  std::vector<dc::bf16> k(n);
  for (std::size_t i = 0; i < n; ++i) k[i].bits = std::uint16_t(i * 7 + 1);
  dc::copy_to_backend(ctx, a.keys_as<dc::bf16>(1), k.data(), n);
  b.copy_from(ctx, a);
  std::vector<dc::bf16> got(n);
  dc::copy_to_host(ctx, got.data(), b.keys_as<dc::bf16>(1), n);
  for (int h = 0; h < 2; ++h)  // the 10 used slots of each head came across
    CHECK(std::memcmp(got.data() + std::size_t(h) * 32 * 64, k.data() + std::size_t(h) * 32 * 64,
                      10 * 64 * sizeof(dc::bf16)) == 0);
  CHECK_THROWS_AS(a.keys(0), dc::Error);  // the fp32 view of a bf16 cache
}
