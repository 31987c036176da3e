#pragma once
// Prints a generation result with prefill and decode throughput.
#include <cstdio>

#include <distillcache/io/tokenizer.hpp>

#include "generation.hpp"

namespace dc_examples {

inline void print_result(const GenerationResult& r, const char* device,
                         const dc::Tokenizer* tokenizer) {
  if (tokenizer) {
    std::vector<std::int32_t> text_tokens = r.tokens;
    if (!text_tokens.empty() && text_tokens.back() == tokenizer->eos()) text_tokens.pop_back();
    std::printf("%s\n", tokenizer->decode(text_tokens).c_str());
  } else {
    std::printf("generated:");
    for (auto t : r.tokens) std::printf(" %d", t);
    std::printf("\n");
  }
  const double prefill_tps = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0;
  // The first new token comes from the prefill logits; each later one costs one decode step.
  const auto steps = r.tokens.empty() ? 0 : r.tokens.size() - 1;
  const double decode_tps = r.decode_seconds > 0 ? double(steps) / r.decode_seconds : 0.0;
  std::printf("device %s: prefill %d tokens in %.3f s (%.1f tokens/s); decode %zu steps in %.3f s "
              "(%.1f tokens/s)\n",
              device, r.prompt_tokens, r.prefill_seconds, prefill_tps, steps, r.decode_seconds,
              decode_tps);
  std::printf("KV cache at the end: %d tokens, %.2f MiB, after %d evictions\n", r.cache_tokens,
              double(r.cache_bytes) / (1024.0 * 1024.0), r.evictions);
}

}  // namespace dc_examples
