#pragma once
// Storage dtypes and their host conversions.
//
// Weights may be stored in bf16 or f16; all arithmetic is fp32. bf16/f16 here are plain 16-bit
// containers with the same layout as CUDA's __nv_bfloat16/__half, so device code reinterprets
// the same bytes. Conversions round to nearest even and keep NaN/Inf, matching PyTorch.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"

namespace dc {

struct bf16 {
  std::uint16_t bits = 0;
};
struct f16 {
  std::uint16_t bits = 0;
};

enum class DType : std::uint8_t { f32, f16, bf16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};

// ---- bf16: the upper half of an IEEE binary32 ----
inline float to_float(bf16 h) { return std::bit_cast<float>(std::uint32_t(h.bits) << 16); }

// The bf16 bits of the binary32 with bits u: NaN kept (quiet), else rounded to nearest, ties to
// even. One rule for both backends (the CUDA kernels that store bf16 call it on the device), so a
// bf16 cache holds the same bits on the CPU and the GPU.
DC_HD std::uint16_t bf16_bits_of(std::uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

inline bf16 to_bf16(float f) { return bf16{bf16_bits_of(std::bit_cast<std::uint32_t>(f))}; }

// ---- f16: IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits) ----
inline float to_float(f16 h) {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);  // Inf / NaN
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal: value = mant * 2^-24; exact in binary32.
    return std::bit_cast<float>(sign) + (sign ? -1.0f : 1.0f) * float(mant) * 0x1p-24f;
  }
  return std::bit_cast<float>(out);
}

inline f16 to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return f16{std::uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) return f16{std::uint16_t(sign | 0x7c00u)};  // rounds past 65504 -> Inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in f16: round abs * 2^24 to an integer, ties to even.
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;  // exact: power-of-two scaling
    // Manual round-half-even without depending on the FP rounding mode.
    float fl = float(std::uint32_t(scaled));
    float frac = scaled - fl;
    std::uint32_t m = std::uint32_t(fl);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;
    return f16{std::uint16_t(sign | m)};
  }
  // Normal: keep 10 mantissa bits, round to nearest even on the 13 dropped bits.
  std::uint32_t v = abs - 0x38000000u;  // rebias exponent 127 -> 15 (shifted by 23)
  v += 0xfffu + ((v >> 13) & 1u);
  return f16{std::uint16_t(sign | (v >> 13))};
}

template <class T>
inline float to_float_any(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return to_float(v);
}

// p[i] as float. bf16 is read through its raw 16 bits: GCC vectorises the widening of a
// uint16_t array (vpmovzxwd, vpslld) but not the bit_cast of each bf16 struct, which left the
// attention over a bf16 KV cache scalar. The same value as to_float_any(p[i]).
template <class T>
inline float element_as_float(const T* p, std::ptrdiff_t i) {
  if constexpr (std::is_same_v<T, bf16>) {
    static_assert(sizeof(bf16) == sizeof(std::uint16_t));
    return std::bit_cast<float>(std::uint32_t(reinterpret_cast<const std::uint16_t*>(p)[i]) << 16);
  } else {
    return to_float_any(p[i]);
  }
}

template <class T>
inline T from_float(float f) {
  if constexpr (std::is_same_v<T, float>) return f;
  else if constexpr (std::is_same_v<T, bf16>) return to_bf16(f);
  else return to_f16(f);
}

}  // namespace dc
