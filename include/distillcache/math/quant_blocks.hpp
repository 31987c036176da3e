#pragma once
// Block-quantized weights (ggml's Q8_0, Q4_0, Q4_1, byte for byte as GGUF stores them) and the
// 8-bit activation blocks they are multiplied with: the formulas, in one place for every kernel.
//
// A weight row of `in` elements is in / 32 blocks; a block is a scale and 32 small integers:
//   Q8_0  fp16 d, int8 q[32]           w[i] = d * q[i]            (34 bytes)
//   Q4_0  fp16 d, u8 qs[16]            w[i] = d * (nibble_i - 8)  (18 bytes)
//   Q4_1  fp16 d, fp16 m, u8 qs[16]    w[i] = d * nibble_i + m    (20 bytes)
// (byte j of qs holds element j in its low nibble, element j + 16 in its high one;
// io/gguf_dequant.hpp decodes them). Activations are quantized per block of 32 the same way as
// Q8_0 but with fp32 fields: a[i] = da * qa[i]. A block's contribution to a dot product is then an
// exact integer sum times scales:
//   Q8_0  dw * da * sum(q * qa)
//   Q4_0  dw * da * (sum(nibble * qa) - 8 * sum(qa))
//   Q4_1  dw * da * sum(nibble * qa) + m * da * sum(qa)
// Every kernel (portable, AVX2, AVX-512 VNNI in cpu/quant_dot.hpp) computes the integer sums
// exactly and combines them here, in the same order, so all of them give the same bits.
// The quantizers follow ggml's reference rules (quantize_row_*_ref), so quantizing a row that
// ggml's reference quantizer produced and this library decoded gives its blocks back.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include "../core/dtype.hpp"
#include "../core/error.hpp"

namespace dc {

enum class QuantFormat : std::uint8_t { q8_0, q4_0, q4_1 };

inline constexpr int kQuantBlock = 32;

constexpr std::size_t quant_block_bytes(QuantFormat f) {
  return f == QuantFormat::q8_0 ? 34 : f == QuantFormat::q4_0 ? 18 : 20;
}

constexpr std::string_view quant_format_name(QuantFormat f) {
  return f == QuantFormat::q8_0 ? "q8_0" : f == QuantFormat::q4_0 ? "q4_0" : "q4_1";
}

// The ggml type id of a format (GgmlType in io/gguf_dequant.hpp).
constexpr std::uint32_t quant_format_ggml_id(QuantFormat f) {
  return f == QuantFormat::q8_0 ? 8u : f == QuantFormat::q4_0 ? 2u : 3u;
}

// "q8_0" -> QuantFormat::q8_0; throws naming the accepted names otherwise.
inline QuantFormat parse_quant_format(std::string_view name) {
  for (QuantFormat f : {QuantFormat::q8_0, QuantFormat::q4_0, QuantFormat::q4_1})
    if (name == quant_format_name(f)) return f;
  DC_FAIL("unknown quantized format '", name, "' (expected q8_0, q4_0 or q4_1)");
}

// One block of 32 activations: x[i] ~ d * q[i], sum = the sum of q (Q4_0/Q4_1 need it).
struct ActivationBlock {
  float d = 0.0f;
  std::int32_t sum = 0;
  std::int8_t q[kQuantBlock] = {};
};

namespace math {

inline float load_half(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return to_float(f16{bits});
}

// load_half through the CPU's converter where it has one (F16C): the matmul reads one or two
// scales per 32 weights, and the bit manipulation of to_float(f16) cost more than the integer
// work. Equal to load_half for every value but signalling NaNs (quieted), which no loaded weight
// holds (the loaders reject non-finite weights).
inline float load_scale(const std::uint8_t* p) {
#if defined(__F16C__) && !defined(__CUDACC__)
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
#else
  return load_half(p);
#endif
}

inline void store_half(std::uint8_t* p, float v) {
  const std::uint16_t bits = to_f16(v).bits;
  std::memcpy(p, &bits, 2);
}

// Symmetric 8-bit quantization of 32 activations: d = max|x| / 127, q = round(x / d). A NaN or
// infinite activation makes d NaN, so the products it enters are NaN as in fp32 (and the
// transformer's check of its logits reports it) instead of finite garbage.
inline ActivationBlock quantize_activation_block(const float* x) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < kQuantBlock; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  ActivationBlock b;
  if (!finite) {
    b.d = std::numeric_limits<float>::quiet_NaN();
    return b;
  }
  b.d = amax / 127.0f;
  const float id = b.d != 0.0f ? 1.0f / b.d : 0.0f;
  for (int i = 0; i < kQuantBlock; ++i) {
    b.q[i] = static_cast<std::int8_t>(std::lround(x[i] * id));
    b.sum += b.q[i];
  }
  return b;
}

// One weight block from 32 fp32 values, by ggml's reference rules.
inline void quantize_weight_block(QuantFormat f, const float* x, std::uint8_t* out) {
  switch (f) {
    case QuantFormat::q8_0: {
      float amax = 0.0f;
      for (int i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      store_half(out, d);
      for (int i = 0; i < kQuantBlock; ++i)
        out[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::lround(x[i] * id)));
      return;
    }
    case QuantFormat::q4_0: {
      float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
      for (int i = 0; i < kQuantBlock; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
      const float d = max / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      store_half(out, d);
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
        const int hi = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
        out[2 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
      return;
    }
    case QuantFormat::q4_1: {
      float min = x[0], max = x[0];
      for (int i = 1; i < kQuantBlock; ++i) min = std::min(min, x[i]), max = std::max(max, x[i]);
      const float d = (max - min) / 15.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      store_half(out, d);
      store_half(out + 2, min);
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        const int lo = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
        const int hi = std::min(15, static_cast<int>((x[j + 16] - min) * id + 0.5f));
        out[4 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
      return;
    }
  }
}

// The 32 values a weight block stands for (ggml's dequantize_row_*: fp32, in this order).
inline void dequantize_weight_block(QuantFormat f, const std::uint8_t* block, float* out) {
  const float d = load_half(block);
  switch (f) {
    case QuantFormat::q8_0:
      for (int i = 0; i < kQuantBlock; ++i) out[i] = static_cast<float>(static_cast<std::int8_t>(block[2 + i])) * d;
      return;
    case QuantFormat::q4_0:
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        out[j] = static_cast<float>((block[2 + j] & 0x0f) - 8) * d;
        out[j + 16] = static_cast<float>((block[2 + j] >> 4) - 8) * d;
      }
      return;
    case QuantFormat::q4_1: {
      const float m = load_half(block + 2);
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        out[j] = static_cast<float>(block[4 + j] & 0x0f) * d + m;
        out[j + 16] = static_cast<float>(block[4 + j] >> 4) * d + m;
      }
      return;
    }
  }
}

// A block's share of a dot product from its exact integer sum: isum = sum(q * qa) for Q8_0,
// sum(nibble * qa) for Q4_0 and Q4_1 (see the header comment).
inline float combine_block(QuantFormat f, const std::uint8_t* block, const ActivationBlock& a,
                           std::int32_t isum) {
  const float dw = load_scale(block);
  switch (f) {
    case QuantFormat::q8_0: return dw * a.d * static_cast<float>(isum);
    case QuantFormat::q4_0: return dw * a.d * static_cast<float>(isum - 8 * a.sum);
    case QuantFormat::q4_1:
      return dw * a.d * static_cast<float>(isum) + load_scale(block + 2) * a.d * static_cast<float>(a.sum);
  }
  return 0.0f;
}

}  // namespace math
}  // namespace dc
