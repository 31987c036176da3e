#pragma once
// Random-weight models for benchmarks: the tiny test shape and one Mistral-7B-shaped layer.
// Values come from a fast LCG (filling 7B-layer weights with mt19937 would dominate setup).
#include <cstdint>

#include <distillcache/model/config.hpp>
#include <distillcache/model/weights.hpp>

namespace dc_bench {

inline dc::ModelConfig tiny_config() {
  dc::ModelConfig c;
  c.architecture = "mistral";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position = 16384;
  return c;
}

// One decoder layer of Mistral-7B v0.1 (d 4096, 32/8 heads, ff 14336) with a small vocabulary,
// so the benchmark measures the layer, not the 32000 x 4096 output projection.
inline dc::ModelConfig mistral7b_layer_config() {
  dc::ModelConfig c = dc::ModelConfig::mistral_7b_v0_1();
  c.num_layers = 1;
  c.vocab_size = 1024;
  c.sliding_window = 0;
  return c;
}

inline dc::HostWeights random_weights(const dc::ModelConfig& c, std::uint64_t seed = 1) {
  dc::HostWeights w = dc::allocate_host_weights(c);
  std::uint64_t state = seed;
  dc::for_each_weight(c, w, [&](const std::string& name, dc::Tensor<float, dc::cpu>& t, dc::Shape) {
    const bool norm = name.find("norm") != std::string::npos;
    const float scale = norm ? 0.1f : 0.02f;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = float(state >> 40) * 0x1p-24f - 0.5f;  // uniform in [-0.5, 0.5)
      t.data()[i] = (norm ? 1.0f : 0.0f) + scale * u;
    }
  });
  return w;
}

}  // namespace dc_bench
