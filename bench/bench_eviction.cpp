// Eviction overhead on the CPU with the real SmolLM2-135M (fp32):
//  - decode step with attention statistics on vs off, at contexts 1k to 8k;
//  - one eviction (gather features + score + select + compact) at 25 % budget, per token of chunk,
//    with H2O and with the learned MLP policy, and the scoring alone;
//  - the decoder's own eviction at a 25 % budget (B + 16 slots back to B), per token, with the
//    wall time of each of its phases (gather, score, select, compact);
//  - decode step time at a 25 % budget (evicting every 16 tokens) vs the full cache at 8k.
//
//   build/bench/bench_eviction --benchmark_out=bench/results/eviction_cpu.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include <distillcache/distillcache.hpp>

#include "bench_support.hpp"

namespace {

// Arg 0: context; arg 1: statistics on (1) or off (0); arg 2: K/V stored as fp32 (0) or bf16 (1).
void decode_with_statistics(benchmark::State& state) {
  dc_bench::run_decode(state, dc_bench::smollm2_model(1), int(state.range(1)),
                       state.range(2) ? dc::DType::bf16 : dc::DType::f32);
}

// The learned policy, randomly initialised (its cost does not depend on the weights). Arg
// `shape`: 1-3 the shipped policy's six inputs (the paper's five and last_alpha) with the newest
// half of the budget kept: 1 two hidden layers of 32, SiLU (policy v2's shape), 2 hidden layers
// of 16 and 8, ReLU (v3's), 3 one of 16, ReLU; 4-5 v3's network with budget_age as a seventh
// input (learned recency): 4 no forced window (every row scored), 5 the newest quarter forced
// (those rows skipped); 6 v3's on H2O's score base (log of the accumulated mass added to the
// MLP's output: one more logarithm a row); 7 a linear correction of H2O's score base
// (policy/linear_correction.hpp) in the smallest network that carries it, one hidden layer of
// 2 ReLU units, newest half kept, policy v4's weights (train --search-rounds); 8 policy v5; 9
// policy v10; 10 policy v9 (v10 without its pins).
dc::MlpPolicy& learned_policy(long shape) {
  auto make = [](std::vector<int> hidden, dc::Activation activation, bool budget_age, float recent) {
    auto inputs = dc::paper_policy_inputs();
    inputs.push_back(dc::PolicyInput::last_alpha);
    if (budget_age) inputs.push_back(dc::PolicyInput::budget_age);
    auto p = dc::MlpPolicy::initialised(inputs, std::move(hidden), 1, activation);
    p.set_recent_fraction(recent);
    return p;
  };
  static dc::MlpPolicy v2 = make({32, 32}, dc::Activation::silu, false, 0.5f),
                       v3 = make({16, 8}, dc::Activation::relu, false, 0.5f),
                       one = make({16}, dc::Activation::relu, false, 0.5f),
                       age = make({16, 8}, dc::Activation::relu, true, 0.0f),
                       age_quarter = make({16, 8}, dc::Activation::relu, true, 0.25f),
                       on_h2o = [&] {
                         auto p = make({16, 8}, dc::Activation::relu, false, 0.5f);
                         p.set_score_base(dc::ScoreBase::h2o);
                         return p;
                       }(),
                       linear = [&] {
                         auto p = make({2}, dc::Activation::relu, false, 0.5f);
                         p.set_score_base(dc::ScoreBase::h2o);
                         // v4's weights (bench/results/policies/smollm2-v4-linear-search.dcpolicy):
                         // three inputs read, the other three never built.
                         const std::vector<float> w = {0.0f, 2.5f, 1.25f, 0.0f, 0.0f, 0.5f};
                         const auto params = dc::linear_correction_params(p.layout(), w);
                         std::copy(params.begin(), params.end(), p.params().begin());
                         return p;
                       }();
  // 8: the shipped policy v5 (policies/smollm2-135m-instruct.dcpolicy's rules and weights): the
  // linear correction of 7 with the newest-query reserve (0.45 of B) in layers 18-20 and 1.5x
  // the budget there (its evictions select with budgets per layer: select_for below).
  static dc::MlpPolicy v5 = [&] {
    auto p = make({2}, dc::Activation::relu, false, 0.5f);
    p.set_score_base(dc::ScoreBase::h2o);
    const std::vector<float> w = {0.0f, 0.375f, 1.0f, -0.5f, -0.5f, 0.25f};
    const auto params = dc::linear_correction_params(p.layout(), w);
    std::copy(params.begin(), params.end(), p.params().begin());
    p.set_newest_query_reserve(0.45);
    p.set_newest_query_reserve_layers(dc::parse_layer_list("18-20"));
    p.set_layer_budget_weights(dc::parse_layer_budget_weights("18-20=1.5", 30));
    return p;
  }();
  // 9: the shipped policy v10 (policies/smollm2-135m-instruct.dcpolicy's rules and weights): 3x
  // the budget in layers 18-20, the reserve there, TOVA's rule in layers 18 and 21 up to 37.5 %,
  // a reserve elsewhere at 50 % and pins guided by layers 20-22 (docs/design.md).
  static dc::MlpPolicy v10 = [&] {
    auto p = make({2}, dc::Activation::relu, false, 0.5f);
    p.set_score_base(dc::ScoreBase::h2o);
    const std::vector<float> w = {0.0f, 1.625f, 0.5f, 0.0f, 0.4375f, 0.0f};
    const auto params = dc::linear_correction_params(p.layout(), w);
    std::copy(params.begin(), params.end(), p.params().begin());
    p.set_layer_budget_weights(dc::parse_layer_budget_weights("18-20=3", 30));
    p.set_newest_query_reserve(0.45);
    p.set_newest_query_reserve_layers(dc::parse_layer_list("18-20"));
    p.set_newest_query_reserve_elsewhere(dc::parse_reserve_schedule("0.25:0,0.5:0.3"));
    p.set_newest_query_layers(dc::parse_layer_list("18,21"));
    p.set_newest_query_layers_up_to(0.375);
    p.set_newest_query_pins(dc::parse_layer_list("20-22"), dc::parse_reserve_schedule("0.25:0.2,0.5:0.1"));
    return p;
  }();
  static dc::MlpPolicy v9 = [&] {
    auto p = v10;
    p.set_newest_query_pins({}, {});
    return p;
  }();
  switch (shape) {
    case 1: return v2;
    case 2: return v3;
    case 3: return one;
    case 4: return age;
    case 5: return age_quarter;
    case 6: return on_h2o;
    case 8: return v5;
    case 9: return v10;
    case 10: return v9;
    default: return linear;
  }
}

dc::EvictionPolicy& chosen_policy(long arg, dc::H2OPolicy& h2o) {
  return arg ? static_cast<dc::EvictionPolicy&>(learned_policy(arg)) : h2o;
}

// The slots each layer keeps for `policy` at a budget of B rows per group: its budget weights
// allocated as the decoder allocates them (math/layer_budgets.hpp), no layer above `cap` slots;
// empty when every layer keeps B.
std::vector<int> policy_layer_budgets(const dc::EvictionPolicy& policy, int budget, int cap, int layers) {
  const auto weights = dc::layer_budget_weights_at_depth(policy.layer_budget_weights(), layers);
  if (weights.empty()) return {};
  const std::vector<char> evictable(std::size_t(layers), 1);
  return dc::allocate_layer_budgets(weights, evictable, budget, cap);
}

// The top-B keep-sets of f, or the top-B_l of every group of layer l where budgets (one per
// layer) are given.
dc::KeepSets select_for(std::span<const float> scores, const dc::TokenFeatures& f, int budget,
                        std::span<const int> budgets) {
  if (budgets.empty()) return dc::select_keep_groups(scores, f, budget);
  return dc::select_keep_groups(scores, f, budgets, 0, 0);
}

// The top-B keep-sets of f, with the policy's budgets per layer when it has them, capped at the
// `slots` each layer holds.
dc::KeepSets select_for(const dc::EvictionPolicy& policy, std::span<const float> scores, const dc::TokenFeatures& f,
                        int budget, int slots, int layers) {
  return select_for(scores, f, budget, policy_layer_budgets(policy, budget, slots, layers));
}

// One eviction of a context down to 25 %: features, scores, top-B, compaction. Arg 1: the
// granularity (0 shared, 1 layer, 2 head: one keep-set per (layer, KV head)); arg 2: the policy
// (0 H2O, 1-10 the learned MLP policy in the shapes of learned_policy).
void evict_once(benchmark::State& state) {
  const int context = int(state.range(0)), budget = context / 4;
  const auto granularity = dc::Granularity(state.range(1));
  auto& model = dc_bench::smollm2_model(1);
  auto full = model.make_cache(context);
  dc_bench::fill_cache(full, context);
  auto cache = model.make_cache(context);
  dc::H2OPolicy h2o;
  dc::EvictionPolicy& policy = chosen_policy(long(state.range(2)), h2o);
  std::vector<float> scores;
  for (auto _ : state) {
    state.PauseTiming();
    cache.copy_from(model.context(), full);
    state.ResumeTiming();
    const dc::TokenFeatures f = dc::gather_features(model.context(), cache, granularity);
    scores.assign(std::size_t(f.size), 0.0f);
    policy.score(f, budget, scores);
    dc::compact_groups(model.context(), cache, f,
                       select_for(policy, scores, f, budget, context, model.config().num_layers));
  }
  // Decode-mode eviction runs once per chunk (16) tokens: the amortised per-token cost.
  state.counters["per_token_us_chunk16"] =
      benchmark::Counter(double(state.iterations()) * 16, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// The eviction a decoder runs every `chunk` tokens at a 25 % budget: a cache of B + chunk slots
// back to B, at head granularity (features, scores, top-B, compaction), B = 2048 (25 % of 8k)
// and 512 (of 2k). Divided by the chunk it is the per-token cost to set against a decode step
// at the same length (decode_with_statistics). Arg 0: B; arg 1: the policy (0 H2O, 1-10 the
// learned MLP's shapes of learned_policy); arg 2: the chunk
// (examples/eval --chunk; by default B / 64, at least 16: 32 at B = 2048); arg 3: the cache's
// K/V storage (0 fp32, 1 bf16: half the bytes the compaction moves); arg 4: the context N the
// rows come from; arg 5: how they were chosen (with N > 0).
//   N = 0: the B + chunk rows are positions 0 to B + chunk - 1, so the budget is nearly the
//     whole context, and a policy whose rules follow the budget fraction (v9/v10's schedules)
//     runs those of a fraction near 1.
//   layout 0: an N-token cache compressed once, by H2O's accumulated mass alone with the newest
//     chunk kept, to B + chunk rows per KV head, positions spread over [0, N). The same rows for
//     every policy, but not what any decoder holds: H2O and the learned policy both keep the
//     newest half of their budget, of which these rows hold few (on SmolLM2 at B = 512 of 2048,
//     87 of 528 per group), and no budgets per layer.
//   layout 1: what a decoder running the measured policy holds when a decode-time eviction is
//     due (EvictingDecoder in decode mode at B / N): the first N - chunk tokens compressed by the
//     policy itself (its scores and its budgets per layer, fixed at that compression), then
//     `chunk` tokens appended (their K/V and statistics as fill_cache left them); the eviction
//     takes every layer back to its budget.
dc::KVCache<dc::cpu> decode_chunk_cache(dc::Transformer<dc::cpu, float>& model, dc::EvictionPolicy& policy,
                                        int budget, int chunk, int context, int layout, dc::DType kv_type,
                                        std::vector<int>& layer_budgets) {
  const int rows = budget + chunk, layers = model.config().num_layers;
  layer_budgets = policy_layer_budgets(policy, budget, rows, layers);
  if (context == 0) {
    auto cache = model.make_cache(rows, kv_type);
    dc_bench::fill_cache(cache, rows);
    return cache;
  }
  auto cache = model.make_cache(context, kv_type);
  dc_bench::fill_cache(cache, context);
  if (layout == 0) {
    const dc::TokenFeatures f = dc::gather_features(model.context(), cache, dc::Granularity::head);
    std::vector<float> scores(f.accumulated_mass);
    for (int r = 0; r < f.size; ++r)
      if (f.position[std::size_t(r)] > f.latest_position - chunk) scores[std::size_t(r)] = INFINITY;
    dc::compact_groups(model.context(), cache, f, dc::select_keep_groups(scores, f, rows));
    return cache;
  }
  const int prompt = context - chunk;
  DC_CHECK(prompt > budget, "evict_decode_chunk: a prompt of ", prompt, " tokens does not exceed B = ", budget);
  cache.truncate(prompt);
  layer_budgets = policy_layer_budgets(policy, budget, prompt, layers);
  const dc::TokenFeatures f = dc::gather_features(model.context(), cache, dc::Granularity::head);
  std::vector<float> scores(std::size_t(f.size), 0.0f);
  policy.score(f, budget, scores);
  dc::compact_groups(model.context(), cache, f, select_for(scores, f, budget, layer_budgets));
  cache.append(model.context(), chunk);
  return cache;
}

void evict_decode_chunk(benchmark::State& state) {
  const int budget = int(state.range(0)), chunk = int(state.range(2));
  const dc::DType kv_type = state.range(3) ? dc::DType::bf16 : dc::DType::f32;
  const int context = int(state.range(4)), layout = int(state.range(5));
  auto& model = dc_bench::smollm2_model(1);
  dc::H2OPolicy h2o;
  dc::EvictionPolicy& policy = chosen_policy(long(state.range(1)), h2o);
  std::vector<int> layer_budgets;
  const auto full = decode_chunk_cache(model, policy, budget, chunk, context, layout, kv_type, layer_budgets);
  auto cache = model.make_cache(std::span<const int>(full.capacities()), kv_type);
  std::vector<float> scores;
  // Wall time of each phase, summed over the iterations: which one an optimisation must target.
  double gather_s = 0, score_s = 0, select_s = 0, compact_s = 0;
  dc::TokenFeatures f;  // reused from eviction to eviction, as the decoder does
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  for (auto _ : state) {
    state.PauseTiming();
    cache.copy_from(model.context(), full);
    state.ResumeTiming();
    auto t = clock::now();
    dc::gather_features_into(f, model.context(), cache, dc::Granularity::head);
    gather_s += seconds_since(t);
    t = clock::now();
    scores.assign(std::size_t(f.size), 0.0f);
    policy.score(f, budget, scores);
    score_s += seconds_since(t);
    t = clock::now();
    const dc::KeepSets keep = select_for(scores, f, budget, layer_budgets);
    select_s += seconds_since(t);
    t = clock::now();
    dc::compact_groups(model.context(), cache, f, keep);
    compact_s += seconds_since(t);
  }
  state.counters["per_token_us"] = benchmark::Counter(double(state.iterations()) * chunk,
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  const double per_eviction_us = 1e6 / double(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["gather_us"] = gather_s * per_eviction_us;
  state.counters["score_us"] = score_s * per_eviction_us;
  state.counters["select_us"] = select_s * per_eviction_us;
  state.counters["compact_us"] = compact_s * per_eviction_us;
  state.counters["rows"] = f.size;  // rows scored per eviction, summed over the groups
}

// Scoring alone (the policy's share of an eviction) on the features of a filled cache at head
// granularity. Arg 0: context; arg 1: policy (0 H2O, 1-10 the learned MLP's shapes).
void score_only(benchmark::State& state) {
  const int context = int(state.range(0));
  auto& model = dc_bench::smollm2_model(1);
  auto cache = model.make_cache(context);
  dc_bench::fill_cache(cache, context);
  const dc::TokenFeatures f = dc::gather_features(model.context(), cache, dc::Granularity::head);
  dc::H2OPolicy h2o;
  dc::EvictionPolicy& policy = chosen_policy(long(state.range(1)), h2o);
  std::vector<float> scores(std::size_t(f.size));
  for (auto _ : state) {
    policy.score(f, context / 4, scores);
    benchmark::DoNotOptimize(scores.data());
  }
  state.counters["rows"] = double(f.size);
}

// Arg 0: 1 = evicting decoder at 25 % of 8k (B = 2032, the default chunk: 31), 0 = full cache
// at 8k. Arg 1: granularity of the evictions (0 shared, 2 head); the cache holds the same bytes
// either way.
void decode_budget_vs_full(benchmark::State& state) {
  const auto granularity = dc::Granularity(state.range(1));
  const int context = 8191 - 64;
  auto& model = dc_bench::smollm2_model(1);
  auto prefilled = model.make_cache(context);
  dc_bench::fill_cache(prefilled, context);
  std::vector<float> logits(std::size_t(model.config().vocab_size));
  dc::H2OPolicy policy;
  dc::FullCachePolicy full;
  dc::EvictionPolicy& chosen = state.range(0) ? static_cast<dc::EvictionPolicy&>(policy) : full;
  prefilled.set_observed_from(chosen.observation_start(context));
  const int steps = 64;
  for (auto _ : state) {
    state.PauseTiming();
    dc::EvictingDecoder<dc::cpu> dec(model, chosen, dc::Budget::of_fraction(0.25),
                                     dc::EvictionMode::decode, context, steps, granularity);
    dec.adopt_prefill(prefilled, logits);  // the prompt's compression is not timed
    state.ResumeTiming();
    for (int i = 0; i < steps; ++i) benchmark::DoNotOptimize(dec.step(3).data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(state.iterations()) * steps, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(decode_with_statistics)
    ->ArgsProduct({{1024, 2048, 4096, 8191}, {0, 1}, {0}})
    ->Args({2048, 1, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(evict_once)
    ->ArgsProduct({{1024, 2048, 4096, 8191}, {0, 1, 2}, {0, 1}})
    ->Args({8191, 2, 2})
    ->Args({8191, 2, 3})
    ->Args({8191, 2, 4})
    ->Args({8191, 2, 5})
    ->Args({8191, 2, 6})
    ->Args({8191, 2, 7})
    ->Args({8191, 2, 8})
    ->Args({8191, 2, 9})
    ->Args({8191, 2, 10})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(evict_decode_chunk)
    ->ArgsProduct({{512, 2048}, {0, 1, 2, 3}, {16}, {0}, {0}, {0}})
    ->ArgsProduct({{2048}, {0, 2, 4, 5, 6, 7, 8, 9, 10}, {16, 32}, {1}, {0}, {0}})
    ->ArgsProduct({{512, 2048}, {7, 8, 9, 10}, {16}, {0}, {0}, {0}})
    ->Args({2048, 0, 32, 0, 0, 0})
    ->Args({2048, 2, 32, 0, 0, 0})
    // As in a decode at 25 % (B = 512 of 2048, 2048 of 8192) and at 50 % (2048 of 4096), in the
    // rows H2O's mass alone keeps (layout 0) and in the measured policy's own (layout 1).
    ->ArgsProduct({{512}, {0, 8, 9, 10}, {16}, {0}, {2048}, {0, 1}})
    ->ArgsProduct({{2048}, {0, 8, 9, 10}, {32}, {0}, {4096, 8192}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(score_only)->ArgsProduct({{1024, 8191}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_budget_vs_full)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 2})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

BENCHMARK_MAIN();
