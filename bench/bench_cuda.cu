// Google Benchmark for the CUDA backend: one decode step and one 64-token prefill chunk, at cache
// contexts of 1k and 4k tokens, for
//   tiny          the 2-layer test model (d 64, 4/2 heads, head_dim 16, ff 96, vocab 256), fp32
//   mistral_layer one Mistral-7B v0.1 layer (d 4096, 32/8 heads, head_dim 128, ff 14336,
//                 window 4096) with a 1024-token vocabulary, bf16 weights
// with random weights (cuRAND's host Philox generator: fast, and needs no device).
//
// Then the kernels a Mistral-7B decode step is made of, each timed alone on the device (CUDA
// events around repeated launches, so the time is the GPU's, not the host's):
//   matmul_bf16/out/in/n  y[n, out] = x[n, in] W^T at the model's shapes (wq/wo, wk/wv,
//                 gate/up, down, lm_head), n = 1, 4, 8 (the GEMV) and 16 (cuBLAS); counters: the
//                 weights' bytes per second and that over the GPU's peak. Consecutive launches
//                 read different copies of W (512 MB in all), so L2 (50 MB) cannot serve them.
//   projections_bf16/ffn/fused  one decode row through Wq, Wk, Wv (ffn 0) or gate and up (1),
//                 one launch (fused 1) or one matmul each; counters as matmul_bf16.
//   attention_32k/S/stats/kernel  one decode query per sequence over a 32k bf16 cache (32 query,
//                 8 KV heads of 128), S caches one after another as Transformer::forward_batch
//                 runs them, statistics off or on; kernel 0 as dispatched, else a fixed kernel
//                 (the tiled one, decode variants); counters: K/V bytes per second, of peak.
//   small_kernel  rmsnorm of one 4096-wide row, launched back to back: what a kernel that does
//                 almost nothing costs on the device (a decode step launches ~15 per layer).
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

// ---- single kernels at Mistral-7B's shapes -----------------------------------------------------

// Times `reps` calls of op(r) between two CUDA events per iteration; the reported time is one
// call's.
template <class Op>
void time_on_device(benchmark::State& state, const dc::Context<dc::cuda>& ctx, int reps, Op op) {
  cudaEvent_t start = nullptr, stop = nullptr;
  DC_CUDA_CHECK(cudaEventCreate(&start));
  DC_CUDA_CHECK(cudaEventCreate(&stop));
  try {
    for (int r = 0; r < reps; ++r) op(r);  // warm-up: first-launch costs, cuBLAS heuristics
    for (auto _ : state) {
      DC_CUDA_CHECK(cudaEventRecord(start, ctx.stream()));
      for (int r = 0; r < reps; ++r) op(r);
      DC_CUDA_CHECK(cudaEventRecord(stop, ctx.stream()));
      DC_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      DC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      state.SetIterationTime(double(ms) * 1e-3 / reps);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  DC_CUDA_CHECK(cudaEventDestroy(start));
  DC_CUDA_CHECK(cudaEventDestroy(stop));
}

void bandwidth_counters(benchmark::State& state, double bytes_per_call) {
  state.counters["bytes/s"] = benchmark::Counter(bytes_per_call * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.counters["peak_bytes/s"] = dc_bench::peak_bandwidth();
}

void matmul_bf16(benchmark::State& state) {
  try {
    const int out = int(state.range(0)), in = int(state.range(1)), n = int(state.range(2));
    dc::Context<dc::cuda> ctx;
    const std::int64_t per = std::int64_t(out) * in;
    const std::int64_t copies = std::max<std::int64_t>(2, (std::int64_t(512) << 20) / (2 * per));
    dc::Tensor<dc::bf16, dc::cuda> w(dc::Shape{copies * per});
    const float a = std::sqrt(3.0f / float(in));
    dc_bench::fill_uniform(ctx, w.data(), copies * per, -a, a, 7);
    dc::Tensor<float, dc::cuda> x(dc::Shape{std::int64_t(n) * in}), y(dc::Shape{std::int64_t(n) * out});
    dc_bench::fill_uniform(ctx, x.data(), x.numel(), -1.0f, 1.0f, 8);
    time_on_device(state, ctx, 20, [&](int r) {
      dc::matmul(ctx, y.data(), x.data(), w.data() + (r % copies) * per, n, in, out);
    });
    bandwidth_counters(state, 2.0 * double(per));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// One decode row through the matrices that share an input, Mistral-7B's Wq, Wk and Wv (4096,
// 1024 and 1024 rows of 4096) or gate and up (2 x 14336 rows): fused, one matmul_shared_input
// launch; else one matmul each (for the ratio in one run).
void projections_bf16(benchmark::State& state) {
  try {
    const bool ffn = state.range(0) != 0, fused = state.range(1) != 0;
    constexpr int kIn = 4096;
    const std::vector<int> outs = ffn ? std::vector<int>{14336, 14336} : std::vector<int>{4096, 1024, 1024};
    dc::Context<dc::cuda> ctx;
    std::int64_t per = 0;  // weights of one set
    for (const int o : outs) per += std::int64_t(o) * kIn;
    const std::int64_t copies = std::max<std::int64_t>(2, (std::int64_t(512) << 20) / (2 * per));
    dc::Tensor<dc::bf16, dc::cuda> w(dc::Shape{copies * per});
    const float a = std::sqrt(3.0f / float(kIn));
    dc_bench::fill_uniform(ctx, w.data(), copies * per, -a, a, 7);
    dc::Tensor<float, dc::cuda> x(dc::Shape{kIn}), y(dc::Shape{per / kIn});
    dc_bench::fill_uniform(ctx, x.data(), x.numel(), -1.0f, 1.0f, 8);
    time_on_device(state, ctx, 20, [&](int r) {
      dc::MatmulOutput<dc::bf16> o[3]{};
      const dc::bf16* wp = w.data() + (r % copies) * per;
      float* yp = y.data();
      for (std::size_t t = 0; t < outs.size(); ++t) {
        o[t] = {yp, wp, outs[t]};
        wp += std::int64_t(outs[t]) * kIn;
        yp += outs[t];
      }
      if (!fused)
        for (std::size_t t = 0; t < outs.size(); ++t) dc::matmul(ctx, o[t].y, x.data(), o[t].w, 1, kIn, o[t].out);
      else if (ffn)
        dc::matmul_shared_input(ctx, x.data(), 1, kIn, {o[0], o[1]});
      else
        dc::matmul_shared_input(ctx, x.data(), 1, kIn, {o[0], o[1], o[2]});
    });
    bandwidth_counters(state, 2.0 * double(per));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void attention_32k(benchmark::State& state) {
  try {
    const int sequences = int(state.range(0));
    const bool with_stats = state.range(1) != 0;
    constexpr int kLen = 32768, kHeads = 32, kKvHeads = 8, kHeadDim = 128;
    const dc::AttentionShape shape{kHeads, kKvHeads, kHeadDim, 0, 1.0f / std::sqrt(float(kHeadDim)), kLen + 1};
    dc::Context<dc::cuda> ctx;
    const std::int64_t kv = std::int64_t(kKvHeads) * shape.capacity * kHeadDim;
    const std::int64_t stat_floats = dc::stat_block_floats(kHeads, kKvHeads, shape.capacity);
    std::vector<dc::Tensor<dc::bf16, dc::cuda>> keys, values;
    std::vector<dc::Tensor<float, dc::cuda>> stats;
    for (int s = 0; s < sequences; ++s) {
      keys.emplace_back(dc::Shape{kv});
      values.emplace_back(dc::Shape{kv});
      dc_bench::fill_uniform(ctx, keys.back().data(), kv, -0.5f, 0.5f, 100 + 2 * std::uint64_t(s));
      dc_bench::fill_uniform(ctx, values.back().data(), kv, -0.5f, 0.5f, 101 + 2 * std::uint64_t(s));
      if (with_stats) {
        stats.emplace_back(dc::Shape{stat_floats});
        dc_bench::fill_uniform(ctx, stats.back().data(), stat_floats, 0.0f, 1.0f, 300 + std::uint64_t(s));
      }
    }
    std::vector<std::int32_t> positions(std::size_t(kKvHeads) * shape.capacity);
    for (int h = 0; h < kKvHeads; ++h)
      for (int j = 0; j < shape.capacity; ++j) positions[std::size_t(h) * shape.capacity + j] = j;
    dc::Tensor<std::int32_t, dc::cuda> key_pos(dc::Shape{std::int64_t(positions.size())});
    dc::copy_to_backend(ctx, key_pos.data(), positions.data(), positions.size());
    dc::Tensor<float, dc::cuda> q(dc::Shape{std::int64_t(sequences) * kHeads * kHeadDim});
    dc::Tensor<float, dc::cuda> out(dc::Shape{q.numel()});
    dc_bench::fill_uniform(ctx, q.data(), q.numel(), -1.0f, 1.0f, 9);
    const std::int32_t* query_pos = key_pos.data() + kLen - 1;  // the newest slot's position
    const int kernel = int(state.range(2));
    time_on_device(state, ctx, 5, [&](int) {
      for (int s = 0; s < sequences; ++s) {
        const std::int64_t row = std::int64_t(s) * kHeads * kHeadDim;
        const dc::AttentionStats st{with_stats ? stats[std::size_t(s)].data() : nullptr, 0};
        const dc::bf16 *k = keys[std::size_t(s)].data(), *v = values[std::size_t(s)].data();
        if (kernel == 0) {
          dc::attention(ctx, out.data() + row, q.data() + row, k, v, key_pos.data(), kLen, query_pos, 1, shape, st);
          continue;
        }
        // Fixed kernels, for ratios in one run: the tiled kernel, decode variants (unroll, blocks).
        namespace cd = dc::cuda_detail;
        const auto p = cd::attention_params(out.data() + row, q.data() + row, k, v, key_pos.data(), kLen,
                                            query_pos, 1, shape);
        if (kernel == 1) cd::launch_attention<dc::bf16, kHeadDim, false, 4>(ctx, p, kKvHeads, st);
        if (kernel == 2) cd::launch_decode_attention<dc::bf16, kHeadDim, 4, 2, 4>(ctx, p, kKvHeads, st);
        if (kernel == 3) cd::launch_decode_attention<dc::bf16, kHeadDim, 4, 8, 2>(ctx, p, kKvHeads, st);
        if (kernel == 4) cd::launch_decode_attention<dc::bf16, kHeadDim, 4, 4, 2>(ctx, p, kKvHeads, st);
      }
    });
    bandwidth_counters(state, 2.0 * double(sequences) * kKvHeads * kLen * kHeadDim * sizeof(dc::bf16));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void small_kernel(benchmark::State& state) {
  try {
    dc::Context<dc::cuda> ctx;
    constexpr int kWidth = 4096;
    dc::Tensor<float, dc::cuda> x(dc::Shape{kWidth}), y(dc::Shape{kWidth}), w(dc::Shape{kWidth});
    dc_bench::fill_uniform(ctx, x.data(), kWidth, -1.0f, 1.0f, 10);
    dc_bench::fill_uniform(ctx, w.data(), kWidth, 1.0f, 1.0f, 0);
    time_on_device(state, ctx, 200, [&](int) { dc::rmsnorm(ctx, y.data(), x.data(), w.data(), 1, kWidth, 1e-5f); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_kernels() {
  struct MatrixShape {
    int out, in;
  };
  // wq and wo, wk and wv, gate and up, down, lm_head (vocabulary 32768).
  for (const MatrixShape m : {MatrixShape{4096, 4096}, MatrixShape{1024, 4096}, MatrixShape{14336, 4096},
                              MatrixShape{4096, 14336}, MatrixShape{32768, 4096}})
    for (const int n : {1, 4, 8, 16})
      benchmark::RegisterBenchmark("matmul_bf16", matmul_bf16)
          ->Args({m.out, m.in, n})
          ->ArgNames({"out", "in", "n"})
          ->Iterations(10)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  for (const int ffn : {0, 1})
    for (const int fused : {0, 1})
      benchmark::RegisterBenchmark("projections_bf16", projections_bf16)
          ->Args({ffn, fused})
          ->ArgNames({"ffn", "fused"})
          ->Iterations(10)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  // kernel 0: what dc::attention picks; 1: the tiled kernel; 2-4: decode kernel variants
  // (unroll, min blocks per SM) = (2, 4), (8, 2), (4, 2) against the default (4, 3).
  std::vector<std::vector<std::int64_t>> attention_args;
  for (const int sequences : {1, 16})
    for (const int with_stats : {0, 1}) attention_args.push_back({sequences, with_stats, 0});
  for (const int kernel : {1, 2, 3, 4}) attention_args.push_back({1, 0, kernel});
  attention_args.push_back({16, 0, 1});
  for (const auto& args : attention_args)
    benchmark::RegisterBenchmark("attention_32k", attention_32k)
        ->Args(args)
        ->ArgNames({"S", "stats", "kernel"})
        ->Iterations(10)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("small_kernel", small_kernel)->Iterations(10)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  if (!dc_bench::usable_cuda_device()) return 0;
  Models models;
  register_model<float>(models, "tiny_f32");
  register_model<dc::bf16>(models, "mistral_layer_bf16");
  register_kernels();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
