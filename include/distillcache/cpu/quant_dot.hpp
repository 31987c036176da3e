#pragma once
// Integer sums of quantized weight blocks against 8-bit activation blocks (math/quant_blocks.hpp):
// for every block b of a row, sums[b] = sum(q * qa) (Q8_0) or sum(nibble * qa) (Q4_0, Q4_1).
//
// Three kernels give the same integers (sums of at most 32 products of |q| <= 128 and
// |qa| <= 127 never overflow), so the float results built from them are the same bits on every
// CPU: the portable loop; AVX2 (vpmaddubsw then vpmaddwd: unsigned x signed byte pairs into 16
// bits, which cannot saturate here, 2 x 128 x 127 < 32767); and AVX-512 VNNI on 256-bit registers
// (vpdpbusd: four byte products into each 32-bit lane in one instruction). Q8_0's signed weights
// go through the unsigned operand as |q| with their sign moved onto the activations.
// The kernel is chosen once, at run time, from what the CPU reports (best_quant_kernel()); the
// SIMD ones are compiled with target attributes, so a portable build still carries them. Under
// nvcc (whose host pass sees these headers too) and on other CPUs only the portable loop exists.
#include <cstdint>
#include <string_view>

#include "../core/error.hpp"
#include "../math/quant_blocks.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define DC_QUANT_X86 1
#include <immintrin.h>
#else
#define DC_QUANT_X86 0
#endif

namespace dc {

enum class QuantKernel : std::uint8_t { portable, avx2, avx512_vnni };

constexpr std::string_view quant_kernel_name(QuantKernel k) {
  return k == QuantKernel::portable ? "portable" : k == QuantKernel::avx2 ? "avx2" : "avx512_vnni";
}

// Whether this build and this CPU can run kernel k.
inline bool quant_kernel_available(QuantKernel k) {
  if (k == QuantKernel::portable) return true;
#if DC_QUANT_X86
  if (k == QuantKernel::avx2) return __builtin_cpu_supports("avx2");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// The fastest kernel this CPU runs, decided once.
inline QuantKernel best_quant_kernel() {
  static const QuantKernel best = quant_kernel_available(QuantKernel::avx512_vnni) ? QuantKernel::avx512_vnni
                                  : quant_kernel_available(QuantKernel::avx2)      ? QuantKernel::avx2
                                                                                   : QuantKernel::portable;
  return best;
}

namespace cpu_detail {

// Offset of the packed nibbles in a Q4 block (after d, and m for Q4_1).
constexpr int nibble_offset(QuantFormat f) { return f == QuantFormat::q4_0 ? 2 : 4; }

inline void block_sums_portable(QuantFormat f, const std::uint8_t* w, const ActivationBlock* a, int a_stride,
                                int rows, int blocks, std::int32_t* sums) {
  const std::size_t stride = quant_block_bytes(f);
  for (int b = 0; b < blocks; ++b, w += stride) {
    for (int r = 0; r < rows; ++r) {
      const std::int8_t* qa = a[std::int64_t(r) * a_stride + b].q;
      std::int32_t s = 0;
      if (f == QuantFormat::q8_0) {
        // Read as int8_t through the pointer: GCC 12 at -march=native (AVX-512 VNNI) miscompiles
        // the sum of static_cast<int8_t>(byte) * int8_t products (it emits the unsigned x signed
        // vpdpbusd, as if the weight were unsigned); int8_t * int8_t is vectorised correctly.
        const auto* q = reinterpret_cast<const std::int8_t*>(w + 2);
        for (int i = 0; i < kQuantBlock; ++i) s += int(q[i]) * int(qa[i]);
      } else {
        const std::uint8_t* qs = w + nibble_offset(f);
        for (int j = 0; j < kQuantBlock / 2; ++j) s += (qs[j] & 0x0f) * qa[j] + (qs[j] >> 4) * qa[j + 16];
      }
      sums[std::int64_t(r) * blocks + b] = s;
    }
  }
}

#if DC_QUANT_X86

// The 32 nibbles of a Q4 block as bytes, in element order (low nibbles are elements 0..15).
__attribute__((target("avx2"))) inline __m256i unpack_nibbles(const std::uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

__attribute__((target("avx2"))) inline std::int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The unsigned byte operand of a weight block (its nibbles for Q4, |q| for Q8_0) and, for Q8_0,
// the signed bytes whose signs move onto the activations.
__attribute__((target("avx2"))) inline void weight_operand(QuantFormat f, const std::uint8_t* w, __m256i& u,
                                                           __m256i& q) {
  if (f == QuantFormat::q8_0) {
    q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    u = _mm256_sign_epi8(q, q);
  } else {
    q = _mm256_setzero_si256();
    u = unpack_nibbles(w + nibble_offset(f));
  }
}

// The signed byte operand: the activations, with Q8_0's weight signs applied.
__attribute__((target("avx2"))) inline __m256i activation_operand(QuantFormat f, __m256i q,
                                                                  const ActivationBlock& a) {
  const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
  return f == QuantFormat::q8_0 ? _mm256_sign_epi8(qa, q) : qa;
}

// Four blocks' 32-bit partial sums (8 lanes each) reduced to their four totals at once: two
// rounds of pairwise adds, then the two 128-bit halves.
__attribute__((target("avx2"))) inline __m128i horizontal_sum4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The SIMD kernels' loop, one definition for both instruction sets: PRODUCT(u, s) gives a block's
// eight 32-bit partial sums. Each weight block is unpacked once for all the activation rows. A
// macro rather than a template over the product: the product must be compiled inline with its
// kernel's target features (a callee with more features than its caller is never inlined, and a
// call per block would cost more than the block).
#define DC_QUANT_BLOCK_SUMS_KERNEL(NAME, TARGET, PRODUCT)                                              \
  __attribute__((target(TARGET))) inline void NAME(QuantFormat f, const std::uint8_t* w,              \
                                                   const ActivationBlock* a, int a_stride, int rows, \
                                                   int blocks, std::int32_t* sums) {                 \
    const std::size_t stride = quant_block_bytes(f);                                                 \
    int b = 0;                                                                                       \
    for (; b + 4 <= blocks; b += 4) {                                                                \
      __m256i u[4], q[4];                                                                            \
      for (int j = 0; j < 4; ++j) weight_operand(f, w + std::size_t(b + j) * stride, u[j], q[j]);    \
      for (int r = 0; r < rows; ++r) {                                                               \
        const ActivationBlock* ar = a + std::int64_t(r) * a_stride + b;                              \
        __m256i p[4];                                                                                \
        for (int j = 0; j < 4; ++j) p[j] = PRODUCT(u[j], activation_operand(f, q[j], ar[j]));        \
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + std::int64_t(r) * blocks + b),            \
                         horizontal_sum4(p[0], p[1], p[2], p[3]));                                   \
      }                                                                                              \
    }                                                                                                \
    for (; b < blocks; ++b) {                                                                        \
      __m256i u, q;                                                                                  \
      weight_operand(f, w + std::size_t(b) * stride, u, q);                                          \
      for (int r = 0; r < rows; ++r)                                                                 \
        sums[std::int64_t(r) * blocks + b] =                                                         \
            horizontal_sum(PRODUCT(u, activation_operand(f, q, a[std::int64_t(r) * a_stride + b]))); \
    }                                                                                                \
  }

#define DC_QUANT_MADDUBS(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define DC_QUANT_DPBUSD(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
DC_QUANT_BLOCK_SUMS_KERNEL(block_sums_avx2, "avx2", DC_QUANT_MADDUBS)
DC_QUANT_BLOCK_SUMS_KERNEL(block_sums_vnni, "avx2,avx512vl,avx512vnni", DC_QUANT_DPBUSD)
#undef DC_QUANT_MADDUBS
#undef DC_QUANT_DPBUSD
#undef DC_QUANT_BLOCK_SUMS_KERNEL

#endif  // DC_QUANT_X86

}  // namespace cpu_detail

// sums[r * blocks + b] for the `blocks` blocks of weight row w (format f) against `rows`
// activation rows, row r's blocks at a + r * a_stride. k must be available
// (quant_kernel_available); callers pass best_quant_kernel().
inline void quant_block_sums(QuantKernel k, QuantFormat f, const std::uint8_t* w, const ActivationBlock* a,
                             int a_stride, int rows, int blocks, std::int32_t* sums) {
#if DC_QUANT_X86
  if (k == QuantKernel::avx512_vnni) return cpu_detail::block_sums_vnni(f, w, a, a_stride, rows, blocks, sums);
  if (k == QuantKernel::avx2) return cpu_detail::block_sums_avx2(f, w, a, a_stride, rows, blocks, sums);
#endif
  DC_CHECK(k == QuantKernel::portable, "quantized kernel ", quant_kernel_name(k),
           " is not available in this build");
  cpu_detail::block_sums_portable(f, w, a, a_stride, rows, blocks, sums);
}

}  // namespace dc
