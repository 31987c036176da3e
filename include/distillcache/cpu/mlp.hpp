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
#include <utility>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/mlp.hpp"

namespace dc {

namespace cpu_detail {

// 32 rows: two 16-float or four 8-float vectors per unit.
inline constexpr int kMlpTile = 32;
inline constexpr std::int64_t kMlpChunkRows = 1024;  // rows per gradient partial sum

// z[o, r] = b[o] + sum_i W[o, i] a[i, r] for the out units of a layer over one tile (a: [in, T],
// z: [out, T]), in the order of i for every (o, r); relu: z is written through ReLU
// (math::activate's x > 0 ? x : 0), which spares inference a pass over z (nothing is saved for a
// backward there).
// The plain loop: what builds without AVX run, and the reference the vector path is tested
// against bit for bit (tests/cpu/test_mlp_policy.cpp).
inline void mlp_tile_units_portable(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in,
                                    int out, const float* DC_RESTRICT a, float* DC_RESTRICT z,
                                    bool relu = false) {
  constexpr int T = kMlpTile;
  for (int o = 0; o < out; ++o) {
    float acc[T];
    for (int r = 0; r < T; ++r) acc[r] = b[o];
    const float* w = W + std::int64_t(o) * in;
    for (int i = 0; i < in; ++i) {
      const float wi = w[i];
      for (int r = 0; r < T; ++r) acc[r] += wi * a[i * T + r];
    }
    for (int r = 0; r < T; ++r) z[o * T + r] = relu ? math::activate(Activation::relu, acc[r]) : acc[r];
  }
}

#if defined(__GNUC__) && !defined(__CUDACC__) && defined(__AVX__)
// Register-blocked with GCC/clang vector types: a block of units at a time, each tile row-block
// in T / lanes vectors, so 8 independent FMA chains live in registers. Written with loops over
// plain arrays of floats, the compiler kept one unit's 32 accumulators on the stack (perf
// annotate: every FMA read and wrote memory) and the MLP ran at a tenth of the FMA peak. Same
// operations per (o, r) as the plain loop above, so the same bits at any vector width. Only
// where AVX is enabled: without it, functions that pass vectors change the ABI (-Wpsabi), and
// the plain loop is what such a build can run. With AVX-512 the vectors are 16 floats (two per
// tile row-block, four units a block): twice the multiply-adds per instruction of 8-float ones.
#if defined(__AVX512F__)
inline constexpr int kMlpLanes = 16;
#else
inline constexpr int kMlpLanes = 8;
#endif
using MlpVector = float __attribute__((vector_size(kMlpLanes * sizeof(float))));
inline MlpVector load_mlp_vector(const float* p) {
  MlpVector v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store_mlp_vector(float* p, MlpVector v) { __builtin_memcpy(p, &v, sizeof v); }
inline MlpVector splat_mlp_vector(float x) { return MlpVector{} + x; }

// z rows [u, u + Units) of one tile: Units x (T / lanes) accumulators, fully unrolled; Relu: z
// through ReLU, lane by lane as math::activate computes it.
template <int Units, bool Relu>
inline void mlp_tile_unit_block(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int u,
                                const float* DC_RESTRICT a, float* DC_RESTRICT z) {
  constexpr int T = kMlpTile, K = kMlpTile / kMlpLanes;
  static_assert(T % kMlpLanes == 0, "a tile row-block is whole vectors");
  MlpVector c[Units][K];
  for (int j = 0; j < Units; ++j)
    for (int k = 0; k < K; ++k) c[j][k] = splat_mlp_vector(b[u + j]);
  const float* w = W + std::int64_t(u) * in;
  for (int i = 0; i < in; ++i) {
    MlpVector ai[K];
    for (int k = 0; k < K; ++k) ai[k] = load_mlp_vector(a + i * T + k * kMlpLanes);
    for (int j = 0; j < Units; ++j) {
      const float wji = w[std::int64_t(j) * in + i];
      for (int k = 0; k < K; ++k) c[j][k] += wji * ai[k];
    }
  }
  const MlpVector zero{};
  for (int j = 0; j < Units; ++j)
    for (int k = 0; k < K; ++k) {
      MlpVector v = c[j][k];
      if constexpr (Relu) v = v > zero ? v : zero;
      store_mlp_vector(z + (u + j) * T + k * kMlpLanes, v);
    }
}

template <bool Relu>
inline void mlp_tile_units_as(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int out,
                              const float* DC_RESTRICT a, float* DC_RESTRICT z) {
  constexpr int Units = 8 / (kMlpTile / kMlpLanes);  // 8 accumulator chains per block
  int u = 0;
  for (; u + Units <= out; u += Units) mlp_tile_unit_block<Units, Relu>(W, b, in, u, a, z);
  for (; u < out; ++u) mlp_tile_unit_block<1, Relu>(W, b, in, u, a, z);  // the output layer's single unit
}

inline void mlp_tile_units(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int out,
                           const float* DC_RESTRICT a, float* DC_RESTRICT z, bool relu = false) {
  if (relu) mlp_tile_units_as<true>(W, b, in, out, a, z);
  else mlp_tile_units_as<false>(W, b, in, out, a, z);
}
#else
inline void mlp_tile_units(const float* DC_RESTRICT W, const float* DC_RESTRICT b, int in, int out,
                           const float* DC_RESTRICT a, float* DC_RESTRICT z, bool relu = false) {
  mlp_tile_units_portable(W, b, in, out, a, z, relu);
}
#endif

// One tile's forward from its inputs already in a ([inputs, tile], rows beyond `rows` zero); a
// [widest, tile] holds each layer's inputs in turn, z the pre-activations. Writes z of every
// hidden layer to saved (row-major per row) when it is not null, and the output to
// scores[row0, row0 + rows). What the policy's inference calls after building the inputs
// straight into a (policy/mlp_scoring.hpp).
inline void mlp_tile_layers(const MlpLayout& L, const float* DC_RESTRICT params, std::int64_t row0,
                            int rows, float* DC_RESTRICT scores, float* DC_RESTRICT saved, float* a,
                            float* z) {
  constexpr int T = kMlpTile;
  std::int64_t saved_offset = 0;
  const std::int64_t saved_row = L.saved_per_row();
  // With nothing to save, a ReLU layer writes its activations directly, and the buffers swap
  // roles: its output is the next layer's input.
  const bool fuse_relu = !saved && L.activation == Activation::relu;
  for (int l = 0; l < L.layers(); ++l) {
    const int in = L.in(l), out = L.out(l);
    const float* W = params + L.weight_offset(l);
    const float* b = params + L.bias_offset(l);
    const bool last = l + 1 == L.layers();
    mlp_tile_units(W, b, in, out, a, z, fuse_relu && !last);
    if (last) {
      for (int r = 0; r < rows; ++r) scores[row0 + r] = z[r];
      break;
    }
    if (fuse_relu) {
      std::swap(a, z);
      continue;
    }
    if (saved)
      for (int o = 0; o < out; ++o)
        for (int r = 0; r < rows; ++r) saved[(row0 + r) * saved_row + saved_offset + o] = z[o * T + r];
    saved_offset += out;
    math::activate_all(L.activation, z, a, out * T);
  }
}

// One tile's forward from rows [row0, row0 + rows) of x ([n, inputs] row-major).
inline void mlp_tile_forward(const MlpLayout& L, const float* DC_RESTRICT params,
                             const float* DC_RESTRICT x, std::int64_t row0, int rows,
                             float* DC_RESTRICT scores, float* DC_RESTRICT saved, float* a, float* z) {
  constexpr int T = kMlpTile;
  for (int i = 0; i < L.inputs; ++i)
    for (int r = 0; r < T; ++r)
      a[i * T + r] = r < rows ? x[(row0 + r) * L.inputs + i] : 0.0f;
  mlp_tile_layers(L, params, row0, rows, scores, saved, a, z);
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
