#pragma once
// ggml tensor types and their dequantization to fp32 (the block formats GGUF files store).
//
// Every ggml type is a sequence of blocks of `block_size` elements taking `type_size` bytes; the
// reader needs the sizes of all of them to validate a file, even of the types we cannot decode.
// Decoded here (layouts as ggml defines them, 32 elements per quantized block, little-endian):
//   F32, F16, BF16  one element per block
//   Q8_0  fp16 d, int8 q[32]                    x[i] = q[i] * d
//   Q4_0  fp16 d, u8 qs[16]                      x[i] = (nibble_i - 8) * d
//   Q4_1  fp16 d, fp16 m, u8 qs[16]              x[i] = nibble_i * d + m
//   Q5_0  fp16 d, u32 qh, u8 qs[16]              x[i] = ((nibble_i | (bit i of qh) << 4) - 16) * d
// where byte j of qs holds element j in its low nibble and element j + 16 in its high nibble;
// and the k-quants Q4_K and Q6_K (256-element super-blocks), in gguf_kquants.hpp.
// The arithmetic is fp32 in the same order as gguf.quants.dequantize, so results are bitwise
// equal to the reference (Q4_1 may differ by one rounding where the compiler fuses the
// multiply-add). The loops are serial on purpose: decoding is memory-bound (SmolLM2's 135M
// weights take ~0.1 s on one core) and threads only added page-fault contention.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../math/quant_blocks.hpp"
#include "detail/ggml_f16.hpp"
#include "gguf_kquants.hpp"

namespace dc {

// Type ids as stored in GGUF tensor infos (ggml's enum ggml_type).
enum class GgmlType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

struct GgmlTypeTraits {
  std::uint32_t id;
  std::string_view name;
  std::uint32_t block_size;  // elements per block
  std::uint32_t type_size;   // bytes per block
  bool dequantizable;        // decoded by dequantize() below
};

namespace detail {
inline constexpr std::uint32_t kQK = 32;    // block size of the legacy quant types
inline constexpr std::uint32_t kQKK = 256;  // block size of the k-quants
inline constexpr std::array<GgmlTypeTraits, 32> kGgmlTypes{{
    {0, "F32", 1, 4, true},
    {1, "F16", 1, 2, true},
    {2, "Q4_0", kQK, 2 + 16, true},
    {3, "Q4_1", kQK, 2 + 2 + 16, true},
    {6, "Q5_0", kQK, 2 + 4 + 16, true},
    {7, "Q5_1", kQK, 2 + 2 + 4 + 16, false},
    {8, "Q8_0", kQK, 2 + 32, true},
    {9, "Q8_1", kQK, 4 + 4 + 32, false},
    {10, "Q2_K", kQKK, 2 + 2 + kQKK / 16 + kQKK / 4, false},
    {11, "Q3_K", kQKK, 2 + kQKK / 4 + kQKK / 8 + 12, false},
    {12, "Q4_K", kQKK, 2 + 2 + kQKK / 2 + 12, true},
    {13, "Q5_K", kQKK, 2 + 2 + kQKK / 2 + kQKK / 8 + 12, false},
    {14, "Q6_K", kQKK, 2 + kQKK / 2 + kQKK / 4 + kQKK / 16, true},
    {15, "Q8_K", kQKK, 4 + kQKK + kQKK / 8, false},
    {16, "IQ2_XXS", kQKK, 2 + kQKK / 4, false},
    {17, "IQ2_XS", kQKK, 2 + kQKK / 4 + kQKK / 32, false},
    {18, "IQ3_XXS", kQKK, 2 + kQKK / 4 + kQKK / 8, false},
    {19, "IQ1_S", kQKK, 2 + kQKK / 8 + kQKK / 16, false},
    {20, "IQ4_NL", kQK, 2 + 16, false},
    {21, "IQ3_S", kQKK, 2 + kQKK / 4 + kQKK / 8 + kQKK / 32 + 4, false},
    {22, "IQ2_S", kQKK, 2 + kQKK / 4 + kQKK / 16, false},
    {23, "IQ4_XS", kQKK, 2 + 2 + kQKK / 2 + kQKK / 64, false},
    {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},
    {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},
    {29, "IQ1_M", kQKK, kQKK / 8 + kQKK / 16 + kQKK / 32, false},
    {30, "BF16", 1, 2, true},
    {34, "TQ1_0", kQKK, 2 + 4 * 13, false},
    {35, "TQ2_0", kQKK, 2 + 64, false},
    {39, "MXFP4", kQK, 1 + 16, false},
}};
}  // namespace detail

// Traits of a ggml type id, or nullptr for an id this library does not know.
inline const GgmlTypeTraits* ggml_type_traits(std::uint32_t id) {
  for (const auto& t : detail::kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// "Q4_1", or "unknown type 999".
inline std::string ggml_type_name(std::uint32_t id) {
  const GgmlTypeTraits* t = ggml_type_traits(id);
  return t ? std::string(t->name) : "unknown type " + std::to_string(id);
}

inline bool ggml_can_dequantize(std::uint32_t id) {
  const GgmlTypeTraits* t = ggml_type_traits(id);
  return t && t->dequantizable;
}

inline constexpr std::string_view kGgmlDequantizableTypes =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K";

// ---- one block each ---------------------------------------------------------------------------

// Q8_0, Q4_0 and Q4_1 are also the formats the CPU multiplies as they are (math/quant_blocks.hpp
// holds their formulas for both uses).
inline void dequantize_block_q8_0(const std::uint8_t* block, float* DC_RESTRICT out) {
  math::dequantize_weight_block(QuantFormat::q8_0, block, out);
}

inline void dequantize_block_q4_0(const std::uint8_t* block, float* DC_RESTRICT out) {
  math::dequantize_weight_block(QuantFormat::q4_0, block, out);
}

inline void dequantize_block_q4_1(const std::uint8_t* block, float* DC_RESTRICT out) {
  math::dequantize_weight_block(QuantFormat::q4_1, block, out);
}

inline void dequantize_block_q5_0(const std::uint8_t* block, float* DC_RESTRICT out) {
  const float d = detail::load_f16(block);
  std::uint32_t qh;  // bit i: the fifth (high) bit of element i
  std::memcpy(&qh, block + 2, 4);
  const std::uint8_t* qs = block + 6;
  for (int j = 0; j < 16; ++j) {
    const int low = static_cast<int>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
    const int high = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    out[j] = static_cast<float>(low - 16) * d;
    out[j + 16] = static_cast<float>(high - 16) * d;
  }
}

// Bytes that n elements of type `id` occupy (n must be a whole number of blocks).
inline std::uint64_t ggml_row_bytes(std::uint32_t id, std::uint64_t n) {
  const GgmlTypeTraits* t = ggml_type_traits(id);
  DC_CHECK(t != nullptr, "ggml: ", ggml_type_name(id));
  DC_CHECK(n % t->block_size == 0, "ggml: ", n, " elements are not a whole number of ", t->name,
           " blocks of ", t->block_size);
  return n / t->block_size * t->type_size;
}

// Decodes n elements of type `id` from src (ggml_row_bytes(id, n) bytes, any alignment) into dst.
inline void dequantize(std::uint32_t id, const void* src, float* dst, std::int64_t n) {
  DC_CHECK(n >= 0, "ggml dequantize: negative element count ", n);
  DC_CHECK(ggml_can_dequantize(id), "ggml dequantize: cannot dequantize ", ggml_type_name(id),
           " (supported: ", kGgmlDequantizableTypes, ")");
  const GgmlTypeTraits& t = *ggml_type_traits(id);
  DC_CHECK(n % t.block_size == 0, "ggml dequantize: ", n, " elements are not a whole number of ",
           t.name, " blocks of ", t.block_size);
  const auto* bytes = static_cast<const std::uint8_t*>(src);
  const std::int64_t blocks = n / t.block_size;
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::f32:
      if (n) std::memcpy(dst, src, std::size_t(n) * sizeof(float));
      return;
    case GgmlType::f16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = detail::load_f16(bytes + 2 * i);
      return;
    case GgmlType::bf16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, bytes + 2 * i, 2);
        dst[i] = to_float(bf16{b});
      }
      return;
    case GgmlType::q8_0:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q8_0(bytes + b * 34, dst + b * 32);
      return;
    case GgmlType::q4_0:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q4_0(bytes + b * 18, dst + b * 32);
      return;
    case GgmlType::q4_1:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q4_1(bytes + b * 20, dst + b * 32);
      return;
    case GgmlType::q5_0:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q5_0(bytes + b * 22, dst + b * 32);
      return;
    case GgmlType::q4_k:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q4_k(bytes + b * 144, dst + b * 256);
      return;
    case GgmlType::q6_k:
      for (std::int64_t b = 0; b < blocks; ++b) dequantize_block_q6_k(bytes + b * 210, dst + b * 256);
      return;
    default:
      DC_FAIL("ggml dequantize: ", t.name, " is not implemented");  // unreachable: checked above
  }
}

}  // namespace dc
