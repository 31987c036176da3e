// The CUDA KL kernel and optimizer ops against their CPU oracles (cpu/kl.hpp, cpu/adam.hpp), by
// normalised error max|cuda - cpu| / max(1e-6, max|cpu|). Tolerances:
//   kl_rows 1e-5: both sum in float with math::OnlineKL but in different orders (256-entry
//     chunks on the CPU, a strided share per thread and a tree merge on the GPU);
//   adam_update 1e-6: the same element formula; only FMA contraction and device libm differ;
//   grad_norm 1e-12 relative: both accumulate in double, in different orders.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <distillcache/cpu/adam.hpp>
#include <distillcache/cpu/kl.hpp>
#include <distillcache/cuda/adam.cuh>
#include <distillcache/cuda/kl.cuh>
#include <distillcache/distillcache.cuh>

#include "../support/cuda_compare.cuh"
#include "../support/random.hpp"

namespace {

using Gpu = dc::Context<dc::cuda>;
const dc::Context<dc::cpu> kCpu{};
using dc_test::random_vector;

using dc_test::download;
using dc_test::normalised_error;
using dc_test::upload;

// out[r] of both backends for p, q of [rows, vocab].
struct KlPair {
  std::vector<float> gpu, cpu;
};
KlPair both_kl(const Gpu& ctx, const std::vector<float>& p, const std::vector<float>& q, int rows,
               int vocab) {
  KlPair r{std::vector<float>(std::size_t(rows)), std::vector<float>(std::size_t(rows))};
  dc::kl_rows(kCpu, p.data(), q.data(), rows, vocab, r.cpu.data());
  auto dp = upload(ctx, p), dq = upload(ctx, q);
  dc::Tensor<float, dc::cuda> out(dc::Shape{std::int64_t(rows)});
  dc::kl_rows(ctx, dp.data(), dq.data(), rows, vocab, out.data());
  r.gpu = download(ctx, out);
  return r;
}

}  // namespace

TEST_CASE("cuda kl_rows matches the CPU kl_rows") {
  Gpu ctx;
  struct Case {
    int rows, vocab;
  };
  // Below and above the 4096 switch between 128- and 512-thread blocks, multiples and
  // non-multiples of both, and SmolLM2's vocabulary.
  for (Case c : {Case{1, 1}, Case{3, 7}, Case{5, 128}, Case{4, 1000}, Case{2, 4095}, Case{3, 4096},
                 Case{6, 5000}, Case{8, 49152}, Case{3, 49153}}) {
    CAPTURE(c.rows);
    CAPTURE(c.vocab);
    const std::size_t count = std::size_t(c.rows) * std::size_t(c.vocab);
    const auto p = random_vector(count, unsigned(c.vocab) + 1, 3.0f);
    auto q = random_vector(count, unsigned(c.vocab) + 2, 0.5f);
    for (std::size_t i = 0; i < count; ++i) q[i] += p[i];
    const KlPair kl = both_kl(ctx, p, q, c.rows, c.vocab);
    CHECK(normalised_error(kl.gpu, kl.cpu) < 1e-5f);
    // Identical rows: exactly 0 on the device too.
    const KlPair same = both_kl(ctx, p, p, c.rows, c.vocab);
    for (float x : same.gpu) CHECK(x == 0.0f);
  }
}

TEST_CASE("cuda kl_rows: -inf logits as on the CPU") {
  Gpu ctx;
  const int rows = 3, vocab = 6000;
  const float inf = std::numeric_limits<float>::infinity();
  auto p = random_vector(std::size_t(rows) * vocab, 71, 2.0f);
  auto q = random_vector(std::size_t(rows) * vocab, 72, 2.0f);
  for (int v = 0; v < 700; ++v) p[std::size_t(v)] = -inf;  // row 0: P bans a leading block
  q[std::size_t(vocab) + 5] = -inf;                          // row 1: Q bans one token P allows
  p[2 * std::size_t(vocab) + 9] = -inf;                      // row 2: both ban one token
  q[2 * std::size_t(vocab) + 9] = -inf;
  const KlPair kl = both_kl(ctx, p, q, rows, vocab);
  CHECK(kl.gpu[1] == inf);
  CHECK(kl.cpu[1] == inf);
  CHECK(std::fabs(kl.gpu[0] - kl.cpu[0]) <= 1e-5f * kl.cpu[0]);
  CHECK(std::fabs(kl.gpu[2] - kl.cpu[2]) <= 1e-5f * kl.cpu[2]);
}

TEST_CASE("cuda adam_update, grad_norm and scale_gradients match the CPU") {
  Gpu ctx;
  const std::int64_t n = 100003;  // not a multiple of the block size
  dc::AdamHyper h;
  h.lr = 3e-3f;
  h.weight_decay = 0.01f;
  auto params = random_vector(std::size_t(n), 81);
  std::vector<float> m(std::size_t(n), 0.0f), v(std::size_t(n), 0.0f);
  auto dparams = upload(ctx, params), dm = upload(ctx, m), dv = upload(ctx, v);
  for (int t = 1; t <= 5; ++t) {
    const auto g = random_vector(std::size_t(n), 90 + unsigned(t), 0.5f);
    auto dg = upload(ctx, g);
    dc::adam_update(kCpu, params.data(), g.data(), m.data(), v.data(), n, h, t);
    dc::adam_update(ctx, dparams.data(), dg.data(), dm.data(), dv.data(), n, h, t);
  }
  CHECK(normalised_error(download(ctx, dparams), params) < 1e-6f);
  CHECK(normalised_error(download(ctx, dm), m) < 1e-6f);
  CHECK(normalised_error(download(ctx, dv), v) < 1e-6f);

  for (std::int64_t len : {std::int64_t(1), std::int64_t(1000), std::int64_t(1 << 20) + 7}) {
    CAPTURE(len);
    auto g = random_vector(std::size_t(len), 99, 2.0f);
    auto dg = upload(ctx, g);
    const double want = dc::grad_norm(kCpu, g.data(), len);
    CHECK(dc::grad_norm(ctx, dg.data(), len) == doctest::Approx(want).epsilon(1e-12));
    const float f = dc::math::clip_factor(want, 0.5 * want);
    dc::scale_gradients(kCpu, g.data(), len, f);
    dc::scale_gradients(ctx, dg.data(), len, f);
    CHECK(download(ctx, dg) == g);  // one float multiply per entry: bitwise equal
  }
  CHECK(dc::grad_norm(ctx, nullptr, 0) == 0.0);
  CHECK_THROWS_WITH_AS(dc::adam_update(ctx, dparams.data(), nullptr, dm.data(), dv.data(), n, h, 1),
                       doctest::Contains("adam_update: null pointer for grads"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::kl_rows(ctx, dparams.data(), dparams.data(), 1, 0, dm.data()),
                       doctest::Contains("kl_rows: vocab must be positive, got 0"), dc::Error);
}
