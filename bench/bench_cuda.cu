// Google Benchmark for the CUDA backend: one decode step and one 64-token prefill chunk, at cache
// contexts of 1k and 4k tokens, for
//   tiny          the 2-layer test model (d 64, 4/2 heads, head_dim 16, ff 96, vocab 256), fp32
//   mistral_layer one Mistral-7B v0.1 layer (d 4096, 32/8 heads, head_dim 128, ff 14336,
//                 window 4096) with a 1024-token vocabulary, bf16 weights
// with random weights (cuRAND's host Philox generator: fast, and needs no device).
//
// The cache grows by one token (decode) or 64 (prefill) per iteration, so iterations are fixed and
// the cache is pre-filled so that the mean context over the timed iterations is the nominal one.
// Each iteration ends with the logits copied to the host (forward synchronises), so real time is
// the device time of the step. Without a usable device it prints a skip line and exits 0.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <curand.h>

#include <distillcache/distillcache.cuh>

#include "cuda_device.cuh"
#include "random_model.hpp"

namespace {

constexpr int kPrefillChunk = 64;
constexpr int kDecodeIterations = 64;
constexpr int kPrefillIterations = 8;

// The same shapes as the CPU benchmarks (bench/random_model.hpp); the tiny one with a sliding
// window so the CUDA mask path is exercised.
dc::ModelConfig tiny_config() {
  dc::ModelConfig c = dc_bench::tiny_config();
  c.sliding_window = 8;
  return c;
}

dc::ModelConfig mistral_layer_config() { return dc_bench::mistral7b_layer_config(); }

// Normal weights (matrices N(0, 1/in), embeddings N(0, 1), norms 1) from cuRAND's host generator.
dc::HostWeights random_host_weights(const dc::ModelConfig& cfg, unsigned long long seed) {
  dc::HostWeights w = dc::allocate_host_weights(cfg);
  curandGenerator_t gen = nullptr;
  DC_CURAND_CHECK(curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
  try {
    DC_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, seed));
    std::vector<float> scratch;
    dc::for_each_weight(cfg, w, [&](const std::string& name, dc::Tensor<float, dc::cpu>& t,
                                    dc::Shape s) {
      const std::size_t count = static_cast<std::size_t>(t.numel());
      if (name.find("norm") != std::string::npos) {
        for (std::size_t i = 0; i < count; ++i) t.data()[i] = 1.0f;
        return;
      }
      const bool embed = name.find("embed") != std::string::npos;
      const float stddev = embed ? 1.0f : 1.0f / std::sqrt(float(s[1]));
      scratch.resize((count + 1) / 2 * 2);  // cuRAND's normal generator wants an even count
      DC_CURAND_CHECK(curandGenerateNormal(gen, scratch.data(), scratch.size(), 0.0f, stddev));
      std::copy(scratch.begin(), scratch.begin() + std::ptrdiff_t(count), t.data());
    });
  } catch (...) {
    curandDestroyGenerator(gen);
    throw;
  }
  DC_CURAND_CHECK(curandDestroyGenerator(gen));
  return w;
}

template <class W>
std::unique_ptr<dc::Transformer<dc::cuda, W>> make_model(const dc::ModelConfig& cfg) {
  dc::Weights<dc::cuda, W> weights;
  {
    dc::Context<dc::cuda> upload_ctx;
    weights = dc::upload_weights<W>(random_host_weights(cfg, 42), upload_ctx);
  }
  return std::make_unique<dc::Transformer<dc::cuda, W>>(cfg, std::move(weights), kPrefillChunk);
}

// Models are built on first use and owned by main, so they are released before the CUDA runtime
// shuts down (destroying streams and handles during static destruction is unsafe).
struct Models {
  std::unique_ptr<dc::Transformer<dc::cuda, float>> tiny;
  std::unique_ptr<dc::Transformer<dc::cuda, dc::bf16>> mistral_layer;

  dc::Transformer<dc::cuda, float>& get(const float*) {
    if (!tiny) tiny = make_model<float>(tiny_config());
    return *tiny;
  }
  dc::Transformer<dc::cuda, dc::bf16>& get(const dc::bf16*) {
    if (!mistral_layer) mistral_layer = make_model<dc::bf16>(mistral_layer_config());
    return *mistral_layer;
  }
};

std::vector<std::int32_t> token_stream(int count, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(count));
  std::uint32_t x = 12345;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;  // any deterministic in-vocabulary sequence will do
    v = static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab));
  }
  return t;
}

// Runs `step_tokens` tokens per iteration starting from a cache holding about
// context - iterations*step_tokens/2 tokens.
template <class W>
void run_steps(benchmark::State& state, Models& models, int step_tokens, int iterations) {
  try {
    auto& model = models.get(static_cast<const W*>(nullptr));
    const auto& cfg = model.config();
    const int context = static_cast<int>(state.range(0));
    const int start = context - iterations * step_tokens / 2;
    auto cache = model.make_cache(start + iterations * step_tokens + step_tokens);
    const auto tokens = token_stream(start + iterations * step_tokens, cfg.vocab_size);
    const std::span<const std::int32_t> all(tokens);
    if (start > 0) {
      model.forward(all.subspan(0, std::size_t(start)), cache, std::span<float>(),
                    dc::LogitsFor::none);
      dc::synchronize(model.context());
    }
    std::vector<float> logits(std::size_t(cfg.vocab_size));
    std::size_t next = std::size_t(start);
    for (auto _ : state) {
      model.forward(all.subspan(next, std::size_t(step_tokens)), cache, std::span<float>(logits),
                    dc::LogitsFor::last);
      next += std::size_t(step_tokens);
    }
    state.counters["tokens/s"] = benchmark::Counter(double(state.iterations()) * step_tokens,
                                                    benchmark::Counter::kIsRate);
    state.counters["context"] = context;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

template <class W>
void register_model(Models& models, const std::string& name) {
  for (const bool decode : {true, false}) {
    const std::string full = name + (decode ? "/decode" : "/prefill64");
    auto* b = benchmark::RegisterBenchmark(full.c_str(), [&models, decode](benchmark::State& st) {
      if (decode)
        run_steps<W>(st, models, 1, kDecodeIterations);
      else
        run_steps<W>(st, models, kPrefillChunk, kPrefillIterations);
    });
    b->ArgName("context")
        ->Arg(1024)
        ->Arg(4096)
        ->Iterations(decode ? kDecodeIterations : kPrefillIterations)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!dc_bench::usable_cuda_device()) return 0;
  Models models;
  register_model<float>(models, "tiny_f32");
  register_model<dc::bf16>(models, "mistral_layer_bf16");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
