// Determinism on the CPU: the same seed gives the same generated text, the same eviction
// decisions and the same evaluation numbers, on every run and for every OpenMP thread count.
// (Logits alone: test_hf_parity; one evicting decode: test_eviction.)
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>

#include "../support/threads.hpp"

namespace {

using dc_test::with_threads;
const std::string kFixtures = DC_FIXTURE_DIR;

dc::Transformer<dc::cpu> tiny_llama() {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_llama_tied");
  return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 5);
}

std::vector<std::int32_t> prompt() {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(std::int32_t(3 + (37 * i) % 250));
  return ids;
}

struct Generation {
  std::vector<std::int32_t> tokens;                 // sampled continuation
  std::vector<std::vector<std::int32_t>> kept;      // the keep-set (positions) after every step
  bool operator==(const Generation&) const = default;
};

// Sampled generation (temperature 0.9, top-k 20) under a seeded random-eviction policy, which
// makes both the sampler and the eviction decisions depend on the seeds.
Generation generate(dc::Transformer<dc::cpu>& model, std::uint64_t seed) {
  dc::RandomPolicy policy(seed);
  dc::Budget budget = dc::Budget::of_fraction(0.5);
  budget.chunk = 3;
  dc::EvictingDecoder<dc::cpu> dec(model, policy, budget, dc::EvictionMode::decode, 24, 16);
  std::mt19937_64 rng(seed);
  const dc::SamplingOptions sampling{0.9f, 20};
  Generation g;
  auto logits = dec.prefill(prompt());
  for (int t = 0; t < 16; ++t) {
    const std::int32_t next = dc::sample_token(logits, sampling, rng);
    g.tokens.push_back(next);
    logits = dec.step(next);
    g.kept.push_back(dec.cache().host_positions(0));
  }
  return g;
}

}  // namespace

TEST_CASE("seeded generation with random eviction repeats across runs and thread counts") {
  auto model = tiny_llama();
  const Generation first = with_threads(1, [&] { return generate(model, 11); });
  CHECK(with_threads(1, [&] { return generate(model, 11); }) == first);
  CHECK(with_threads(2, [&] { return generate(model, 11); }) == first);
  CHECK(with_threads(3, [&] { return generate(model, 11); }) == first);
  // The seed matters (so the comparisons above can fail).
  CHECK_FALSE(with_threads(2, [&] { return generate(model, 12); }) == first);
}

TEST_CASE("fidelity evaluation numbers are bitwise identical across runs and thread counts") {
  auto model = tiny_llama();
  auto evaluate = [&] {
    dc::RandomPolicy random(5);
    dc::H2OPolicy h2o;
    dc::SnapKVPolicy snapkv(8, 3);
    dc::Budget quarter = dc::Budget::of_fraction(0.25), half = dc::Budget::of_fraction(0.5);
    quarter.chunk = half.chunk = 2;
    dc::FidelityEvaluator<dc::cpu, float> eval(model, {&random, &h2o, &snapkv}, {quarter, half},
                                               dc::EvictionMode::decode);
    const auto ids = prompt();
    eval.add_context(std::span(ids).first(16), std::span(ids).subspan(16), [](std::size_t) {});
    std::vector<double> numbers;
    for (const auto& t : eval.totals())
      numbers.insert(numbers.end(), {t.kl_sum, t.nll_full_sum, t.nll_evicted_sum,
                                     double(t.agreements), double(t.steps)});
    return numbers;
  };
  const auto first = with_threads(1, evaluate);
  CHECK(first.size() == 3 * 2 * 5);
  CHECK(first[0] > 0.0);  // the random policy at 25 % really diverges from the full cache
  CHECK(with_threads(1, evaluate) == first);
  CHECK(with_threads(2, evaluate) == first);
  CHECK(with_threads(3, evaluate) == first);
}
