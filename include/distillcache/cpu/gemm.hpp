#pragma once
// CPU matrix multiply y[n, out] (+)= x[n, in] * w[out, in]^T, cache-blocked; x and y fp32, w
// fp32 or bf16 (widened to fp32 as it is loaded: decode is bound by the bytes of w it streams,
// and bf16 halves them; the arithmetic is the same fp32 FMAs).
//
// Both operands are read along their contiguous inner dimension. The micro-kernel
// (gemm_micro.hpp) computes a kRows x kCols tile of dot products, each in a fixed order of FMAs,
// so results depend neither on the thread count nor on the tile shape: a row of y is the same
// bits whatever other rows are multiplied with it (batched decoding relies on that).
// Output columns are split into tiles that keep a block of w in L2 while all x rows stream past.
#include <algorithm>
#include <concepts>
#include <cstdint>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "gemm_micro.hpp"
#include "parallel.hpp"

namespace dc {
namespace cpu_detail {

inline constexpr int kTileOut = 64;  // w rows per parallel tile at most: 64 x 2-6 KiB stay in L2

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

// Tiles the output into (kRows x kCols) blocks, each computed by one micro-kernel call. The
// output columns are cut into a multiple of the thread count of equal tiles (kCols-aligned, at
// most kTileOut wide), so that a 192-column K/V projection does not leave one of two threads
// idle for a third of it as 64-wide tiles did. Which thread computes an element changes nothing
// in its bits.
template <int kRows, int kCols, class W>
inline void matmul_tiled(float* y, const float* x, const W* w, int n, int in, int out,
                         bool accumulate) {
  if (n <= 0 || out <= 0) return;  // nothing to compute (and no tile count to divide by)
  const int threads = max_threads();
  const int col_groups = (out + kCols - 1) / kCols;
  int tiles = (out + kTileOut - 1) / kTileOut;
  tiles = std::min(col_groups, (tiles + threads - 1) / threads * threads);
  const int groups_per_tile = (col_groups + tiles - 1) / tiles;
  DC_OMP(parallel for schedule(static))
  for (int tile = 0; tile < tiles; ++tile) {
    const int o_begin = std::min(out, tile * groups_per_tile * kCols);
    const int o_end = std::min(out, o_begin + groups_per_tile * kCols);
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
// One tile shape for every n: 4 x rows by 6 w rows (24 accumulators, 4 x and 1 w register: 29
// of AVX-512's 32). Measured on this machine's 2 Zen 5 cores (bench_cpu gemm_*), bf16 weights:
// 340-390 GFLOP/s for n >= 3 (70-80 % of the 486 GFLOP/s fp32 FMA peak, bench_cpu fma_peak),
// against 170-250 for 4x4, 2x8, 3x8 or 6x4 tiles; for n = 1 every shape streams w at memory
// speed. The portable kernel (no AVX-512) runs the same shape.
template <class W>
  requires std::same_as<W, float> || std::same_as<W, bf16>
void matmul(const Context<cpu>&, float* y, const float* x, const W* w, int n, int in, int out,
            bool accumulate = false) {
  cpu_detail::matmul_tiled<4, 6>(y, x, w, n, in, out, accumulate);
}

}  // namespace dc
