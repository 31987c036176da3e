// The throughput issue's GPU benchmark at the paper's scale: Mistral-7B-v0.3's shape (32 layers,
// d 4096, 32 query / 8 KV heads of 128, ff 14336, vocabulary 32768) with random bf16 weights, a
// bf16 KV cache, decoding at a 32k context, S = 1 and 16 sequences per step:
//   full      every sequence attends over its whole 32k cache (no statistics, nothing evicted);
//   25%/once  the prompt compressed to 25 % once (H2O, one keep-set per (layer, KV head)), then
//             decoding with attention statistics on and no further eviction;
//   25%/evict the same, evicting back to the budget every chunk decoded tokens (the decoder's
//             decode mode, what a deployment runs; the default chunk, B / 64 = 128 at B = 8192,
//             so each sequence evicts once in the 128 timed steps).
//   evict_phases  one decode-time eviction of one sequence (8192 + 128 slots back to 8192), its
//             phases timed apart: gathering the features (the statistics copied to the host and
//             formed into columns), scoring, choosing the keep-sets, compacting the cache; then
//             the same eviction in place on the device (decode/in_place_eviction.cuh, what the decoder runs
//             for H2O, so the 25%/evict rows above include it, not the host path).
// Counters: tokens/s (all sequences), ms per step, achieved HBM bandwidth (the bf16 weights plus
// every sequence's K/V, read once per step, over the step's time) and its fraction of the GPU's
// peak (2 x memory clock x bus width), cached tokens per sequence, evictions while decoding (all
// sequences; the prompt's compression not counted); adopt_ms is the
// untimed setup per sequence (copying the 32k cache and compressing it). The eviction overhead per
// token is the difference of 25%/evict and 25%/once over S x steps (bench/gpu_long_summary.py).
//
// The second timed step of each decode benchmark (not the first: one-time setup) sits between
// cudaProfilerStart and cudaProfilerStop, so `ncu --profile-from-start off` measures the kernels of
// exactly one step (bench/gpu_check.sh's profile stage); evict_phases brackets its second
// in-place eviction the same way.
//
// The caches are filled with random K/V and statistics, not by a 32k-token prefill (minutes per
// sequence on this library's attention): decode cost depends on how long the cache is, not on how
// it was filled, and H2O's choice on random statistics costs what it costs on real ones. The
// weights are generated on the device (14.5 GB; on the host they would take minutes).
//
//   build/gpu/bench/bench_cuda_long --benchmark_out=long.json --benchmark_out_format=json
//
// Memory: the full cache at S = 16 needs about 93 GB (weights 14.5 GB, 17 caches of 32k bf16
// slots at 4.6 GB with their statistics); on an 80 GB GPU (an H100) that row reports an error
// naming the memory it needs and the rest runs. At 25 % each decoder gives back the slots its
// compression evicted (decode/evicting_decoder.hpp), about 42 GB at S = 16. Without a usable
// device it prints a skip line and exits 0.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include <distillcache/distillcache.cuh>

#include "cuda_device.cuh"

namespace {

constexpr int kContext = 32768;
constexpr int kSteps = 128;  // timed decode steps: one eviction per sequence at the default chunk
constexpr double kBudget = 0.25;

dc::ModelConfig mistral_config() {
  dc::ModelConfig c = dc::ModelConfig::mistral_7b_v0_3();
  c.max_position = kContext + kSteps;  // 32k cached, then the timed steps
  return c;
}

using dc_bench::fill_uniform;

// A matrix [rows, cols] uniform with variance 1/cols (or 1: embeddings), as N(0, 1/in) would be.
dc::Tensor<dc::bf16, dc::cuda> random_matrix(const dc::Context<dc::cuda>& ctx, std::int64_t rows, std::int64_t cols,
                                             bool unit_variance, std::uint64_t seed) {
  dc::Tensor<dc::bf16, dc::cuda> t(dc::Shape{rows, cols});
  const float a = std::sqrt(3.0f / (unit_variance ? 1.0f : float(cols)));
  fill_uniform(ctx, t.data(), t.numel(), -a, a, seed);
  return t;
}

dc::Tensor<float, dc::cuda> ones(const dc::Context<dc::cuda>& ctx, std::int64_t n) {
  dc::Tensor<float, dc::cuda> t(dc::Shape{n});
  fill_uniform(ctx, t.data(), n, 1.0f, 1.0f, 0);
  return t;
}

// The weights of a Llama/Mistral-shaped config (no Gemma norms), made on the device.
dc::Weights<dc::cuda, dc::bf16> random_device_weights(const dc::ModelConfig& c, const dc::Context<dc::cuda>& ctx) {
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  std::uint64_t seed = 1;
  dc::Weights<dc::cuda, dc::bf16> w;
  w.embed = random_matrix(ctx, c.vocab_size, d, true, seed++);
  for (int l = 0; l < c.num_layers; ++l) {
    dc::LayerWeights<dc::cuda, dc::bf16> L;
    L.attn_norm = ones(ctx, d);
    L.wq = random_matrix(ctx, c.q_dim(), d, false, seed++);
    L.wk = random_matrix(ctx, c.kv_dim(), d, false, seed++);
    L.wv = random_matrix(ctx, c.kv_dim(), d, false, seed++);
    L.wo = random_matrix(ctx, d, c.q_dim(), false, seed++);
    L.ffn_norm = ones(ctx, d);
    L.w_gate = random_matrix(ctx, ff, d, false, seed++);
    L.w_up = random_matrix(ctx, ff, d, false, seed++);
    L.w_down = random_matrix(ctx, d, ff, false, seed++);
    w.layers.push_back(std::move(L));
  }
  w.final_norm = ones(ctx, d);
  w.lm_head = random_matrix(ctx, c.vocab_size, d, false, seed++);
  dc::synchronize(ctx);
  return w;
}

// Bytes one decode step reads of the weights: every bf16 matrix once (of the embedding only one
// row per sequence: left out) and the fp32 norms.
double weight_bytes(const dc::ModelConfig& c) {
  const double d = c.hidden_size, ff = c.intermediate_size;
  const double matrices = c.num_layers * (2 * d * c.q_dim() + 2 * d * c.kv_dim() + 3 * d * ff) + c.vocab_size * d;
  const double norms = (2.0 * c.num_layers + 1) * d;
  return 2.0 * matrices + 4.0 * norms;
}

// Bytes of K and V one decode step reads for a cache holding `slots` per (layer, KV head).
double kv_bytes(const dc::ModelConfig& c, double slots) {
  return 2.0 * c.num_layers * c.num_kv_heads * slots * c.head_dim * sizeof(dc::bf16);
}

using Model = dc::Transformer<dc::cuda, dc::bf16>;

// The model and the 32k cache every sequence starts from (random K/V and statistics, observed
// from position 0 as H2O's prompt compression needs), built on first use and owned by main so
// they are released before the CUDA runtime shuts down.
struct Setup {
  std::unique_ptr<Model> model;
  std::unique_ptr<dc::KVCache<dc::cuda>> prompt;
  std::vector<float> prompt_logits;

  void build() {
    if (model) return;
    const dc::ModelConfig cfg = mistral_config();
    {
      dc::Context<dc::cuda> ctx;
      model = std::make_unique<Model>(cfg, random_device_weights(cfg, ctx), 16);
    }
    model->set_kv_type(dc::DType::bf16);
    auto& ctx = model->context();
    prompt = std::make_unique<dc::KVCache<dc::cuda>>(model->make_cache(kContext));
    dc::H2OPolicy h2o;
    prompt->set_observed_from(h2o.observation_start(kContext));
    prompt->collect_queries(h2o.query_statistics(), cfg.rope_theta);
    prompt->append(ctx, kContext);
    const std::int64_t kv = std::int64_t(cfg.num_kv_heads) * kContext * cfg.head_dim;
    const std::int64_t stats = std::int64_t(cfg.num_kv_heads) * prompt->stat_rows() * kContext;
    for (int l = 0; l < cfg.num_layers; ++l) {
      fill_uniform(ctx, prompt->keys_as<dc::bf16>(l), kv, -0.5f, 0.5f, 1000 + 3 * std::uint64_t(l));
      fill_uniform(ctx, prompt->values_as<dc::bf16>(l), kv, -0.5f, 0.5f, 1001 + 3 * std::uint64_t(l));
      fill_uniform(ctx, prompt->stats(l), stats, 0.0f, 1.0f, 1002 + 3 * std::uint64_t(l));
    }
    dc::synchronize(ctx);
    prompt_logits.assign(std::size_t(cfg.vocab_size), 0.0f);
  }
};

// The tokens of every timed step, [kSteps][sequences] (made before the timing starts).
std::vector<std::vector<std::int32_t>> step_tokens(int sequences, int vocab) {
  std::vector<std::vector<std::int32_t>> steps(kSteps, std::vector<std::int32_t>(static_cast<std::size_t>(sequences)));
  for (int step = 0; step < kSteps; ++step)
    for (int s = 0; s < sequences; ++s)
      steps[std::size_t(step)][std::size_t(s)] = std::int32_t((7919 * (step + 1) + 104729 * s) % vocab);
  return steps;
}

// Brackets the second timed step for a profiler started with --profile-from-start off.
void profile_step(int step, bool before) {
  if (step != 1) return;
  DC_CUDA_CHECK(before ? cudaProfilerStart() : cudaProfilerStop());
}

void report(benchmark::State& state, const dc::ModelConfig& cfg, int sequences, double mean_slots) {
  const double steps = double(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(steps * sequences, benchmark::Counter::kIsRate);
  state.counters["steps/s"] = benchmark::Counter(steps, benchmark::Counter::kIsRate);
  const double bytes = weight_bytes(cfg) + sequences * kv_bytes(cfg, mean_slots);
  state.counters["HBM_bytes/s"] = benchmark::Counter(bytes * steps, benchmark::Counter::kIsRate);
  state.counters["peak_HBM_bytes/s"] = dc_bench::peak_bandwidth();
  state.counters["cached_tokens"] = mean_slots;
  state.counters["sequences"] = sequences;
}

// Full cache: S copies of the 32k cache, statistics off, one forward_batch per step.
void decode_full(benchmark::State& state, Setup& setup) {
  try {
    setup.build();
    Model& model = *setup.model;
    const auto& cfg = model.config();
    const int sequences = int(state.range(0));
    // S whole 32k caches: 74 GB at S = 16, more than an 80 GB GPU has left beside the weights.
    // Said plainly, not as an allocation failure part-way.
    const double needed = double(sequences) * (kContext + kSteps) * cfg.num_layers *
                          double(setup.prompt->bytes_per_slot_layer());
    const double free = dc_bench::free_device_bytes();
    if (needed > 0.97 * free) {
      state.SkipWithError(("the full cache at S = " + std::to_string(sequences) + " needs " +
                           std::to_string(int(needed / 1e9)) + " GB of GPU memory, " + std::to_string(int(free / 1e9)) +
                           " GB free (an H200 runs it)")
                              .c_str());
      return;
    }
    std::vector<dc::KVCache<dc::cuda>> caches;
    caches.reserve(std::size_t(sequences));
    std::vector<dc::KVCache<dc::cuda>*> batch;
    for (int s = 0; s < sequences; ++s) {
      caches.push_back(model.make_cache(kContext + kSteps));
      caches.back().copy_from(model.context(), *setup.prompt);
      caches.back().disable_statistics();
      batch.push_back(&caches.back());
    }
    std::vector<float> logits(std::size_t(sequences) * cfg.vocab_size);
    const auto tokens = step_tokens(sequences, cfg.vocab_size);
    int step = 0;
    for (auto _ : state) {
      profile_step(step, true);
      model.forward_batch(tokens[std::size_t(step)], batch, logits);
      profile_step(step++, false);
    }
    report(state, cfg, sequences, kContext + (step + 1) / 2.0);  // step i attends over 32768 + i + 1
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// 25 %: S decoders adopt the 32k cache and compress it with H2O; mode decode evicts every 16.
void decode_budget(benchmark::State& state, Setup& setup) {
  try {
    setup.build();
    Model& model = *setup.model;
    const auto& cfg = model.config();
    const int sequences = int(state.range(0));
    const auto mode = state.range(1) ? dc::EvictionMode::decode : dc::EvictionMode::prefill;
    std::vector<std::unique_ptr<dc::H2OPolicy>> policies;
    std::vector<std::unique_ptr<dc::EvictingDecoder<dc::cuda, dc::bf16>>> decoders;
    std::vector<dc::EvictingDecoder<dc::cuda, dc::bf16>*> batch;
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < sequences; ++s) {
      policies.push_back(std::make_unique<dc::H2OPolicy>());
      decoders.push_back(std::make_unique<dc::EvictingDecoder<dc::cuda, dc::bf16>>(
          model, *policies.back(), dc::Budget::of_fraction(kBudget), mode, kContext, kSteps,
          dc::Granularity::head));
      decoders.back()->adopt_prefill(*setup.prompt, setup.prompt_logits);
      batch.push_back(decoders.back().get());
    }
    dc::synchronize(model.context());
    const double adopt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    dc::DecoderBatch<dc::cuda, dc::bf16> stepper;
    const auto tokens = step_tokens(sequences, cfg.vocab_size);
    int step = 0;
    double slots = 0.0;
    for (auto _ : state) {
      profile_step(step, true);
      stepper.step(batch, tokens[std::size_t(step)]);
      profile_step(step++, false);
      slots += decoders[0]->cache().length();
    }
    int evictions = 0;  // during decoding: the prompt's compression is not one of them
    for (const auto& d : decoders) evictions += d->evictions() - 1;
    report(state, cfg, sequences, slots / std::max(1, step));
    state.counters["evictions"] = evictions;
    state.counters["chunk"] = decoders[0]->chunk_tokens();
    state.counters["adopt_ms"] = 1e3 * adopt_s / sequences;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// One decode-time eviction of one sequence (B + chunk slots back to B), phase by phase, as
// EvictingDecoder::evict runs it: every iteration starts from the same cache (the prompt
// compressed to B + chunk by the same steps, untimed) and times the four phases apart.
void evict_phases(benchmark::State& state, Setup& setup) {
  try {
    setup.build();
    Model& model = *setup.model;
    auto& ctx = model.context();
    dc::H2OPolicy h2o;
    const dc::Budget budget = dc::Budget::of_fraction(kBudget);
    const int b = budget.resolve(kContext);
    const int chunk = budget.chunk_for(b);
    const dc::Granularity granularity = h2o.granularity_for(dc::Granularity::head);
    dc::TokenFeatures f;
    std::vector<float> scores;
    using Clock = std::chrono::steady_clock;
    auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
    double phase_ms[4] = {};  // gather, score, select, compact
    auto evict_to = [&](dc::KVCache<dc::cuda>& cache, int keep) {
      auto t = Clock::now();
      dc::gather_features_into(f, ctx, cache, granularity);
      phase_ms[0] += ms_since(t);
      t = Clock::now();
      scores.assign(std::size_t(f.size), 0.0f);
      h2o.score(f, keep, scores);
      phase_ms[1] += ms_since(t);
      t = Clock::now();
      const dc::KeepSets sets = dc::select_keep_groups(scores, f, keep, budget.sink, budget.recent);
      phase_ms[2] += ms_since(t);
      t = Clock::now();
      dc::compact_groups(ctx, cache, f, sets);
      dc::synchronize(ctx);
      phase_ms[3] += ms_since(t);
    };
    auto before = model.make_cache(kContext);  // the cache as a decode-time eviction finds it
    before.copy_from(ctx, *setup.prompt);
    evict_to(before, b + chunk);
    std::fill(std::begin(phase_ms), std::end(phase_ms), 0.0);
    auto work = model.make_cache(kContext);
    // The same eviction in place (decode/in_place_eviction.cuh: what the decoder runs for H2O), timed alone.
    const std::optional<dc::ScoreRule> rule = h2o.score_rule(b);
    dc::InPlaceEvictionScratch<dc::cuda> scratch;
    double in_place_ms = 0.0;
    int iteration = 0;
    for (auto _ : state) {
      state.PauseTiming();
      work.copy_from(ctx, before);
      dc::synchronize(ctx);
      state.ResumeTiming();
      evict_to(work, b);
      state.PauseTiming();
      work.copy_from(ctx, before);
      dc::synchronize(ctx);
      state.ResumeTiming();
      const auto t = Clock::now();
      profile_step(iteration, true);  // the second in-place eviction, for ncu
      if (!rule || !dc::evict_in_place(ctx, work, *rule, b, scratch)) throw std::runtime_error("in-place eviction declined");
      dc::synchronize(ctx);
      profile_step(iteration++, false);
      in_place_ms += ms_since(t);
    }
    const double n = double(std::max<benchmark::IterationCount>(1, state.iterations()));
    const char* names[4] = {"gather_ms", "score_ms", "select_ms", "compact_ms"};
    for (int i = 0; i < 4; ++i) state.counters[names[i]] = phase_ms[i] / n;
    state.counters["in_place_ms"] = in_place_ms / n;
    state.counters["in_place_per_token_us"] = 1e3 * in_place_ms / n / chunk;
    state.counters["slots_before"] = b + chunk;
    state.counters["slots_after"] = work.length();
    state.counters["chunk"] = chunk;
    state.counters["per_token_us"] = 1e3 * (phase_ms[0] + phase_ms[1] + phase_ms[2] + phase_ms[3]) / n / chunk;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!dc_bench::usable_cuda_device()) return 0;
  Setup setup;
  auto fixed = [](benchmark::internal::Benchmark* b) {
    b->Iterations(kSteps)->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  for (const int sequences : {1, 16}) {
    fixed(benchmark::RegisterBenchmark("mistral7b_32k/full", [&setup](benchmark::State& st) { decode_full(st, setup); })
              ->Args({sequences})
              ->ArgNames({"S"}));
    for (const int evicting : {0, 1})
      fixed(benchmark::RegisterBenchmark(evicting ? "mistral7b_32k/25%/evict" : "mistral7b_32k/25%/once",
                                         [&setup](benchmark::State& st) { decode_budget(st, setup); })
                ->Args({sequences, evicting})
                ->ArgNames({"S", "evicting"}));
  }
  benchmark::RegisterBenchmark("mistral7b_32k/evict_phases/S:1", [&setup](benchmark::State& st) { evict_phases(st, setup); })
      ->Iterations(4)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
