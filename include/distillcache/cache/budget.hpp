#pragma once
// Budget: how many tokens an evicted cache keeps, and when decode-time eviction runs.
//
// Given as a token count or as a fraction of the prompt. Defaults: no protected tokens (each
// policy carries its own rule, e.g. StreamingLLM's sinks), and a chunk that grows with the budget
// (chunk_for) — during decoding the cache grows to B + chunk tokens, then is evicted back to B,
// so eviction runs once per chunk tokens.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../core/error.hpp"

namespace dc {

struct Budget {
  int tokens = 0;         // > 0: an absolute count
  double fraction = 0.0;  // in (0, 1]: a fraction of the prompt (used when tokens == 0)
  int sink = 0;           // first positions always kept
  int recent = 0;         // newest tokens always kept
  int chunk = 0;          // decode-time slack before evicting back to the budget; 0: chunk_for's rule

  // The proportional chunk: B / 64 tokens, at least 16. Why it grows with B: an eviction gathers,
  // scores and may move every kept row, so its cost grows with B while a decode step's grows
  // more slowly (the weights dominate it); a fixed chunk lets the eviction's share of a step grow
  // with the budget. B / 64 holds the cache's overshoot to 1/64 of B (1.6 %). Every budget up to
  // 1087 tokens gets 16 (all of the committed fidelity tables: L <= 2048); B = 2048 (25 % of 8k)
  // gets 32, measured to cost no fidelity (bench/results/README.md, "A chunk proportional to the budget").
  static constexpr int kMinAutoChunk = 16;
  static constexpr int kAutoChunkDivisor = 64;

  // The decode-time chunk for a resolved budget of b tokens: `chunk` when set, else the rule above.
  int chunk_for(int b) const { return chunk > 0 ? chunk : std::max(kMinAutoChunk, b / kAutoChunkDivisor); }

  static Budget of_tokens(int n) {
    Budget b;
    b.tokens = n;
    return b;
  }
  static Budget of_fraction(double f) {
    Budget b;
    b.fraction = f;
    return b;
  }

  // The budget in tokens for a prompt of prompt_length tokens; validates everything.
  int resolve(int prompt_length) const {
    DC_CHECK(prompt_length > 0, "budget: the prompt is empty");
    DC_CHECK(chunk >= 0, "budget: chunk must be >= 1 (or 0: proportional to the budget), got ", chunk);
    DC_CHECK(sink >= 0 && recent >= 0, "budget: sink and recent must be >= 0, got ", sink, " and ",
             recent);
    DC_CHECK(tokens != 0 || fraction != 0.0,
             "budget is 0: give a positive token count or a fraction in (0, 1]");
    int b = 0;
    if (tokens != 0) {
      DC_CHECK(tokens > 0, "budget: token count must be positive, got ", tokens);
      DC_CHECK(tokens <= prompt_length, "budget: ", tokens, " tokens exceed the prompt length ",
               prompt_length);
      b = tokens;
    } else {
      DC_CHECK(std::isfinite(fraction), "budget: fraction is not finite (", fraction, ")");
      DC_CHECK(fraction > 0.0 && fraction <= 1.0, "budget: fraction must be in (0, 1], got ",
               fraction);
      b = static_cast<int>(std::ceil(fraction * prompt_length));
    }
    DC_CHECK(sink + recent <= b, "budget: ", sink, " sink + ", recent,
             " recent protected tokens exceed the budget of ", b);
    return b;
  }
};

}  // namespace dc
