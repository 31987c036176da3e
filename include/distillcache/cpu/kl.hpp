#pragma once
// CPU KL divergence of logit-row pairs: out[r] = KL(softmax(p[r, :]) || softmax(q[r, :])) for
// p, q of [rows, vocab] (row-major), in nats. kl_rows is the fused one-pass kernel
// (math::OnlineKL); kl_rows_reference is the naive two-pass double-precision oracle of the tests.
// -inf logits follow math/kl.hpp: banned by P contributes 0, allowed by P and banned by Q is +inf.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/kl.hpp"

namespace dc {
namespace cpu_detail {

// Entries per partial state. One float running sum over a whole 49152-entry row drifts by
// ~1e-5 relative; summing 256 entries into a fresh state and merging the partials keeps S_p, S_q
// and C near 1e-6, and the merges (two expf each) cost under 1 % of the row.
inline constexpr int kKlChunk = 256;

// p, q: [vocab].
inline float kl_row(const float* DC_RESTRICT p, const float* DC_RESTRICT q, int vocab) {
  math::OnlineKL total;
  for (int start = 0; start < vocab; start += kKlChunk) {
    const int end = std::min(vocab, start + kKlChunk);
    math::OnlineKL part;
    for (int v = start; v < end; ++v) part.add(p[v], q[v]);
    total.merge(part);
  }
  return total.value();
}

}  // namespace cpu_detail

// p_logits, q_logits: [rows, vocab]; out: [rows]. Rows are independent (one thread each, fixed
// order inside a row), so the result does not depend on the thread count.
inline void kl_rows(const Context<cpu>&, const float* p_logits, const float* q_logits, int rows,
                    int vocab, float* out) {
  math::check_kl_rows(p_logits, q_logits, rows, vocab, out);
  // A row is ~2 expf per entry: threads pay from a few thousand entries in all.
  const bool parallel = rows > 1 && std::int64_t(rows) * vocab >= (std::int64_t(1) << 14);
  DC_OMP(parallel for schedule(static) if (parallel))
  for (int r = 0; r < rows; ++r) {
    const std::int64_t off = std::int64_t(r) * vocab;
    out[r] = cpu_detail::kl_row(p_logits + off, q_logits + off, vocab);
  }
  (void)parallel;  // unused without OpenMP
}

// The textbook two passes in double: log-sum-exp of each row, then sum_v P_v (log P_v - log Q_v).
// Slow and simple on purpose: the oracle kl_rows (CPU and CUDA) is tested against.
inline void kl_rows_reference(const Context<cpu>&, const float* p_logits, const float* q_logits,
                              int rows, int vocab, double* out) {
  math::check_kl_rows(p_logits, q_logits, rows, vocab, out);
  const auto log_sum_exp = [vocab](const float* x) {
    double m = -INFINITY;
    for (int v = 0; v < vocab; ++v) m = std::max(m, double(x[v]));
    if (m == -INFINITY) return m;  // every token banned
    double s = 0.0;
    for (int v = 0; v < vocab; ++v) s += std::exp(double(x[v]) - m);
    return m + std::log(s);
  };
  for (int r = 0; r < rows; ++r) {
    const float* p = p_logits + std::int64_t(r) * vocab;
    const float* q = q_logits + std::int64_t(r) * vocab;
    const double lse_p = log_sum_exp(p), lse_q = log_sum_exp(q);
    if (lse_p == -INFINITY) {  // P is no distribution
      out[r] = NAN;
      continue;
    }
    double kl = 0.0;
    for (int v = 0; v < vocab; ++v) {
      if (p[v] == -INFINITY) continue;
      const double log_p = double(p[v]) - lse_p, log_q = double(q[v]) - lse_q;  // -inf if Q bans
      kl += std::exp(log_p) * (log_p - log_q);
    }
    out[r] = std::max(kl, 0.0);
  }
}

}  // namespace dc
