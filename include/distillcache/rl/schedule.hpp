#pragma once
// Learning-rate schedule for the REINFORCE trainer: linear warm-up from 0 to `peak`, then a
// half-cosine from `peak` down to `floor` at total_steps, and `floor` after that. Steps count
// from 1, as Adam's do (math/adam.hpp):
//   step <= warmup:          peak * step / warmup            (peak exactly at step = warmup)
//   warmup < step <= total:  floor + (peak - floor) (1 + cos(pi (step - warmup) / (total - warmup))) / 2
//   step > total:            floor
// A floor above 0 keeps late updates from vanishing while the reward is still noisy.
#include <cmath>
#include <numbers>

#include "../core/error.hpp"

namespace dc {

inline float learning_rate(int step, int warmup_steps, int total_steps, float peak, float floor) {
  DC_CHECK(step >= 1, "learning_rate: step must be >= 1 (steps count from 1), got ", step);
  DC_CHECK(warmup_steps >= 0, "learning_rate: warmup_steps must be >= 0, got ", warmup_steps);
  DC_CHECK(total_steps >= warmup_steps && total_steps >= 1, "learning_rate: total_steps (",
           total_steps, ") must be >= 1 and >= warmup_steps (", warmup_steps, ")");
  DC_CHECK(std::isfinite(peak) && std::isfinite(floor) && floor >= 0.0f && floor <= peak,
           "learning_rate: need 0 <= floor <= peak (finite), got floor ", floor, ", peak ", peak);
  if (step <= warmup_steps) return float(double(peak) * step / warmup_steps);
  if (step >= total_steps) return floor;
  const double progress = double(step - warmup_steps) / double(total_steps - warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return float(double(floor) + (double(peak) - double(floor)) * cosine);
}

}  // namespace dc
