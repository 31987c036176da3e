#pragma once
// Two loops over rows that compilers leave scalar, written with AVX-512 where the build has it:
// a table lookup by index (gather) and the packing of the rows whose score is not +inf
// (compress). GCC 12 turns `out[i] = table[index[i]]` into sixteen extracts and loads per vector
// rather than one vpgatherdd (its tuning avoids gathers), about 2.5 cycles a row against 0.8 with
// the instruction (one Xeon core, 187k rows); a packing loop `out[n] = i; n += keep` stays
// scalar. Both are how the learned policy's rules look rows up (pins, a layer's mass by
// position) and pick the rows still open (policy/mlp_scoring.hpp, policy/newest_query_reserve.hpp).
// The portable loops give the same results.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../core/config.hpp"

#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
#define DC_GATHER_PACK_AVX512 1
#endif

namespace dc::cpu_detail {

// out[i] = table[index[i]] for i < n; every index must lie inside table. T: a 4-byte type.
template <class T>
inline void gather(const T* DC_RESTRICT table, const std::int32_t* DC_RESTRICT index, int n, T* DC_RESTRICT out) {
  static_assert(sizeof(T) == 4, "gather moves 4-byte elements");
  int i = 0;
#ifdef DC_GATHER_PACK_AVX512
  // Plain stores: a load of what a masked store wrote waits until the store leaves the core (no
  // forwarding), and the caller reads these right away. The tail goes through the scalar loop.
  for (; i + 16 <= n; i += 16) {
    const __m512i at = _mm512_loadu_si512(index + i);
    _mm512_storeu_si512(out + i, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), __mmask16(0xFFFF), at, table, 4));
  }
#endif
  for (; i < n; ++i) out[i] = table[index[i]];
}

// flag[i] = table[position[i]] where position[i] lies in [0, entries), else 0.
inline void lookup_position_flags(const std::int32_t* DC_RESTRICT table, std::uint32_t entries,
                                  const std::int32_t* DC_RESTRICT position, int n, std::int32_t* DC_RESTRICT flag) {
  int i = 0;
#ifdef DC_GATHER_PACK_AVX512
  const __m512i limit = _mm512_set1_epi32(std::int32_t(entries));
  for (; i + 16 <= n; i += 16) {  // plain stores, as gather's
    const __m512i p = _mm512_loadu_si512(position + i);
    const __mmask16 inside = _mm512_cmplt_epu32_mask(p, limit);  // a negative position is huge unsigned
    _mm512_storeu_si512(flag + i, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), inside, p, table, 4));
  }
#endif
  for (; i < n; ++i) flag[i] = std::uint32_t(position[i]) < entries ? table[position[i]] : 0;
}

// The packing loops below store whole vectors: out[packed, packed + 16) takes the packed lanes
// and then zeros, which later stores overwrite or which lie past the count returned. That stays
// inside out[0, n) because packed <= i. Not masked stores: a load of what a masked store wrote
// waits until the store leaves the core, and callers read the packed values right away.
// out must not overlap the input.

// Writes first + i, in order, for every i < n with score[i] != +inf into out[0, n); returns how many.
inline int pack_rows_not_inf(const float* DC_RESTRICT score, int n, std::int32_t first, std::int32_t* DC_RESTRICT out) {
  int i = 0, packed = 0;
#ifdef DC_GATHER_PACK_AVX512
  const __m512 inf = _mm512_set1_ps(INFINITY);
  const __m512i step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 open = _mm512_cmp_ps_mask(_mm512_loadu_ps(score + i), inf, _CMP_NEQ_UQ);
    const __m512i rows = _mm512_add_epi32(_mm512_set1_epi32(first + i), step);
    const int count = __builtin_popcount(unsigned(open));
    _mm512_storeu_si512(out + packed, _mm512_maskz_compress_epi32(open, rows));  // (see the note above)
    packed += count;
  }
#endif
  for (; i < n; ++i) {
    out[packed] = first + i;
    packed += score[i] != INFINITY ? 1 : 0;
  }
  return packed;
}

// Writes values[i], in order, for every i < n with score[i] != +inf into out[0, n); returns how many.
inline int pack_values_not_inf(const std::uint32_t* DC_RESTRICT values, const float* DC_RESTRICT score, int n,
                               std::uint32_t* DC_RESTRICT out) {
  int i = 0, packed = 0;
#ifdef DC_GATHER_PACK_AVX512
  const __m512 inf = _mm512_set1_ps(INFINITY);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 open = _mm512_cmp_ps_mask(_mm512_loadu_ps(score + i), inf, _CMP_NEQ_UQ);
    const int count = __builtin_popcount(unsigned(open));
    _mm512_storeu_si512(out + packed, _mm512_maskz_compress_epi32(open, _mm512_loadu_si512(values + i)));
    packed += count;
  }
#endif
  for (; i < n; ++i) {
    out[packed] = values[i];
    packed += score[i] != INFINITY ? 1 : 0;
  }
  return packed;
}

// Writes keys[i], in order, for every i < n whose 8-bit digit at `shift` is `digit` into
// out[0, n); returns how many (cpu/radix_select.hpp's passes).
inline std::size_t pack_keys_with_digit(const std::uint32_t* DC_RESTRICT keys, std::size_t n, int shift,
                                        std::uint32_t digit, std::uint32_t* DC_RESTRICT out) {
  std::size_t i = 0, packed = 0;
#ifdef DC_GATHER_PACK_AVX512
  const __m512i want = _mm512_set1_epi32(std::int32_t(digit)), low8 = _mm512_set1_epi32(255);
  const __m128i count_shift = _mm_cvtsi32_si128(shift);
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_loadu_si512(keys + i);
    // (maskz: GCC 12's unmasked shift passes an undefined source and warns)
    const __m512i d = _mm512_and_si512(_mm512_maskz_srl_epi32(__mmask16(0xFFFF), v, count_shift), low8);
    const __mmask16 in = _mm512_cmpeq_epi32_mask(d, want);
    _mm512_storeu_si512(out + packed, _mm512_maskz_compress_epi32(in, v));
    packed += std::size_t(__builtin_popcount(unsigned(in)));
  }
#endif
  for (; i < n; ++i) {
    out[packed] = keys[i];
    packed += ((keys[i] >> shift) & 255u) == digit ? 1 : 0;
  }
  return packed;
}

}  // namespace dc::cpu_detail
