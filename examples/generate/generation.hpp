#pragma once
// The generation loop shared by the CPU and CUDA builds of examples/generate: prefill the prompt,
// then decode one token at a time, timing both phases.
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include <distillcache/io/tokenizer.hpp>
#include <distillcache/model/sampling.hpp>
#include <distillcache/decode/evicting_decoder.hpp>
#include <distillcache/model/transformer.hpp>

namespace dc_examples {

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // generated ids
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int prompt_tokens = 0;
  int cache_tokens = 0;  // held at the end
  std::size_t cache_bytes = 0;
  int evictions = 0;
};

// Generation stops early at the tokenizer's end-of-sequence token, when there is one.
inline int stop_token(const dc::Tokenizer* tokenizer) { return tokenizer ? tokenizer->eos() : -1; }

// Generates with a cache the policy keeps within the budget (FullCachePolicy: no eviction).
template <dc::Backend B, class W>
GenerationResult generate(dc::Transformer<B, W>& model, const std::vector<std::int32_t>& prompt,
                          int max_new_tokens, const dc::SamplingOptions& sampling,
                          std::uint64_t seed, int stop, dc::EvictionPolicy& policy,
                          const dc::Budget& budget,
                          dc::Granularity granularity = dc::Granularity::shared) {
  using clock = std::chrono::steady_clock;
  GenerationResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  dc::EvictingDecoder<B, W> decoder(model, policy, budget, dc::EvictionMode::decode,
                                    static_cast<int>(prompt.size()), max_new_tokens, granularity);
  std::mt19937_64 rng(seed);

  auto t0 = clock::now();
  std::vector<float> logits;
  {
    const auto out = decoder.prefill(prompt);
    logits.assign(out.begin(), out.end());
  }
  r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  t0 = clock::now();
  for (int i = 0; i < max_new_tokens; ++i) {
    const std::int32_t next = dc::sample_token(logits, sampling, rng);
    r.tokens.push_back(next);
    if ((stop >= 0 && next == stop) || i + 1 == max_new_tokens) break;
    const auto out = decoder.step(next);
    logits.assign(out.begin(), out.end());
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  r.cache_tokens = decoder.cache().evictable_length();  // what the budget bounds
  r.cache_bytes = decoder.cache().bytes_used();
  r.evictions = decoder.evictions();
  return r;
}

}  // namespace dc_examples
