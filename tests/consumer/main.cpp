// Builds a two-layer model with random weights through the public API and decodes a few tokens.
#include <distillcache/distillcache.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
  dc::ModelConfig cfg;
  cfg.vocab_size = 64;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 48;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 8;
  cfg.max_position = 128;
  dc::HostWeights w = dc::allocate_host_weights(cfg);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  dc::for_each_weight(cfg, w, [&](const std::string&, dc::Tensor<float, dc::cpu>& t, dc::Shape) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 1.0f + normal(rng);
  });
  dc::Transformer<dc::cpu> model(cfg, std::move(w));
  auto cache = model.make_cache(32);
  std::vector<std::int32_t> prompt{1, 2, 3, 4};
  auto logits = model.forward(prompt, cache);
  for (float v : logits)
    if (!std::isfinite(v)) return 1;
  std::printf("consumer ok: %zu logits, cache length %d\n", logits.size(), cache.length());
  return cache.length() == 4 ? 0 : 1;
}
