// CPU benchmarks: one decode step at a given context, and a prefill chunk, for the tiny test
// model and for one Mistral-7B-shaped layer (fp32, random weights); SmolLM2 decode (single and
// batched) and prefill.
//
//   build/bench/bench_cpu --benchmark_format=json --benchmark_out=bench/results/cpu.json
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include <cstdlib>
#include <filesystem>

#include <distillcache/distillcache.hpp>

#include "bench_support.hpp"
#include "random_model.hpp"

namespace {

using MakeConfig = dc::ModelConfig (*)();

// One model per (shape, chunk), built on first use: a 7B layer takes seconds to build, so it is
// reused across the benchmark's runs.
dc::Transformer<dc::cpu>& model_for(MakeConfig make, int max_chunk) {
  struct Entry {
    MakeConfig make;
    int max_chunk;
    std::unique_ptr<dc::Transformer<dc::cpu>> model;
  };
  static std::vector<Entry> models;
  for (auto& e : models)
    if (e.make == make && e.max_chunk == max_chunk) return *e.model;
  const dc::ModelConfig c = make();
  models.push_back({make, max_chunk,
                    std::make_unique<dc::Transformer<dc::cpu>>(c, dc_bench::random_weights(c), max_chunk)});
  return *models.back().model;
}

void decode_step(benchmark::State& state, MakeConfig make) {
  dc_bench::run_decode(state, model_for(make, 1));
}

void prefill_chunk(benchmark::State& state, MakeConfig make) {
  const int chunk = int(state.range(0));
  auto& model = model_for(make, chunk);
  auto cache = model.make_cache(chunk);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(chunk));
  for (int i = 0; i < chunk; ++i) tokens[std::size_t(i)] = (i * 37) % model.config().vocab_size;
  std::vector<float> logits(std::size_t(model.config().vocab_size));
  for (auto _ : state) {
    model.forward(tokens, cache, std::span<float>(logits));
    cache.clear();
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(state.iterations()) * chunk, benchmark::Counter::kIsRate);
}

}  // namespace

namespace {

void smollm2_decode(benchmark::State& state) { dc_bench::run_decode(state, dc_bench::smollm2_model(1)); }
void smollm2_decode_bf16(benchmark::State& state) {
  dc_bench::run_decode(state, dc_bench::smollm2_model<dc::bf16>(1));
}

// Batched decode, bf16 weights: S sequences of L cached tokens per step. A 25 % budget of a 2k
// (8k) context is L = 512 (2048): the same table gives S sequences at 25 % against the full cache.
void smollm2_decode_batch_bf16(benchmark::State& state) {
  dc_bench::run_decode_batch(state, dc_bench::smollm2_model<dc::bf16>(64));
}

// Decode and batched decode with the GGUF's own quantized blocks (integer dot products).
void smollm2_decode_gguf(benchmark::State& state) {
  dc_bench::run_decode(state, dc_bench::smollm2_model<dc::quantized>(1));
}
void smollm2_decode_batch_gguf(benchmark::State& state) {
  dc_bench::run_decode_batch(state, dc_bench::smollm2_model<dc::quantized>(64));
}
// The same with a bf16 KV cache: half the bytes attention reads per token.
void smollm2_decode_gguf_kv_bf16(benchmark::State& state) {
  dc_bench::run_decode(state, dc_bench::smollm2_model<dc::quantized>(1), -1, dc::DType::bf16);
}
void smollm2_decode_batch_gguf_kv_bf16(benchmark::State& state) {
  dc_bench::run_decode_batch(state, dc_bench::smollm2_model<dc::quantized>(64), dc::DType::bf16);
}

// Prefill of a whole context in chunks of 64: tokens/s over the context.
template <class W>
void prefill_context(benchmark::State& state) {
  const int context = int(state.range(0));
  auto& model = dc_bench::smollm2_model<W>(64);
  auto cache = model.make_cache(context);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(context));
  for (int i = 0; i < context; ++i) tokens[std::size_t(i)] = 100 + (i * 7919) % 40000;
  std::vector<float> logits(std::size_t(model.config().vocab_size));
  for (auto _ : state) {
    model.forward(tokens, cache, std::span<float>(logits));
    cache.clear();
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(state.iterations()) * context, benchmark::Counter::kIsRate);
}
void smollm2_prefill(benchmark::State& state) { prefill_context<float>(state); }
void smollm2_prefill_gguf(benchmark::State& state) { prefill_context<dc::quantized>(state); }

}  // namespace

BENCHMARK(smollm2_decode)->Arg(512)->Arg(2048)->Arg(8191)  // 8191 + the decoded token = max_position
   ->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_bf16)->Arg(512)->Arg(2048)->Arg(8191)->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_batch_bf16)
    ->ArgNames({"sequences", "cached"})
    ->ArgsProduct({{1, 4, 16}, {512, 2048, 8191}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_gguf)->Arg(512)->Arg(2048)->Arg(8191)->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_batch_gguf)
    ->ArgNames({"sequences", "cached"})
    ->ArgsProduct({{1, 4, 16}, {512, 2048, 8191}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_gguf_kv_bf16)->Arg(512)->Arg(2048)->Arg(8191)->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_decode_batch_gguf_kv_bf16)
    ->ArgNames({"sequences", "cached"})
    ->ArgsProduct({{1, 4, 16}, {512, 2048, 8191}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(smollm2_prefill)->Arg(512)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(smollm2_prefill_gguf)->Arg(512)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_CAPTURE(decode_step, tiny, dc_bench::tiny_config)->Arg(128)->Arg(1024)->Arg(8192);
BENCHMARK_CAPTURE(prefill_chunk, tiny, dc_bench::tiny_config)->Arg(64)->Arg(512);
BENCHMARK_CAPTURE(decode_step, mistral7b_layer, dc_bench::mistral7b_layer_config)
    ->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(prefill_chunk, mistral7b_layer, dc_bench::mistral7b_layer_config)
    ->Arg(64)->Unit(benchmark::kMillisecond)->Iterations(2);

BENCHMARK_MAIN();
