#pragma once
// KL divergence between next-token distributions given as logits, and the pieces of it.
// KL(P || Q) = sum_v p_v (log p_v - log q_v), with log p = logit - logsumexp(logits).
//
// OnlineKL computes it in one pass over the two logit rows (the REINFORCE reward is -KL of the
// teacher's row P against the student's row Q, for every step of every sampled keep-set, so the
// rows are read once). With m = max of a row, S = sum_v exp(x_v - m) and
//   C = sum_v exp(p_v - m_p) (p_v - q_v),
// log P_v - log Q_v = (p_v - q_v) - (m_p + log S_p) + (m_q + log S_q), and averaging over P:
//   KL(P || Q) = C / S_p - (m_p + log S_p) + (m_q + log S_q).
// All three sums are rescaled whenever a running max grows, as in OnlineSoftmax, so nothing
// overflows; two partial states (tiles, threads) merge exactly like softmax states.
//
// -inf logits (banned tokens): a token P bans has P_v = 0 and contributes 0 whatever Q says; a
// token P allows and Q bans makes KL = +inf. A row P that bans every token is no distribution:
// value() is NaN. NaN or +inf logits are outside the contract (check_logits rejects them) and
// give NaN.
#include <cmath>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "softmax.hpp"

namespace dc::math {

// One vocabulary entry's contribution, from the two log-probabilities.
DC_HD float kl_term(float log_p, float log_q) {
  return log_p == -INFINITY ? 0.0f : expf(log_p) * (log_p - log_q);
}

struct OnlineKL {
  float max_p = -INFINITY;  // m_p
  float sum_p = 0.0f;       // S_p = sum exp(p_v - m_p)
  float cross = 0.0f;       // C = sum exp(p_v - m_p) (p_v - q_v)
  OnlineSoftmax q;          // m_q, S_q
  bool infinite = false;    // some token has P_v > 0 = Q_v

  // Adds one vocabulary entry: p, q are the two rows' logits of the same token.
  DC_HD void add(float p, float q_logit) {
    q.push(q_logit);
    if (p == -INFINITY) return;  // P_v = 0: no term, and p - q could be NaN (-inf - -inf)
    if (q_logit == -INFINITY) {  // P_v > 0 = Q_v: the result is +inf, nothing else matters
      infinite = true;
      return;
    }
    const float d = p - q_logit;
    if (p <= max_p) {
      const float w = expf(p - max_p);
      sum_p += w;
      cross += w * d;
    } else {
      const float r = expf(max_p - p);  // 0 for the first finite p (max_p = -inf)
      sum_p = sum_p * r + 1.0f;
      cross = cross * r + d;
      max_p = p;
    }
  }

  // Merges a state over other entries of the same rows (another thread's or tile's share).
  DC_HD void merge(const OnlineKL& o) {
    infinite = infinite || o.infinite;
    q.combine(o.q);
    if (o.max_p == -INFINITY) return;  // o saw no token P allows: S_p = C = 0 there
    if (max_p == -INFINITY) {
      max_p = o.max_p;
      sum_p = o.sum_p;
      cross = o.cross;
      return;
    }
    const float m = fmaxf(max_p, o.max_p);
    const float a = expf(max_p - m), b = expf(o.max_p - m);
    sum_p = sum_p * a + o.sum_p * b;
    cross = cross * a + o.cross * b;
    max_p = m;
  }

  // KL(P || Q) in nats, >= 0. The two log-sum-exps enter as (m_p - m_q) + log(S_p / S_q): both
  // S lie in [1, V], so the ratio is safe, and identical rows give exactly 0 (the same
  // operations on the same numbers) instead of the rounding of two ~log V terms.
  DC_HD float value() const {
    if (infinite) return INFINITY;
    const float kl = cross / sum_p - (max_p - q.max) - logf(sum_p / q.sum);
    return kl < 0.0f ? 0.0f : kl;  // rounding can dip below 0 for near-identical rows; NaN stays
  }
};

// Argument checks shared by the CPU and CUDA kl_rows (host only): rows of [rows, vocab] floats.
inline void check_kl_rows(const float* p_logits, const float* q_logits, int rows, int vocab,
                          const void* out) {
  DC_CHECK(rows >= 0, "kl_rows: rows must be >= 0, got ", rows);
  DC_CHECK(vocab > 0, "kl_rows: vocab must be positive, got ", vocab);
  DC_CHECK(rows == 0 || (p_logits && q_logits && out), "kl_rows: null pointer for ",
           !p_logits ? "p_logits" : !q_logits ? "q_logits" : "out", " with ", rows, " rows");
}

}  // namespace dc::math
