#pragma once
// CPU forward and hand-written backward of the policy MLP (math/mlp.hpp has the layout).
//
//   x       [n, inputs]          the rows' inputs
//   params  [layout.parameters()] the flat block: W_l [out, in] row-major, b_l [out], per layer
//   scores  [n]                  one score per row
//   saved   [n, saved_per_row]   every hidden unit's pre-activation, written by the forward for
//                                the backward (may be null when no backward follows)
//   dparams [parameters]         the backward *adds* d loss / d params for dscores [n]
//
// Rows go through in tiles of kMlpTile, units x tile in registers, so the inner loop over the
// tile's rows vectorises. The backward sums the gradient of each fixed chunk of rows on its own
// and adds the chunks up in order: the result is the same bits for any thread count, which the
// trainer's resume identity needs.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/mlp.hpp"

namespace dc {

namespace cpu_detail {

// 32 rows: four 8-float vectors per unit, four independent FMA chains to hide their latency.
inline constexpr int kMlpTile = 32;
inline constexpr std::int64_t kMlpChunkRows = 1024;  // rows per gradient partial sum

// z[o, r] = b[o] + sum_i W[o, i] a[i, r] for the out units of a layer over one tile (a: [in, T],
// z: [out, T]), in the order of i for every (o, r).
#if defined(__GNUC__) && !defined(__CUDACC__) && defined(__AVX__)
// Register-blocked with GCC/clang vector types: two units at a time, each tile row-block in four
// 8-float vectors, so 8 independent FMA chains live in registers. Written as arrays, the
// compiler kept one unit's 32 accumulators on the stack (perf annotate: every FMA read and wrote
// memory) and the MLP ran at a tenth of the FMA peak. Same operations per (o, r) as the plain
// loop below, so the same bits. Only where AVX is enabled: without it, functions that pass
// 8-float vectors change the ABI (-Wpsabi), and the plain loop is what such a build can run.
using MlpVector = float __attribute__((vector_size(32)));
inline MlpVector load_mlp_vector(const float* p) {
  MlpVector v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store_mlp_vector(float* p, MlpVector v) { __builtin_memcpy(p, &v, sizeof v); }
inline MlpVector splat_mlp_vector(float x) { return MlpVector{x, x, x, x, x, x, x, x}; }

inline void mlp_tile_units(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int out,
                           const float* DC_RESTRICT a, float* DC_RESTRICT z) {
  static_assert(kMlpTile == 32, "four 8-float vectors per tile row-block");
  constexpr int T = kMlpTile;
  int u = 0;
  for (; u + 1 < out; u += 2) {
    MlpVector c00 = splat_mlp_vector(b[u]), c01 = c00, c02 = c00, c03 = c00;
    MlpVector c10 = splat_mlp_vector(b[u + 1]), c11 = c10, c12 = c10, c13 = c10;
    const float* w0 = W + std::int64_t(u) * in;
    const float* w1 = w0 + in;
    for (int i = 0; i < in; ++i) {
      const float* ai = a + i * T;
      const MlpVector a0 = load_mlp_vector(ai), a1 = load_mlp_vector(ai + 8),
                      a2 = load_mlp_vector(ai + 16), a3 = load_mlp_vector(ai + 24);
      const float w0i = w0[i], w1i = w1[i];
      c00 += w0i * a0;
      c01 += w0i * a1;
      c02 += w0i * a2;
      c03 += w0i * a3;
      c10 += w1i * a0;
      c11 += w1i * a1;
      c12 += w1i * a2;
      c13 += w1i * a3;
    }
    float* z0 = z + u * T;
    float* z1 = z0 + T;
    store_mlp_vector(z0, c00);
    store_mlp_vector(z0 + 8, c01);
    store_mlp_vector(z0 + 16, c02);
    store_mlp_vector(z0 + 24, c03);
    store_mlp_vector(z1, c10);
    store_mlp_vector(z1 + 8, c11);
    store_mlp_vector(z1 + 16, c12);
    store_mlp_vector(z1 + 24, c13);
  }
  for (; u < out; ++u) {  // an odd last unit (the output layer's single one)
    MlpVector c0 = splat_mlp_vector(b[u]), c1 = c0, c2 = c0, c3 = c0;
    const float* w = W + std::int64_t(u) * in;
    for (int i = 0; i < in; ++i) {
      const float* ai = a + i * T;
      const float wi = w[i];
      c0 += wi * load_mlp_vector(ai);
      c1 += wi * load_mlp_vector(ai + 8);
      c2 += wi * load_mlp_vector(ai + 16);
      c3 += wi * load_mlp_vector(ai + 24);
    }
    store_mlp_vector(z + u * T, c0);
    store_mlp_vector(z + u * T + 8, c1);
    store_mlp_vector(z + u * T + 16, c2);
    store_mlp_vector(z + u * T + 24, c3);
  }
}
#else
inline void mlp_tile_units(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int out,
                           const float* DC_RESTRICT a, float* DC_RESTRICT z) {
  constexpr int T = kMlpTile;
  for (int o = 0; o < out; ++o) {
    float acc[T];
    for (int r = 0; r < T; ++r) acc[r] = b[o];
    const float* w = W + std::int64_t(o) * in;
    for (int i = 0; i < in; ++i) {
      const float wi = w[i];
      for (int r = 0; r < T; ++r) acc[r] += wi * a[i * T + r];
    }
    for (int r = 0; r < T; ++r) z[o * T + r] = acc[r];
  }
}
#endif

// One tile's forward: a [widest, tile] holds layer inputs, z the pre-activations.
// Writes z of every hidden layer to saved (row-major per row) when it is not null, and the
// output to scores.
inline void mlp_tile_forward(const MlpLayout& L, const float* DC_RESTRICT params,
                             const float* DC_RESTRICT x, std::int64_t row0, int rows,
                             float* DC_RESTRICT scores, float* DC_RESTRICT saved, float* a, float* z) {
  constexpr int T = kMlpTile;
  for (int i = 0; i < L.inputs; ++i)
    for (int r = 0; r < T; ++r)
      a[i * T + r] = r < rows ? x[(row0 + r) * L.inputs + i] : 0.0f;
  std::int64_t saved_offset = 0;
  const std::int64_t saved_row = L.saved_per_row();
  for (int l = 0; l < L.layers(); ++l) {
    const int in = L.in(l), out = L.out(l);
    const float* W = params + L.weight_offset(l);
    const float* b = params + L.bias_offset(l);
    mlp_tile_units(W, b, in, out, a, z);
    if (l + 1 == L.layers()) {
      for (int r = 0; r < rows; ++r) scores[row0 + r] = z[r];
      break;
    }
    if (saved)
      for (int o = 0; o < out; ++o)
        for (int r = 0; r < rows; ++r) saved[(row0 + r) * saved_row + saved_offset + o] = z[o * T + r];
    saved_offset += out;
    math::activate_all(L.activation, z, a, out * T);
  }
}

}  // namespace cpu_detail

inline void mlp_forward(const Context<cpu>&, const MlpLayout& layout, const float* params,
                        const float* x, std::int64_t n, float* scores, float* saved) {
  math::check_mlp_arguments(layout, params, x, n, "mlp_forward");
  constexpr int T = cpu_detail::kMlpTile;
  const std::int64_t tiles = (n + T - 1) / T;
  const std::size_t width = std::size_t(layout.widest()) * T;
DC_OMP(parallel if (tiles > 64))
  {
    std::vector<float> a(width), z(width);
DC_OMP(for schedule(static))
    for (std::int64_t t = 0; t < tiles; ++t)
      cpu_detail::mlp_tile_forward(layout, params, x, t * T, int(std::min<std::int64_t>(T, n - t * T)),
                                   scores, saved, a.data(), z.data());
  }
}

namespace cpu_detail {

// Adds one tile's gradient to g, [parameters, kMlpTile]: one lane per row of the tile.
// Recomputes each layer's input activations from the saved pre-activations.
inline void mlp_tile_backward(const MlpLayout& L, const float* DC_RESTRICT params,
                              const float* DC_RESTRICT x, const float* DC_RESTRICT saved,
                              const float* DC_RESTRICT dscores, std::int64_t row0, int rows,
                              float* DC_RESTRICT g, std::vector<std::vector<float>>& acts,
                              std::vector<std::vector<float>>& pre, float* dz, float* da) {
  constexpr int T = kMlpTile;
  const int hidden_layers = int(L.hidden.size());
  const std::int64_t saved_row = L.saved_per_row();
  // acts[l]: input of layer l, [in(l), T]; pre[l]: pre-activation of hidden layer l, [out, T].
  for (int i = 0; i < L.inputs; ++i)
    for (int r = 0; r < T; ++r) acts[0][std::size_t(i * T + r)] = r < rows ? x[(row0 + r) * L.inputs + i] : 0.0f;
  std::int64_t off = 0;
  for (int l = 0; l < hidden_layers; ++l) {
    const int out = L.out(l);
    float* p = pre[std::size_t(l)].data();
    for (int o = 0; o < out; ++o)
      for (int r = 0; r < T; ++r) p[o * T + r] = r < rows ? saved[(row0 + r) * saved_row + off + o] : 0.0f;
    math::activate_all(L.activation, p, acts[std::size_t(l + 1)].data(), out * T);
    // Padding rows: their activations must be 0 (act(0) is 0 for every activation here).
    off += out;
  }
  // Output layer: dz = dscores (padding rows contribute nothing).
  for (int r = 0; r < T; ++r) dz[r] = r < rows ? dscores[row0 + r] : 0.0f;
  for (int l = L.layers() - 1; l >= 0; --l) {
    const int in = L.in(l), out = L.out(l);
    const float* W = params + L.weight_offset(l);
    float* gW = g + L.weight_offset(l) * T;  // g: [parameters, T] lanes
    float* gb = g + L.bias_offset(l) * T;
    const float* a = acts[std::size_t(l)].data();
    // Per-lane sums (one per row of the tile): vertical FMAs that vectorise; the caller adds
    // the lanes up once per chunk.
    for (int o = 0; o < out; ++o) {
      float* bias = gb + std::int64_t(o) * T;
      for (int r = 0; r < T; ++r) bias[r] += dz[o * T + r];
      for (int i = 0; i < in; ++i) {
        float* w = gW + (std::int64_t(o) * in + i) * T;
        for (int r = 0; r < T; ++r) w[r] += dz[o * T + r] * a[i * T + r];
      }
    }
    if (l == 0) break;
    // da[i] = sum_o W[o, i] dz[o]; dz_prev = da * act'(pre).
    std::fill(da, da + std::size_t(in) * T, 0.0f);
    for (int o = 0; o < out; ++o) {
      const float* w = W + std::int64_t(o) * in;
      for (int i = 0; i < in; ++i) {
        const float wi = w[i];
        for (int r = 0; r < T; ++r) da[i * T + r] += wi * dz[o * T + r];
      }
    }
    math::activate_backward_all(L.activation, pre[std::size_t(l - 1)].data(), da, dz, in * T);
  }
}

}  // namespace cpu_detail

inline void mlp_backward(const Context<cpu>&, const MlpLayout& layout, const float* params,
                         const float* x, const float* saved, const float* dscores, std::int64_t n,
                         float* dparams) {
  math::check_mlp_arguments(layout, params, x, n, "mlp_backward");
  DC_CHECK(n == 0 || (saved && dscores && dparams), "mlp_backward: null saved activations, "
           "score gradients or parameter gradients");
  if (n == 0) return;
  constexpr int T = cpu_detail::kMlpTile;
  const std::int64_t chunk = cpu_detail::kMlpChunkRows;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  const std::size_t P = std::size_t(layout.parameters());
  std::vector<float> partial(std::size_t(chunks) * P, 0.0f);
  const std::size_t width = std::size_t(layout.widest()) * T;
DC_OMP(parallel if (chunks > 1))
  {
    std::vector<std::vector<float>> acts(std::size_t(layout.layers()), std::vector<float>(width));
    std::vector<std::vector<float>> pre(layout.hidden.size(), std::vector<float>(width));
    std::vector<float> dz(width), da(width), lanes(P * T);
DC_OMP(for schedule(static))
    for (std::int64_t c = 0; c < chunks; ++c) {
      std::fill(lanes.begin(), lanes.end(), 0.0f);
      const std::int64_t end = std::min(n, (c + 1) * chunk);
      for (std::int64_t row = c * chunk; row < end; row += T)
        cpu_detail::mlp_tile_backward(layout, params, x, saved, dscores, row,
                                      int(std::min<std::int64_t>(T, end - row)), lanes.data(), acts,
                                      pre, dz.data(), da.data());
      float* g = partial.data() + std::size_t(c) * P;
      for (std::size_t p = 0; p < P; ++p) {
        float sum = 0.0f;
        for (int r = 0; r < T; ++r) sum += lanes[p * T + std::size_t(r)];
        g[p] = sum;
      }
    }
  }
  for (std::int64_t c = 0; c < chunks; ++c)
    for (std::size_t p = 0; p < P; ++p) dparams[p] += partial[std::size_t(c) * P + p];
}

}  // namespace dc
