#pragma once
// SwiGLU feed-forward nonlinearity (Shazeer 2020): silu(gate) * up, silu(x) = x * sigmoid(x).
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

DC_HD float silu(float x) { return x / (1.0f + expf(-x)); }

DC_HD float swiglu(float gate, float up) { return silu(gate) * up; }

}  // namespace dc::math
