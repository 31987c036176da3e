#pragma once
// CPU matrix multiply y[n, out] (+)= x[n, in] * w[out, in]^T, cache-blocked; x and y fp32, w
// fp32 or bf16 (widened to fp32 as it is loaded: decode is bound by the bytes of w it streams,
// and bf16 halves them; the arithmetic is the same fp32 FMAs).
//
// Both operands are read along their contiguous inner dimension. The micro-kernel computes a
// kRows x kCols tile of dot products with kLanes-wide partial sums, which the compiler turns into
// vector FMAs without -ffast-math (each lane is an independent sum). Every output element is
// produced by one thread in a fixed order with explicit FMAs (multiply_add), so results depend
// neither on the thread count nor on the tile shape: a row of y is the same bits whatever other
// rows are multiplied with it (batched decoding relies on that).
// Output rows are split into tiles that keep a block of w in L2 while all x rows stream past.
#include <algorithm>
#include <concepts>
#include <cstdint>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "dot.hpp"

namespace dc {
namespace cpu_detail {

inline constexpr int kTileOut = 64;  // w rows per parallel tile: 64 x 4 KiB fits in L2

template <int kRows, int kCols, class W>
inline void gemm_micro(float* DC_RESTRICT y, int ldy, const float* DC_RESTRICT x,
                       const W* DC_RESTRICT w, int in, bool accumulate) {
  float acc[kRows][kCols][kLanes] = {};
  const int in_vec = in / kLanes * kLanes;
  for (int k = 0; k < in_vec; k += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kCols; ++c) {
        const float* xr = x + std::int64_t(r) * in + k;
        const W* wc = w + std::int64_t(c) * in + k;
        for (int l = 0; l < kLanes; ++l) acc[r][c][l] = multiply_add(xr[l], element_as_float(wc, l), acc[r][c][l]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      float sum = 0.0f;
      for (int l = 0; l < kLanes; ++l) sum += acc[r][c][l];
      for (int k = in_vec; k < in; ++k)
        sum = multiply_add(x[std::int64_t(r) * in + k], element_as_float(w, std::int64_t(c) * in + k), sum);
      float& out = y[std::int64_t(r) * ldy + c];
      out = accumulate ? out + sum : sum;
    }
  }
}

// Dispatches a (rows x cols) edge tile to the matching fixed-size micro-kernel.
template <int kMaxRows, int kMaxCols, class W>
inline void gemm_tile(float* y, int ldy, const float* x, const W* w, int in, int rows, int cols,
                      bool accumulate) {
  if constexpr (kMaxRows > 1) {
    if (rows < kMaxRows) return gemm_tile<kMaxRows - 1, kMaxCols>(y, ldy, x, w, in, rows, cols, accumulate);
  }
  if constexpr (kMaxCols > 1) {
    if (cols < kMaxCols) return gemm_tile<kMaxRows, kMaxCols - 1>(y, ldy, x, w, in, rows, cols, accumulate);
  }
  gemm_micro<kMaxRows, kMaxCols>(y, ldy, x, w, in, accumulate);
}

}  // namespace cpu_detail

namespace cpu_detail {

// Tiles the output into (kRows x kCols) blocks, each computed by one micro-kernel call.
template <int kRows, int kCols, class W>
inline void matmul_tiled(float* y, const float* x, const W* w, int n, int in, int out,
                         bool accumulate) {
  const int tiles = (out + kTileOut - 1) / kTileOut;
  DC_OMP(parallel for schedule(static))
  for (int tile = 0; tile < tiles; ++tile) {
    const int o_begin = tile * kTileOut;
    const int o_end = std::min(out, o_begin + kTileOut);
    for (int i = 0; i < n; i += kRows) {
      const int rows = std::min(kRows, n - i);
      for (int o = o_begin; o < o_end; o += kCols) {
        const int cols = std::min(kCols, o_end - o);
        gemm_tile<kRows, kCols>(y + std::int64_t(i) * out + o, out, x + std::int64_t(i) * in,
                                w + std::int64_t(o) * in, in, rows, cols, accumulate);
      }
    }
  }
}

}  // namespace cpu_detail

// y[n, out] = x[n, in] * w[out, in]^T, or y += ... when accumulate (fuses the residual add).
// Decode (n < 4) is bandwidth-bound: 4 w rows per tile give the core enough independent FMA
// chains to keep up with memory (measured 3x over 2 rows on this machine's GEMV). Prefill reuses
// each w row for 4 x rows.
template <class W>
  requires std::same_as<W, float> || std::same_as<W, bf16>
void matmul(const Context<cpu>&, float* y, const float* x, const W* w, int n, int in, int out,
            bool accumulate = false) {
  if (n < 4) return cpu_detail::matmul_tiled<3, 4>(y, x, w, n, in, out, accumulate);
  cpu_detail::matmul_tiled<4, 2>(y, x, w, n, in, out, accumulate);
}

}  // namespace dc
