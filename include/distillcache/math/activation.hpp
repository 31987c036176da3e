#pragma once
// Feed-forward nonlinearities and logit soft-capping, shared by the CPU ops and CUDA kernels.
//   SwiGLU (Shazeer 2020; Llama, Mistral): silu(gate) * up, silu(x) = x * sigmoid(x).
//   GeGLU (Gemma): gelu_tanh(gate) * up, with the tanh approximation of GELU that Hugging Face
//     calls gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The constant and
//     the order of operations follow PyTorch's fp32 kernel, so the rounding matches it closely.
//   Soft-capping (Gemma 2; final_logit_softcapping): cap * tanh(x / cap), a smooth clamp to
//     (-cap, cap).
#include <cmath>

#include "../core/config.hpp"

namespace dc::math {

DC_HD float silu(float x) { return x / (1.0f + expf(-x)); }

DC_HD float swiglu(float gate, float up) { return silu(gate) * up; }

DC_HD float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.0f + tanhf(inner));
}

DC_HD float geglu(float gate, float up) { return gelu_tanh(gate) * up; }

DC_HD float softcap(float x, float cap) { return tanhf(x / cap) * cap; }

}  // namespace dc::math
