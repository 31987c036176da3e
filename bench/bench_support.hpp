#pragma once
// Shared by the CPU benchmarks: the real SmolLM2 model and a cache filled without a prefill.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include <distillcache/distillcache.hpp>

namespace dc_bench {

// Fills the cache with `context` tokens of random K/V without running the model: decode cost
// depends on the cache length, not on how the cache was filled.
inline void fill_cache(dc::KVCache<dc::cpu>& cache, int context) {
  dc::Context<dc::cpu> ctx;
  cache.append(ctx, context);
  std::uint64_t s = 7;
  for (int l = 0; l < cache.num_layers(); ++l) {
    const std::size_t n = std::size_t(cache.num_kv_heads()) * cache.capacity(l) * cache.head_dim();
    cache.with_kv(l, [&](auto* keys, auto* values) {  // fp32 or bf16 storage
      using T = std::remove_pointer_t<decltype(keys)>;
      for (std::size_t i = 0; i < n; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        keys[i] = dc::from_float<T>(float(s >> 40) * 0x1p-24f - 0.5f);
        values[i] = dc::from_float<T>(float(s >> 41) * 0x1p-23f - 0.5f);
      }
    });
    // Statistics differ per KV head and slot, so per-head policies choose different keep-sets
    // (with all-equal statistics every head would pick the same slots and compaction less).
    const std::size_t rows = std::size_t(cache.num_kv_heads()) * cache.stat_rows() * cache.capacity(l);
    for (std::size_t i = 0; i < rows; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      cache.stats(l)[i] = float(s >> 40) * 0x1p-24f;
    }
  }
}

// The real SmolLM2-135M from $DC_SMOLLM2_GGUF or the fetch cache, dequantized to fp32 and, for
// W = bf16, rounded to bf16 matrices (half the bytes per decode step); W = dc::quantized keeps
// the file's own blocks (Q4_1 layers, Q8_0 embedding: 0.6 and 1.06 bytes per weight).
template <class W = float>
dc::Transformer<dc::cpu, W>& smollm2_model(int max_chunk) {
  static std::vector<std::pair<int, std::unique_ptr<dc::Transformer<dc::cpu, W>>>> models;
  for (auto& [chunk, m] : models)
    if (chunk == max_chunk) return *m;
  std::filesystem::path path;
  if (const char* p = std::getenv("DC_SMOLLM2_GGUF"); p && *p) path = p;
  else path = std::filesystem::path(std::getenv("HOME") ? std::getenv("HOME") : "/") /
              ".cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf";
  if constexpr (std::is_same_v<W, dc::quantized>) {
    const dc::GgufFile file(path);
    const dc::ModelConfig config = dc::gguf_model_config(file);
    models.emplace_back(max_chunk, std::make_unique<dc::Transformer<dc::cpu, W>>(
                                       config, dc::load_gguf_quantized_weights(file, config), max_chunk));
  } else {
    dc::HfModel m = dc::load_gguf_model(path);
    models.emplace_back(max_chunk, std::make_unique<dc::Transformer<dc::cpu, W>>(
                                       m.config, dc::convert_host_weights<W>(std::move(m.weights)), max_chunk));
  }
  return *models.back().second;
}

// One decode step at state.range(0) cached tokens, rewound after each iteration.
// Statistics: -1 leaves the cache's default (off), 0 disables, 1 observes every query.
// kv_type: how the cache stores K and V.
template <class W>
void run_decode(benchmark::State& state, dc::Transformer<dc::cpu, W>& model, int statistics = -1,
                dc::DType kv_type = dc::DType::f32) {
  const int context = int(state.range(0));
  auto cache = model.make_cache(context + 1, kv_type);
  fill_cache(cache, context);
  if (statistics == 1) cache.set_observed_from(0);
  if (statistics == 0) cache.disable_statistics();
  std::vector<float> logits(std::size_t(model.config().vocab_size));
  const std::int32_t token = 3;
  for (auto _ : state) {
    model.forward(std::span<const std::int32_t>(&token, 1), cache, std::span<float>(logits));
    cache.truncate(context);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["context"] = context;
}

// One batched decode step (Transformer::forward_batch) of S = state.range(0) sequences, each
// holding state.range(1) cached tokens (its own cache), rewound after each iteration.
// tokens_per_s counts every sequence's token; per_sequence_tokens_per_s is one sequence's rate.
template <class W>
void run_decode_batch(benchmark::State& state, dc::Transformer<dc::cpu, W>& model,
                      dc::DType kv_type = dc::DType::f32) {
  const int sequences = int(state.range(0)), length = int(state.range(1));
  std::vector<dc::KVCache<dc::cpu>> caches;
  std::vector<dc::KVCache<dc::cpu>*> batch;
  for (int s = 0; s < sequences; ++s) {
    caches.push_back(model.make_cache(length + 1, kv_type));
    fill_cache(caches.back(), length);
  }
  for (auto& c : caches) batch.push_back(&c);
  std::vector<float> logits(std::size_t(sequences) * std::size_t(model.config().vocab_size));
  const std::vector<std::int32_t> tokens(std::size_t(sequences), 3);
  for (auto _ : state) {
    model.forward_batch(tokens, batch, logits);
    for (auto& c : caches) c.truncate(length);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(state.iterations()) * sequences, benchmark::Counter::kIsRate);
  state.counters["per_sequence_tokens_per_s"] =
      benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["sequences"] = sequences;
  state.counters["cached_tokens"] = length;
}

}  // namespace dc_bench
