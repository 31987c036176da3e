#pragma once
// Decoders for one super-block of ggml's k-quants Q4_K and Q6_K (the types llama.cpp's Q4_K_M
// files use for most matrices), dispatched by dc::dequantize in gguf_dequant.hpp.
//
// A k-quant super-block holds 256 elements (so a row must be a multiple of 256 long; the GGUF
// reader checks ne[0]) split into sub-blocks that each carry a small integer scale, itself scaled
// by the super-block's fp16 factor. Layouts, byte offsets within a block, little-endian:
//
//   Q4_K (144 bytes): fp16 d @0, fp16 dmin @2, u8 scales[12] @4, u8 qs[128] @16.
//     8 sub-blocks of 32, each with a 6-bit scale sc[j] and a 6-bit min m[j] packed in scales:
//       j < 4:  sc = scales[j] & 63,                               m = scales[j + 4] & 63
//       j >= 4: sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
//               m  = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
//     qs[32 g + l] holds element l of sub-block 2g in its low nibble and of 2g + 1 in its high one
//     (g = 0..3, l = 0..31); x = (d * sc) * q - (dmin * m).
//
//   Q6_K (210 bytes): u8 ql[128] @0, u8 qh[64] @128, int8 scales[16] @192, fp16 d @208.
//     Two halves of 128 elements; in half h, element i (0..127) has a 6-bit value whose low four
//     bits are nibble i / 64 of ql[64 h + i % 64] and whose high two bits are bits 2 (i / 32),
//     2 (i / 32) + 1 of qh[32 h + i % 32]; x = (d * scales[e / 16]) * (q - 32), e = 128 h + i.
//
// Exactness: gguf.quants.dequantize computes the same products in fp32, and here every product
// is exact, so the results are bitwise equal whatever the compiler fuses: d * sc has at most
// 11 + 6 significant bits and times a 4-bit q at most 21 (Q4_K); d * scale at most 11 + 7 and
// times |q - 32| <= 32 at most 23 (Q6_K) -- within fp32's 24, and fp16's range times these
// factors neither overflows nor underflows fp32. So Q4_K's multiply-subtract rounds once, fused
// or not. Non-finite scales are decoded as they are (inf * 0 = NaN included), like the other
// types: the model loader rejects non-finite weights afterwards.
#include <cstdint>

#include "../core/config.hpp"
#include "detail/ggml_f16.hpp"

namespace dc {

namespace detail {
// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes.
inline void q4_k_scale_min(const std::uint8_t* scales, int j, int& sc, int& m) {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
    m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}
}  // namespace detail

inline void dequantize_block_q4_k(const std::uint8_t* block, float* DC_RESTRICT out) {
  const float d = detail::load_f16(block);
  const float dmin = detail::load_f16(block + 2);
  const std::uint8_t* scales = block + 4;
  const std::uint8_t* qs = block + 16;
  for (int g = 0; g < 4; ++g) {
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * g + half;
      int sc = 0, m = 0;
      detail::q4_k_scale_min(scales, j, sc, m);
      const float scale = d * static_cast<float>(sc);
      const float offset = dmin * static_cast<float>(m);
      const int shift = 4 * half;
      for (int l = 0; l < 32; ++l)
        out[32 * j + l] = scale * static_cast<float>((qs[32 * g + l] >> shift) & 15) - offset;
    }
  }
}

inline void dequantize_block_q6_k(const std::uint8_t* block, float* DC_RESTRICT out) {
  const std::uint8_t* ql = block;
  const std::uint8_t* qh = block + 128;
  const auto* scales = block + 192;
  const float d = detail::load_f16(block + 208);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 128; ++i) {
      const int e = 128 * h + i;
      const int low = (ql[64 * h + i % 64] >> (4 * (i / 64))) & 15;
      const int high = (qh[32 * h + i % 32] >> (2 * (i / 32))) & 3;
      const float scale = d * static_cast<float>(static_cast<std::int8_t>(scales[e / 16]));
      out[e] = scale * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

}  // namespace dc
