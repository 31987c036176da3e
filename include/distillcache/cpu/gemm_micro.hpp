#pragma once
// The CPU GEMM's micro-kernel: a kRows x kCols tile of dot products y[r][c] = x_r . w_c, both
// operands read along their contiguous inner dimension, w stored as float or bf16 (widened as it
// is loaded).
//
// One arithmetic, two spellings. Each dot product keeps kGemmLanes (16) independent partial sums
// (lane l sums the elements k = l mod 16, one FMA each, in k order), then adds the lanes as a
// fixed tree (reduce_gemm_lanes), then the elements past the last full group of 16 with scalar
// FMAs. The portable kernel writes that in plain loops; where the compiler targets AVX-512 the
// same sums are written with 512-bit intrinsics, because GCC otherwise splits the lane loops into
// 256-bit halves on AMD cores and reloads x for every w row. Both produce the same bits (a test
// compares them), so the result of a row depends on neither the tile shape, the rows it is
// multiplied with, nor the thread count, and batched decoding can promise each sequence the bits
// of its single-sequence run.
//
// nvcc's host pass is built without -march=native, so CUDA translation units take the portable
// kernel; it is the oracle, not a fallback of lesser accuracy.
#include <cstdint>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "multiply_add.hpp"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && !defined(__CUDACC__)
#define DC_GEMM_AVX512 1
#include <immintrin.h>
#else
#define DC_GEMM_AVX512 0
#endif

namespace dc::cpu_detail {

inline constexpr int kGemmLanes = 16;

// The lanes' sum in a fixed pairwise order: halves, then quarters, eighths, sixteenths (the
// order a 512 -> 256 -> 128 -> 64 -> 32-bit shuffle reduction takes).
inline float reduce_gemm_lanes(const float* lanes) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
  return s2a + s2b;
}

// The end of one dot product, shared by both kernels: the lanes' sum, then the elements past the
// last full group of 16 with scalar FMAs, then the store (or the add, fusing a residual).
template <class W>
inline void finish_dot(float& out, float lane_sum, const float* DC_RESTRICT x, const W* DC_RESTRICT w,
                       int in_vec, int in, bool accumulate) {
  float sum = lane_sum;
  for (int k = in_vec; k < in; ++k) sum = multiply_add(x[k], element_as_float(w, k), sum);
  out = accumulate ? out + sum : sum;
}

// The portable kernel (and the oracle of the vector one).
template <int kRows, int kCols, class W>
inline void gemm_micro_portable(float* DC_RESTRICT y, int ldy, const float* DC_RESTRICT x,
                                const W* DC_RESTRICT w, int in, bool accumulate) {
  float acc[kRows][kCols][kGemmLanes] = {};
  const int in_vec = in / kGemmLanes * kGemmLanes;
  for (int k = 0; k < in_vec; k += kGemmLanes) {
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kCols; ++c) {
        const float* xr = x + std::int64_t(r) * in + k;
        const W* wc = w + std::int64_t(c) * in + k;
        for (int l = 0; l < kGemmLanes; ++l)
          acc[r][c][l] = multiply_add(xr[l], element_as_float(wc, l), acc[r][c][l]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c)
      finish_dot(y[std::int64_t(r) * ldy + c], reduce_gemm_lanes(acc[r][c]), x + std::int64_t(r) * in,
                 w + std::int64_t(c) * in, in_vec, in, accumulate);
}

#if DC_GEMM_AVX512

// 16 elements of w as fp32: bf16 is the upper half of a binary32, so widen and shift.
template <class W>
inline __m512 load_w16(const W* p) {
  if constexpr (std::is_same_v<W, bf16>) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    // The zero-masked forms: GCC 12's unmasked ones read an uninitialised register and warn.
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, raw), 16));
  } else {
    return _mm512_loadu_ps(p);
  }
}

// reduce_gemm_lanes on a register: the same additions in the same order.
inline float reduce_gemm_lanes(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // {s4[0]+s4[2], s4[1]+s4[3], ...}
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int kRows, int kCols, class W>
inline void gemm_micro_avx512(float* DC_RESTRICT y, int ldy, const float* DC_RESTRICT x,
                              const W* DC_RESTRICT w, int in, bool accumulate) {
  __m512 acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  const int in_vec = in / kGemmLanes * kGemmLanes;
  for (int k = 0; k < in_vec; k += kGemmLanes) {
    __m512 xv[kRows];
    for (int r = 0; r < kRows; ++r) xv[r] = _mm512_loadu_ps(x + std::int64_t(r) * in + k);
    for (int c = 0; c < kCols; ++c) {
      const __m512 wv = load_w16(w + std::int64_t(c) * in + k);
      for (int r = 0; r < kRows; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c)
      finish_dot(y[std::int64_t(r) * ldy + c], reduce_gemm_lanes(acc[r][c]), x + std::int64_t(r) * in,
                 w + std::int64_t(c) * in, in_vec, in, accumulate);
}

#endif  // DC_GEMM_AVX512

// The kernel this build runs.
template <int kRows, int kCols, class W>
inline void gemm_micro(float* DC_RESTRICT y, int ldy, const float* DC_RESTRICT x, const W* DC_RESTRICT w,
                       int in, bool accumulate) {
#if DC_GEMM_AVX512
  gemm_micro_avx512<kRows, kCols>(y, ldy, x, w, in, accumulate);
#else
  gemm_micro_portable<kRows, kCols>(y, ldy, x, w, in, accumulate);
#endif
}

}  // namespace dc::cpu_detail
