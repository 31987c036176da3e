// The CPU GEMM alone, at SmolLM2-135M's projection shapes, against the machine's fp32 FMA peak
// measured in the same run: the figure issue "prefill near peak" asks for.
//
//   build/dev/bench/bench_gemm --benchmark_format=json --benchmark_out=bench/results/gemm_cpu.json
//
// Counters: GFLOP/s = 2 n in out per call. fma_peak runs 12 independent AVX-512 (or, without
// AVX-512, 8-lane portable) FMA chains per thread on every OpenMP thread: the most the cores can
// retire, whatever the memory does.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include <distillcache/distillcache.hpp>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

template <class W>
void gemm(benchmark::State& state) {
  const int n = int(state.range(0)), in = int(state.range(1)), out = int(state.range(2));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(std::size_t(n) * in), y(std::size_t(n) * out);
  std::vector<W> w(std::size_t(out) * in);
  for (float& v : x) v = normal(rng);
  for (W& v : w) v = dc::from_float<W>(normal(rng));
  const dc::Context<dc::cpu> ctx;
  for (auto _ : state) {
    dc::matmul(ctx, y.data(), x.data(), w.data(), n, in, out);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * in * out * double(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

void fma_peak(benchmark::State& state) {
  constexpr long kSteps = 20'000'000;
  int threads = 1;
  for (auto _ : state) {
    float sink = 0.0f;
    DC_OMP(parallel reduction(+ : sink))
    {
#if defined(__AVX512F__)
      __m512 a0 = _mm512_set1_ps(0.1f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
             a8 = a0, a9 = a0, a10 = a0, a11 = a0;
      const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
      for (long k = 0; k < kSteps; ++k) {
#define DC_FMA_STEP(r) r = _mm512_fmadd_ps(r, b, c);
        DC_FMA_STEP(a0) DC_FMA_STEP(a1) DC_FMA_STEP(a2) DC_FMA_STEP(a3) DC_FMA_STEP(a4) DC_FMA_STEP(a5)
        DC_FMA_STEP(a6) DC_FMA_STEP(a7) DC_FMA_STEP(a8) DC_FMA_STEP(a9) DC_FMA_STEP(a10) DC_FMA_STEP(a11)
#undef DC_FMA_STEP
        // Keeps the twelve chains in registers and the loop from being folded.
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                         "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11);
      sink += lanes[0];
#else
      float a[12][8] = {};
      for (long k = 0; k < kSteps; ++k)
        for (int r = 0; r < 12; ++r)
          for (int l = 0; l < 8; ++l) a[r][l] = dc::cpu_detail::multiply_add(a[r][l], 0.9999f, 1e-4f);
      for (int r = 0; r < 12; ++r) sink += a[r][0];
#endif
      DC_OMP(single)
      threads = dc::cpu_detail::max_threads();
    }
    benchmark::DoNotOptimize(sink);
  }
#if defined(__AVX512F__)
  const double flops_per_thread = 2.0 * 16 * 12 * kSteps;
#else
  const double flops_per_thread = 2.0 * 8 * 12 * kSteps;
#endif
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_thread * threads * double(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// SmolLM2-135M: hidden 576, K/V 192, MLP 1536, vocabulary 49152; n = 1 (decode), 4 and 22 (a
// batch of students), 512 (a prefill chunk).
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "in", "out"});
  for (int n : {1, 4, 22, 512})
    for (auto [in, out] : {std::pair{576, 576}, {576, 192}, {576, 1536}, {1536, 576}, {576, 49152}})
      if (!(n == 512 && out == 49152)) b->Args({n, in, out});
}

}  // namespace

BENCHMARK(fma_peak)->Unit(benchmark::kMillisecond);
BENCHMARK(gemm<dc::bf16>)->Apply(shapes)->Unit(benchmark::kMicrosecond);
BENCHMARK(gemm<float>)->Apply(shapes)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
