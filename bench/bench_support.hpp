#pragma once
// Shared by the CPU benchmarks: the real SmolLM2 model and a cache filled without a prefill.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <distillcache/distillcache.hpp>

namespace dc_bench {

// Fills the cache with `context` tokens of random K/V without running the model: decode cost
// depends on the cache length, not on how the cache was filled.
inline void fill_cache(dc::KVCache<dc::cpu>& cache, int context) {
  dc::Context<dc::cpu> ctx;
  cache.append(ctx, context);
  std::uint64_t s = 7;
  for (int l = 0; l < cache.num_layers(); ++l) {
    const std::size_t n = std::size_t(cache.num_kv_heads()) * cache.capacity() * cache.head_dim();
    for (std::size_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      cache.keys(l)[i] = float(s >> 40) * 0x1p-24f - 0.5f;
      cache.values(l)[i] = float(s >> 41) * 0x1p-23f - 0.5f;
    }
  }
}

// The real SmolLM2-135M (dequantized to fp32) from $DC_SMOLLM2_GGUF or the fetch cache.
inline dc::Transformer<dc::cpu>& smollm2_model(int max_chunk) {
  static std::vector<std::pair<int, std::unique_ptr<dc::Transformer<dc::cpu>>>> models;
  for (auto& [chunk, m] : models)
    if (chunk == max_chunk) return *m;
  std::filesystem::path path;
  if (const char* p = std::getenv("DC_SMOLLM2_GGUF"); p && *p) path = p;
  else path = std::filesystem::path(std::getenv("HOME") ? std::getenv("HOME") : "/") /
              ".cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf";
  dc::HfModel m = dc::load_gguf_model(path);
  models.emplace_back(max_chunk, std::make_unique<dc::Transformer<dc::cpu>>(m.config, std::move(m.weights), max_chunk));
  return *models.back().second;
}

}  // namespace dc_bench
