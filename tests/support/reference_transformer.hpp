#pragma once
// A naive double-precision Llama/Mistral forward pass for tests, written independently of the
// library's ops: it takes an explicit visibility rule (which key positions each query position
// may attend to) and records every attention probability, so tests can check evicted-cache
// decoding and the eviction features against first principles.
#include <cmath>
#include <functional>
#include <vector>

#include <distillcache/model/config.hpp>
#include <distillcache/model/weights.hpp>

namespace dc_test {

struct ReferenceRun {
  std::vector<std::vector<double>> logits;  // [position][vocab]
  // probs[layer][head][query][key] (0 where not visible)
  std::vector<std::vector<std::vector<std::vector<double>>>> probs;
  std::vector<std::vector<std::vector<double>>> value_norm;  // [layer][kv_head][position]
  std::vector<std::vector<std::vector<double>>> key_norm;    // after RoPE
  std::vector<std::vector<std::vector<double>>> queries;  // [layer][position][heads*hd], before RoPE
  std::vector<std::vector<std::vector<double>>> keys;     // [layer][position][kv_heads*hd], after RoPE
};

// visible(layer, kv_head, q, k): may query position q attend to key position k through that KV
// head of that layer (k <= q is also required): per-head keep-sets give each head its own rule.
inline ReferenceRun reference_forward(const dc::ModelConfig& c, const dc::HostWeights& w,
                                      const std::vector<int>& tokens,
                                      const std::function<bool(int, int, int, int)>& visible) {
  const int n = int(tokens.size()), d = c.hidden_size, hd = c.head_dim, H = c.num_heads,
            KV = c.num_kv_heads, ff = c.intermediate_size, V = c.vocab_size;
  auto matvec = [](const dc::Tensor<float, dc::cpu>& m, const std::vector<double>& x) {
    const int rows = int(m.dim(0)), cols = int(m.dim(1));
    std::vector<double> y(std::size_t(rows), 0.0);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < cols; ++k) y[std::size_t(r)] += double(m.data()[std::size_t(r) * cols + k]) * x[std::size_t(k)];
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const dc::Tensor<float, dc::cpu>& g) {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + double(c.rms_eps));
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(g.data()[i]);
    return y;
  };
  auto rope = [&](std::vector<double>& v, int heads, int pos) {  // rotate-half convention
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const double inv_freq = 1.0 / std::pow(double(c.rope_theta), 2.0 * i / hd);
        const double a = pos * inv_freq, cs = std::cos(a), sn = std::sin(a);
        double& x = v[std::size_t(h * hd + i)];
        double& y = v[std::size_t(h * hd + i + hd / 2)];
        const double x0 = x, y0 = y;
        x = x0 * cs - y0 * sn;
        y = y0 * cs + x0 * sn;
      }
  };

  ReferenceRun run;
  run.probs.assign(std::size_t(c.num_layers), std::vector<std::vector<std::vector<double>>>(
                                                   std::size_t(H), std::vector<std::vector<double>>(
                                                                       std::size_t(n), std::vector<double>(std::size_t(n), 0.0))));
  run.value_norm.assign(std::size_t(c.num_layers), std::vector<std::vector<double>>(std::size_t(KV), std::vector<double>(std::size_t(n))));
  run.key_norm = run.value_norm;
  std::vector<std::vector<double>> x(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(d)));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) x[std::size_t(t)][std::size_t(i)] = w.embed.data()[std::size_t(tokens[std::size_t(t)]) * d + i];

  for (int l = 0; l < c.num_layers; ++l) {
    const auto& L = w.layers[std::size_t(l)];
    std::vector<std::vector<double>> q(static_cast<std::size_t>(n)), k(static_cast<std::size_t>(n)),
        v(static_cast<std::size_t>(n));
    for (int t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[std::size_t(t)], L.attn_norm);
      q[std::size_t(t)] = matvec(L.wq, xn);
      k[std::size_t(t)] = matvec(L.wk, xn);
      v[std::size_t(t)] = matvec(L.wv, xn);
      run.queries.resize(std::size_t(c.num_layers));
      run.queries[std::size_t(l)].push_back(q[std::size_t(t)]);
      rope(q[std::size_t(t)], H, t);
      rope(k[std::size_t(t)], KV, t);
      run.keys.resize(std::size_t(c.num_layers));
      run.keys[std::size_t(l)].push_back(k[std::size_t(t)]);
      for (int g = 0; g < KV; ++g) {
        double kk = 0, vv = 0;
        for (int i = 0; i < hd; ++i) {
          kk += k[std::size_t(t)][std::size_t(g * hd + i)] * k[std::size_t(t)][std::size_t(g * hd + i)];
          vv += v[std::size_t(t)][std::size_t(g * hd + i)] * v[std::size_t(t)][std::size_t(g * hd + i)];
        }
        run.key_norm[std::size_t(l)][std::size_t(g)][std::size_t(t)] = std::sqrt(kk);
        run.value_norm[std::size_t(l)][std::size_t(g)][std::size_t(t)] = std::sqrt(vv);
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(std::size_t(H * hd), 0.0);
      for (int h = 0; h < H; ++h) {
        const int g = h / (H / KV);
        std::vector<double> s(std::size_t(n), -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          if (!visible(l, g, t, j)) continue;
          if (c.sliding_window > 0 && t - j >= c.sliding_window) continue;
          double dot = 0;
          for (int i = 0; i < hd; ++i) dot += q[std::size_t(t)][std::size_t(h * hd + i)] * k[std::size_t(j)][std::size_t(g * hd + i)];
          s[std::size_t(j)] = dot / std::sqrt(double(hd));
          m = std::max(m, s[std::size_t(j)]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += s[std::size_t(j)] == -INFINITY ? 0.0 : std::exp(s[std::size_t(j)] - m);
        for (int j = 0; j <= t; ++j) {
          if (s[std::size_t(j)] == -INFINITY) continue;
          const double p = std::exp(s[std::size_t(j)] - m) / z;
          run.probs[std::size_t(l)][std::size_t(h)][std::size_t(t)][std::size_t(j)] = p;
          for (int i = 0; i < hd; ++i) att[std::size_t(h * hd + i)] += p * v[std::size_t(j)][std::size_t(g * hd + i)];
        }
      }
      const auto o = matvec(L.wo, att);
      for (int i = 0; i < d; ++i) x[std::size_t(t)][std::size_t(i)] += o[std::size_t(i)];
      const auto xn = rmsnorm(x[std::size_t(t)], L.ffn_norm);
      auto gate = matvec(L.w_gate, xn);
      const auto up = matvec(L.w_up, xn);
      for (int i = 0; i < ff; ++i) gate[std::size_t(i)] = gate[std::size_t(i)] / (1.0 + std::exp(-gate[std::size_t(i)])) * up[std::size_t(i)];
      const auto down = matvec(L.w_down, gate);
      for (int i = 0; i < d; ++i) x[std::size_t(t)][std::size_t(i)] += down[std::size_t(i)];
    }
  }
  const auto& out = w.output_matrix();
  for (int t = 0; t < n; ++t) run.logits.push_back(matvec(out, rmsnorm(x[std::size_t(t)], w.final_norm)));
  (void)V;
  return run;
}

// The same rule for every layer and head: visible(q, k).
inline ReferenceRun reference_forward(const dc::ModelConfig& c, const dc::HostWeights& w,
                                      const std::vector<int>& tokens,
                                      const std::function<bool(int, int)>& visible) {
  return reference_forward(c, w, tokens,
                           [&](int, int, int q, int k) { return visible(q, k); });
}

}  // namespace dc_test
