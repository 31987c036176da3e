// Op-level tests of the CPU backend against oracles computed independently (PyTorch float64 in
// tests/fixtures/ops, made by tools/make_fixtures.py) or against naive double-precision loops.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/safetensors.hpp>

#include "../support/random.hpp"
#include "../support/threads.hpp"

namespace {

const std::string kOps = std::string(DC_FIXTURE_DIR) + "/ops/ops.safetensors";

float max_abs_diff(const float* a, const float* b, std::int64_t n) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(a[i] - b[i]));
  return m;
}

using dc_test::random_vector;

}  // namespace

TEST_CASE("rmsnorm matches the PyTorch float64 oracle") {
  dc::SafetensorsFile f(kOps);
  auto x = f.read_float("rmsnorm_x");
  auto w = f.read_float("rmsnorm_w");
  auto expect = f.read_float("rmsnorm_y");
  const int n = int(x.dim(0)), d = int(x.dim(1));
  std::vector<float> y(std::size_t(n) * d);
  dc::rmsnorm(dc::Context<dc::cpu>{}, y.data(), x.data(), w.data(), n, d, 1e-5f);
  CHECK(max_abs_diff(y.data(), expect.data(), expect.numel()) < 1e-5f);
  // In place (y aliases x) gives the same result.
  dc::rmsnorm(dc::Context<dc::cpu>{}, x.data(), x.data(), w.data(), n, d, 1e-5f);
  CHECK(max_abs_diff(x.data(), expect.data(), expect.numel()) < 1e-5f);
}

TEST_CASE("RoPE: rotate-half op and interleaved math match the oracle, and are one permutation apart") {
  dc::SafetensorsFile f(kOps);
  const auto pos = f.read_i32("rope_pos");
  auto x = f.read_float("rope_x");  // [tokens, heads, 16]
  auto half = f.read_float("rope_half_y");
  auto inter = f.read_float("rope_interleaved_y");
  const int n = int(x.dim(0)), heads = int(x.dim(1)), hd = int(x.dim(2));
  const float theta = 10000.0f;
  // Positions reach 1000: the fp32 angle rounds like Hugging Face's, so allow fp32 trig error.
  const float tol = 2e-4f;

  SUBCASE("rotate-half through the CPU op (q and k rows)") {
    std::vector<float> q(x.data(), x.data() + x.numel()), k = q;
    dc::rope(dc::Context<dc::cpu>{}, q.data(), k.data(), pos.data(), n, heads, heads, hd, theta);
    CHECK(max_abs_diff(q.data(), half.data(), half.numel()) < tol);
    CHECK(max_abs_diff(k.data(), half.data(), half.numel()) < tol);
  }
  SUBCASE("interleaved through the shared math") {
    std::vector<float> y(x.data(), x.data() + x.numel());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const float a = dc::math::rope_angle(pos[std::size_t(t)], dc::math::rope_inv_freq(i, hd, theta));
          float* v = y.data() + (std::size_t(t) * heads + h) * hd;
          dc::math::rope_rotate(v[dc::math::rope_interleaved_first(i)],
                                v[dc::math::rope_interleaved_second(i)], std::cos(a), std::sin(a));
        }
    CHECK(max_abs_diff(y.data(), inter.data(), inter.numel()) < tol);
  }
  SUBCASE("interleaved(x) == unpermute(rotate_half(permute(x)))") {
    // Permuting each head with rope_unpermute_source turns the interleaved layout into the
    // rotate-half one; this is what a GGUF loader relies on.
    std::vector<float> permuted(std::size_t(x.numel()));
    for (int r = 0; r < n * heads; ++r)
      for (int e = 0; e < hd; ++e)
        permuted[std::size_t(r) * hd + e] = x.data()[std::size_t(r) * hd + dc::math::rope_unpermute_source(e, hd)];
    std::vector<float> k = permuted;
    dc::rope(dc::Context<dc::cpu>{}, permuted.data(), k.data(), pos.data(), n, heads, heads, hd, theta);
    for (int r = 0; r < n * heads; ++r)
      for (int e = 0; e < hd; ++e) {
        const float got = permuted[std::size_t(r) * hd + e];
        const float want = inter.data()[std::size_t(r) * hd + dc::math::rope_unpermute_source(e, hd)];
        CHECK(std::fabs(got - want) < tol);
      }
  }
}

TEST_CASE("softmax rows match the oracle, including +-50 logits") {
  dc::SafetensorsFile f(kOps);
  auto x = f.read_float("softmax_x");
  auto expect = f.read_float("softmax_y");
  std::vector<float> y(std::size_t(x.numel()));
  dc::softmax_rows(dc::Context<dc::cpu>{}, y.data(), x.data(), int(x.dim(0)), int(x.dim(1)));
  CHECK(max_abs_diff(y.data(), expect.data(), expect.numel()) < 1e-6f);
}

TEST_CASE("swiglu matches the oracle") {
  dc::SafetensorsFile f(kOps);
  auto gate = f.read_float("swiglu_gate");
  auto up = f.read_float("swiglu_up");
  auto expect = f.read_float("swiglu_y");
  dc::swiglu(dc::Context<dc::cpu>{}, gate.data(), up.data(), gate.numel());
  CHECK(max_abs_diff(gate.data(), expect.data(), expect.numel()) < 1e-5f);
}

TEST_CASE("GQA head mapping groups consecutive query heads") {
  using dc::math::kv_head_of;
  CHECK(kv_head_of(0, 9, 3) == 0);
  CHECK(kv_head_of(2, 9, 3) == 0);
  CHECK(kv_head_of(3, 9, 3) == 1);
  CHECK(kv_head_of(8, 9, 3) == 2);
  CHECK(kv_head_of(31, 32, 8) == 7);
  CHECK(kv_head_of(5, 8, 8) == 5);  // MHA: identity
  CHECK(kv_head_of(7, 8, 1) == 0);  // MQA: one head
}

TEST_CASE("matmul equals a double-precision reference for every tile shape") {
  for (int n : {1, 2, 3, 4, 5, 13}) {
    for (const auto& shape : {std::pair{7, 3}, std::pair{64, 65}, std::pair{100, 130}, std::pair{9, 1}}) {
      // Named ints, not a structured binding: clang < 16 cannot capture those in INFO's lambda.
      const int in = shape.first, out = shape.second;
      auto x = random_vector(std::size_t(n) * in, 1);
      auto w = random_vector(std::size_t(out) * in, 2);
      auto base = random_vector(std::size_t(n) * out, 3);
      for (bool accumulate : {false, true}) {
        std::vector<float> y = base;
        dc::matmul(dc::Context<dc::cpu>{}, y.data(), x.data(), w.data(), n, in, out, accumulate);
        float worst = 0.0f;
        for (int i = 0; i < n; ++i)
          for (int o = 0; o < out; ++o) {
            double ref = accumulate ? base[std::size_t(i) * out + o] : 0.0;
            for (int k = 0; k < in; ++k) ref += double(x[std::size_t(i) * in + k]) * w[std::size_t(o) * in + k];
            worst = std::fmax(worst, float(std::fabs(ref - y[std::size_t(i) * out + o])));
          }
        INFO("n=" << n << " in=" << in << " out=" << out << " accumulate=" << accumulate);
        CHECK(worst < 1e-4f);
      }
    }
  }
}

namespace {

// Runs one micro-kernel shape both ways and compares bits.
template <int kRows, int kCols, class W>
bool micro_kernels_agree(int in, bool accumulate) {
  auto x = random_vector(std::size_t(kRows) * in, 7);
  auto wf = random_vector(std::size_t(kCols) * in, 8);
  std::vector<W> w(wf.size());
  for (std::size_t i = 0; i < wf.size(); ++i) w[i] = dc::from_float<W>(wf[i]);
  auto portable = random_vector(std::size_t(kRows) * kCols, 9), built = portable;
  dc::cpu_detail::gemm_micro_portable<kRows, kCols>(portable.data(), kCols, x.data(), w.data(), in, accumulate);
  dc::cpu_detail::gemm_micro<kRows, kCols>(built.data(), kCols, x.data(), w.data(), in, accumulate);
  return std::memcmp(portable.data(), built.data(), portable.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the GEMM micro-kernel this build runs gives the portable kernel's bits") {
  if (!DC_GEMM_AVX512) MESSAGE("built without AVX-512: the portable kernel is the one that runs");
  for (int in : {1, 15, 16, 33, 576}) {
    for (bool accumulate : {false, true}) {
      INFO("in=" << in << " accumulate=" << accumulate);
      CHECK(micro_kernels_agree<1, 1, float>(in, accumulate));
      CHECK(micro_kernels_agree<2, 8, float>(in, accumulate));
      CHECK(micro_kernels_agree<3, 5, dc::bf16>(in, accumulate));
      CHECK(micro_kernels_agree<2, 8, dc::bf16>(in, accumulate));
      CHECK(micro_kernels_agree<4, 4, dc::bf16>(in, accumulate));
    }
  }
}

TEST_CASE("a row of a batched matmul has the bits of the same row multiplied alone") {
  const int n = 23, in = 100, out = 77;
  auto x = random_vector(std::size_t(n) * in, 10);
  auto wf = random_vector(std::size_t(out) * in, 11);
  std::vector<dc::bf16> w(wf.size());
  for (std::size_t i = 0; i < wf.size(); ++i) w[i] = dc::to_bf16(wf[i]);
  std::vector<float> batched(std::size_t(n) * out), alone(out);
  dc::matmul(dc::Context<dc::cpu>{}, batched.data(), x.data(), w.data(), n, in, out);
  for (int i = 0; i < n; ++i) {
    dc::matmul(dc::Context<dc::cpu>{}, alone.data(), x.data() + std::size_t(i) * in, w.data(), 1, in, out);
    INFO("row " << i);
    CHECK(std::memcmp(alone.data(), batched.data() + std::size_t(i) * out, out * sizeof(float)) == 0);
  }
}

TEST_CASE("exp_nonpositive is within 3 ulps of e^x and 0 below the normal range") {
  // Every 97th float in [-87.3, 0] (about 11 million values, all exponents), against double.
  double worst_ulps = 0.0;
  float worst_x = 0.0f;
  for (float x = -0.0f; x >= -87.33f;) {
    const double ref = std::exp(double(x));
    const float got = dc::math::exp_nonpositive(x);
    const double ulp = double(std::nextafter(float(ref), 2.0f)) - double(float(ref));
    const double ulps = std::fabs(double(got) - ref) / ulp;
    if (ulps > worst_ulps) worst_ulps = ulps, worst_x = x;
    for (int step = 0; step < 97; ++step) x = std::nextafter(x, -INFINITY);
  }
  INFO("worst " << worst_ulps << " ulps at x = " << worst_x);
  CHECK(worst_ulps <= 3.0);
  CHECK(dc::math::exp_nonpositive(0.0f) == 1.0f);
  CHECK(dc::math::exp_nonpositive(-0.0f) == 1.0f);
  CHECK(dc::math::exp_nonpositive(-INFINITY) == 0.0f);
  CHECK(dc::math::exp_nonpositive(-87.5f) == 0.0f);
  CHECK(dc::math::exp_nonpositive(-1e30f) == 0.0f);
  CHECK(dc::math::exp_nonpositive(-87.33f) > 0.0f);
  CHECK(std::isnan(dc::math::exp_nonpositive(NAN)));  // a NaN score must not vanish as weight 0
}

TEST_CASE("log_poly is within 2 ulps of ln x (plus 1e-7 near 1) over the float range") {
  // Every 127th positive float from the smallest subnormal to the largest finite (about 17
  // million values, all exponents), against double.
  double worst = 0.0;
  float worst_x = 0.0f;
  for (std::uint32_t bits = 1; bits < 0x7f800000u; bits += 127) {
    const float x = std::bit_cast<float>(bits);
    const double ref = std::log(double(x));
    const float got = dc::math::log_poly(x);
    const double ulp = double(std::nextafter(float(ref), INFINITY)) - double(float(ref));
    const double err = std::fabs(double(got) - ref);
    const double allowed = 2.0 * std::fabs(ulp) + 1e-7;
    if (err / allowed > worst) worst = err / allowed, worst_x = x;
  }
  INFO("worst error " << worst << " of the allowance at x = " << worst_x);
  CHECK(worst <= 1.0);
  CHECK(dc::math::log_poly(1.0f) == 0.0f);
  CHECK(dc::math::log_poly(std::numeric_limits<float>::max()) == doctest::Approx(88.7228391));
  CHECK(dc::math::log_poly(0.0f) == -INFINITY);
  CHECK(dc::math::log_poly(-0.0f) == -INFINITY);
  CHECK(dc::math::log_poly(INFINITY) == INFINITY);
  CHECK(std::isnan(dc::math::log_poly(-1.0f)));
  CHECK(std::isnan(dc::math::log_poly(-INFINITY)));
  CHECK(std::isnan(dc::math::log_poly(NAN)));
  // A loop over an array (what the compiler vectorises) gives the scalar's bits.
  std::vector<float> xs(1000), ys(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = std::ldexp(1.0f + float(i) / 1000.0f, int(i % 200) - 100);
  for (std::size_t i = 0; i < xs.size(); ++i) ys[i] = dc::math::log_poly(xs[i]);
  for (std::size_t i = 0; i < xs.size(); i += 37) CHECK(ys[i] == dc::math::log_poly(xs[i]));
}

TEST_CASE("attention equals an explicit masked softmax over a compacted cache") {
  // 3 query heads per KV head, window 6, cache slots holding non-contiguous positions (as after
  // eviction), different ones in each KV head (per-head keep-sets): the op must mask each head by
  // its own positions, not by slot. Head dims 8 and 18 (no multiple of 4 or 8: the CPU oracle of
  // the CUDA tests' padded head dims).
  for (const int head_dim : {8, 18}) {
    CAPTURE(head_dim);
    const dc::AttentionShape s{6, 2, head_dim, 6, 1.0f / std::sqrt(float(head_dim)), 16};
    const int len = 8;
    std::vector<std::int32_t> key_pos(std::size_t(2) * s.capacity, -1);  // [kv_heads, capacity]
    const std::int32_t head0[] = {0, 1, 4, 5, 7, 9, 10, 11}, head1[] = {0, 2, 3, 6, 8, 9, 10, 11};
    std::copy(head0, head0 + len, key_pos.begin());
    std::copy(head1, head1 + len, key_pos.begin() + s.capacity);
    const std::vector<std::int32_t> query_pos{10, 11};
    const int n = 2;
    auto kc = random_vector(std::size_t(s.num_kv_heads) * s.capacity * s.head_dim, 4);
    auto vc = random_vector(kc.size(), 5);
    auto q = random_vector(std::size_t(n) * s.num_heads * s.head_dim, 6);
    std::vector<float> out(q.size());
    dc::attention(dc::Context<dc::cpu>{}, out.data(), q.data(), kc.data(), vc.data(), key_pos.data(),
                  len, query_pos.data(), n, s);
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < s.num_heads; ++h) {
        const int g = h / 3;
        const std::int32_t* kp = key_pos.data() + std::size_t(g) * s.capacity;
        std::vector<double> p(std::size_t(len), 0.0);
        double m = -1e300, z = 0.0;
        for (int j = 0; j < len; ++j) {
          const bool visible = kp[j] <= query_pos[std::size_t(t)] && query_pos[std::size_t(t)] - kp[j] < 6;
          if (!visible) continue;
          double dot = 0.0;
          for (int i = 0; i < s.head_dim; ++i)
            dot += double(q[(std::size_t(t) * s.num_heads + h) * s.head_dim + i]) *
                   kc[(std::size_t(g) * s.capacity + j) * s.head_dim + i];
          p[std::size_t(j)] = dot * s.scale;
          m = std::max(m, p[std::size_t(j)]);
        }
        for (int j = 0; j < len; ++j) {
          const bool visible = kp[j] <= query_pos[std::size_t(t)] && query_pos[std::size_t(t)] - kp[j] < 6;
          p[std::size_t(j)] = visible ? std::exp(p[std::size_t(j)] - m) : 0.0;
          z += p[std::size_t(j)];
        }
        for (int i = 0; i < s.head_dim; ++i) {
          double ref = 0.0;
          for (int j = 0; j < len; ++j)
            ref += p[std::size_t(j)] / z * vc[(std::size_t(g) * s.capacity + j) * s.head_dim + i];
          CHECK(std::fabs(ref - out[(std::size_t(t) * s.num_heads + h) * s.head_dim + i]) < 1e-5);
        }
      }
  }
}

namespace {

// Three decode queries at the end of a cache of len slots (4 query heads on 2 KV heads,
// head_dim 8): run() gives the output followed by the statistics block.
struct StatisticsCase {
  int len, n = 3;
  dc::AttentionShape s;
  std::vector<std::int32_t> key_pos, query_pos;  // key_pos [kv_heads, capacity]
  std::vector<float> kc, vc, q;

  StatisticsCase(int length, unsigned seed)
      : len(length), s{4, 2, 8, 0, 1.0f / std::sqrt(8.0f), length},
        key_pos(std::size_t(s.num_kv_heads) * std::size_t(length)),
        query_pos{length - 3, length - 2, length - 1},
        kc(random_vector(std::size_t(s.num_kv_heads) * std::size_t(length) * std::size_t(s.head_dim), seed)),
        vc(random_vector(kc.size(), seed + 1)),
        q(random_vector(std::size_t(n) * std::size_t(s.num_heads) * std::size_t(s.head_dim), seed + 2)) {
    for (std::size_t j = 0; j < key_pos.size(); ++j) key_pos[j] = std::int32_t(j % std::size_t(len));
  }
  std::vector<float> run(int first_observed) const {
    std::vector<float> out(q.size()), stats(std::size_t(dc::stat_block_floats(s.num_heads, s.num_kv_heads, len)), 0.0f);
    dc::attention(dc::Context<dc::cpu>{}, out.data(), q.data(), kc.data(), vc.data(), key_pos.data(),
                  len, query_pos.data(), n, s, dc::AttentionStats{stats.data(), first_observed});
    out.insert(out.end(), stats.begin(), stats.end());
    return out;
  }
  // The count of observed queries that saw slot 0 of KV head 0.
  static float queries_of_slot0(const std::vector<float>& run_output, const StatisticsCase& c) {
    return run_output[c.q.size() + std::size_t(dc::kStatQueries) * std::size_t(c.len)];
  }
};

}  // namespace

#if defined(_OPENMP)
TEST_CASE("attention statistics over a long cache are identical for 1 and 2 threads") {
  // Past 4096 (KV head, slot) pairs the statistics fold runs in parallel; each slot must still be
  // accumulated by one thread in query order (also what the ThreadSanitizer run exercises).
  const StatisticsCase c(5000, 7);
  auto run = [&](int threads) { return dc_test::with_threads(threads, [&] { return c.run(1); }); };
  const auto one = run(1);
  CHECK(one == run(2));
  CHECK(StatisticsCase::queries_of_slot0(one, c) == 2.0f);  // queries 1 and 2 observed
}
#endif

TEST_CASE("attention statistics: a negative first_observed observes every query, as on the GPU") {
  const StatisticsCase c(12, 17);
  const auto all = c.run(0);
  CHECK(all == c.run(-5));
  CHECK(StatisticsCase::queries_of_slot0(all, c) == 3.0f);  // all 3 queries see slot 0
  CHECK(StatisticsCase::queries_of_slot0(c.run(c.n), c) == 0.0f);  // none observed
}

TEST_CASE("grouped-query attention gives each query head the bits of the same head over its own copy of K and V") {
  // The kernel attends a KV head's query heads together (reading each K/V row once); a head's
  // arithmetic must not depend on its group: `heads` query heads on `kv` KV heads against
  // `heads` on `heads` KV heads holding each group's K and V once per query head, which attends
  // every head alone. 9 on 3 (SmolLM2) runs whole groups; one decode query of 4 heads on 1 KV
  // head on 2 threads has fewer units than threads, so the group is cut in two parts.
  auto check = [](int heads, int kv, int n, int threads) {
    const int len = 300, hd = 64, group = heads / kv;
    const dc::AttentionShape gqa{heads, kv, hd, 0, 0.125f, len}, mha{heads, heads, hd, 0, 0.125f, len};
    const auto kc = random_vector(std::size_t(kv) * len * hd, 21), vc = random_vector(kc.size(), 22);
    const auto q = random_vector(std::size_t(n) * heads * hd, 23);
    std::vector<float> kh, vh;
    for (int h = 0; h < heads; ++h) {
      const auto from = std::ptrdiff_t(std::size_t(h / group) * len * hd), size = std::ptrdiff_t(len * hd);
      kh.insert(kh.end(), kc.begin() + from, kc.begin() + from + size);
      vh.insert(vh.end(), vc.begin() + from, vc.begin() + from + size);
    }
    std::vector<std::int32_t> pos(std::size_t(heads) * len);
    for (std::size_t j = 0; j < pos.size(); ++j) pos[j] = std::int32_t(j % std::size_t(len));
    std::vector<std::int32_t> query_pos;
    for (int t = 0; t < n; ++t) query_pos.push_back(len - n + t);
    std::vector<float> grouped(q.size()), alone(q.size());
    dc_test::with_threads(threads, [&] {
      dc::attention(dc::Context<dc::cpu>{}, grouped.data(), q.data(), kc.data(), vc.data(), pos.data(),
                    len, query_pos.data(), n, gqa);
      dc::attention(dc::Context<dc::cpu>{}, alone.data(), q.data(), kh.data(), vh.data(), pos.data(),
                    len, query_pos.data(), n, mha);
      return 0;
    });
    return std::memcmp(grouped.data(), alone.data(), grouped.size() * sizeof(float)) == 0;
  };
  CHECK(check(9, 3, 2, 1));
  CHECK(check(9, 3, 2, 2));
  CHECK(check(4, 1, 1, 1));
  CHECK(check(4, 1, 1, 2));
}

TEST_CASE("attention over several sequences in one call gives each the bits of its call alone") {
  // A batched decode step runs every sequence's attention as one job list: different lengths,
  // fp32 and bf16 caches, statistics on some; outputs and statistics must be each job's alone,
  // for 1 and 2 threads.
  const StatisticsCase a(37, 31), b(700, 32), c(5, 33);
  std::vector<dc::bf16> kb(b.kc.size()), vb(b.vc.size());
  for (std::size_t i = 0; i < kb.size(); ++i) kb[i] = dc::to_bf16(b.kc[i]), vb[i] = dc::to_bf16(b.vc[i]);
  struct Buffers {
    std::vector<float> out, stats;
  };
  auto buffers = [](const StatisticsCase& x) {
    return Buffers{std::vector<float>(x.q.size()),
                   std::vector<float>(std::size_t(dc::stat_block_floats(x.s.num_heads, x.s.num_kv_heads, x.len)), 0.0f)};
  };
  auto job = [](const StatisticsCase& x, Buffers& buf, const auto* k, const auto* v, bool stats) {
    return dc::AttentionJob::make(buf.out.data(), x.q.data(), k, v, x.key_pos.data(), x.len,
                                  x.query_pos.data(), x.n, x.s,
                                  dc::AttentionStats{stats ? buf.stats.data() : nullptr, 1});
  };
  for (const int threads : {1, 2}) {
    Buffers ba = buffers(a), bb = buffers(b), bc = buffers(c), sa = buffers(a), sb = buffers(b), sc = buffers(c);
    dc_test::with_threads(threads, [&] {
      const std::vector<dc::AttentionJob> jobs{job(a, ba, a.kc.data(), a.vc.data(), true),
                                               job(b, bb, kb.data(), vb.data(), true),
                                               job(c, bc, c.kc.data(), c.vc.data(), false)};
      dc::attention(dc::Context<dc::cpu>{}, std::span<const dc::AttentionJob>(jobs));
      for (const dc::AttentionJob& alone : {job(a, sa, a.kc.data(), a.vc.data(), true),
                                             job(b, sb, kb.data(), vb.data(), true),
                                             job(c, sc, c.kc.data(), c.vc.data(), false)})
        dc::attention(dc::Context<dc::cpu>{}, std::span<const dc::AttentionJob>(&alone, 1));
      return 0;
    });
    CHECK(ba.out == sa.out);
    CHECK(ba.stats == sa.stats);
    CHECK(bb.out == sb.out);
    CHECK(bb.stats == sb.stats);
    CHECK(bc.out == sc.out);
    CHECK(sa.stats[std::size_t(dc::kStatQueries) * std::size_t(a.len)] == 2.0f);  // queries 1 and 2 observed
  }
}

TEST_CASE("the CPU statistics fold gives bitwise the per-slot formula's sums") {
  // fold_statistics_cpu turns math::fold_slot_statistics's loops inside out (slots innermost, in
  // runs) to vectorise them; every slot must still get the formula's sums in its order. 4 query
  // heads on 2 KV heads, a window of 300 so that some observed queries miss some slots, 700 slots
  // (runs of 256 plus a remainder), 3 observed queries, a block that already holds sums.
  const dc::AttentionShape s{4, 2, 8, 300, 1.0f, 1024};
  const int len = 700, observed = 3, group = 2;
  std::vector<std::int32_t> key_pos(std::size_t(s.num_kv_heads) * s.capacity, -1);
  for (int g = 0; g < s.num_kv_heads; ++g)
    for (int j = 0; j < len; ++j) key_pos[std::size_t(g) * s.capacity + j] = 2 * j + g;  // evicted gaps
  const std::vector<std::int32_t> observed_pos{1390, 1395, 1400};
  auto probs = random_vector(std::size_t(observed) * s.num_heads * len, 31);
  auto entropy = random_vector(std::size_t(observed) * s.num_heads, 32);
  for (std::size_t r = 0; r < std::size_t(observed); ++r)
    for (int h = 0; h < s.num_heads; ++h)
      for (int j = 0; j < len; ++j) {
        float& p = probs[(r * s.num_heads + h) * len + j];
        const int kp = key_pos[std::size_t(dc::math::kv_head_of(h, 4, 2)) * s.capacity + j];
        p = dc::math::attends(observed_pos[r], kp, s.window) ? std::fabs(p) : 0.0f;
      }
  for (float& e : entropy) e = std::fabs(e) * 3.0f;
  const auto initial = random_vector(std::size_t(dc::stat_block_floats(4, 2, s.capacity)), 33);
  std::vector<float> fast = initial, reference = initial;
  dc::cpu_detail::fold_statistics_cpu(fast.data(), probs.data(), entropy.data(), key_pos.data(),
                                      observed_pos.data(), observed, len, s);
  const int rows = dc::stat_rows_per_kv_head(group);
  for (int g = 0; g < s.num_kv_heads; ++g)
    for (int j = 0; j < len; ++j) {
      const int key = key_pos[std::size_t(g) * s.capacity + j];
      dc::math::fold_slot_statistics(
          reference.data() + std::size_t(g) * rows * s.capacity, s.capacity, j, observed, group,
          [&](int r) { return dc::math::attends(observed_pos[std::size_t(r)], key, s.window); },
          [&](int r, int h, float& p, float& row_entropy) {
            const std::size_t row = std::size_t(r) * s.num_heads + std::size_t(g) * group + h;
            p = probs[row * len + j];
            row_entropy = entropy[row];
          });
    }
  CHECK(fast == reference);
  // The window: slot 0 (position 0) is seen by no observed query, slot 695 (position 1390) by all
  // three, slot 699 (position 1398) by the newest only.
  auto queries_added = [&](int j) {
    const std::size_t i = std::size_t(dc::kStatQueries) * s.capacity + std::size_t(j);
    return double(fast[i]) - double(initial[i]);
  };
  CHECK(queries_added(0) == doctest::Approx(0.0));
  CHECK(queries_added(695) == doctest::Approx(3.0));
  CHECK(queries_added(699) == doctest::Approx(1.0));
}

TEST_CASE("bf16 and f16 conversions round to nearest even and keep specials") {
  CHECK(dc::to_float(dc::to_bf16(1.0f)) == 1.0f);
  CHECK(dc::to_bf16(1.00390625f).bits == 0x3f80);   // exactly halfway, ties to even (down)
  CHECK(dc::to_bf16(1.01171875f).bits == 0x3f82);   // halfway, ties to even (up)
  CHECK(std::isnan(dc::to_float(dc::to_bf16(NAN))));
  CHECK(dc::to_float(dc::to_bf16(INFINITY)) == INFINITY);
  CHECK(dc::to_float(dc::to_f16(65504.0f)) == 65504.0f);
  CHECK(dc::to_float(dc::to_f16(65520.0f)) == INFINITY);  // halfway past max rounds to Inf
  CHECK(dc::to_float(dc::to_f16(5.9604644775390625e-08f)) == 5.9604644775390625e-08f);  // min subnormal
  CHECK(dc::to_float(dc::to_f16(-2.0f)) == -2.0f);
  CHECK(dc::to_f16(1.0f + 1.0f / 2048.0f).bits == 0x3c00);  // halfway, ties to even
  CHECK(std::isnan(dc::to_float(dc::to_f16(NAN))));
  // Every f16 value survives f16 -> f32 -> f16 unchanged (exhaustive over non-NaN patterns).
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const dc::f16 h{std::uint16_t(b)};
    if ((b & 0x7c00u) == 0x7c00u && (b & 0x3ffu)) continue;  // NaN payloads
    REQUIRE(dc::to_f16(dc::to_float(h)).bits == h.bits);
  }
}
