// Budgets per layer: the allocation rule (math/layer_budgets.hpp) against hand-worked cases and
// its invariants on random weights, per-layer selection, the decoder keeping each layer at its
// budget, the learned policy's weights through a checkpoint, and the single-layer sensitivity
// against decoding each student alone.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <random>

#include <distillcache/distillcache.hpp>

#include "../support/temp_dir.hpp"

namespace {

std::vector<int> allocate(std::vector<double> w, int budget, int cap, int floor = 1,
                          std::vector<char> evictable = {}) {
  if (evictable.empty()) evictable.assign(w.size(), 1);
  return dc::allocate_layer_budgets(w, evictable, budget, cap, floor);
}

}  // namespace

TEST_CASE("layer budgets: hand-worked cases") {
  CHECK(allocate({1, 1, 1, 1}, 8, 16) == std::vector<int>{8, 8, 8, 8});
  CHECK(allocate({0.3, 0.3, 0.3}, 5, 16) == std::vector<int>{5, 5, 5});  // equal weights: exactly the budget
  CHECK(allocate({3, 1}, 8, 16) == std::vector<int>{12, 4});
  // Layer 0 would get 30 of 30 but holds 12: it keeps 12 and the other two share 18.
  CHECK(allocate({1e9, 1, 1}, 10, 12) == std::vector<int>{12, 9, 9});
  // The floor: layers 1 and 2 would get almost nothing; they keep 2 each, layer 0 the rest.
  CHECK(allocate({1e6, 1, 1}, 10, 40, 2) == std::vector<int>{26, 2, 2});
  // Largest remainder: 10 slots as 1:1:1 -> 3.33 each; the first layer gets the extra one.
  CHECK(allocate({1, 1, 1}, 3, 16)[0] == 3);
  CHECK(allocate({2, 1, 1}, 3, 16) == std::vector<int>{5, 2, 2});  // 4.5, 2.25, 2.25 -> 4+1, 2, 2
  // Layers that are not evictable take nothing and give nothing.
  CHECK(allocate({5, 1, 1}, 6, 16, 1, {0, 1, 1}) == std::vector<int>{0, 6, 6});
}

TEST_CASE("layer budgets: every allocation adds up, respects cap and floor, and follows the weights") {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> weight(0.0, 1.5);
  for (int trial = 0; trial < 500; ++trial) {
    const int layers = 1 + int(rng() % 12), cap = 1 + int(rng() % 300);
    const int budget = 1 + int(rng() % std::uint32_t(cap)), floor = int(rng() % 4);
    std::vector<double> w(static_cast<std::size_t>(layers));
    for (auto& x : w) x = weight(rng);
    const auto b = allocate(w, budget, cap, floor);
    CAPTURE(trial);
    CHECK(std::accumulate(b.begin(), b.end(), 0LL) == std::int64_t(budget) * layers);
    for (int l = 0; l < layers; ++l) {
      CHECK(b[std::size_t(l)] <= cap);
      CHECK(b[std::size_t(l)] >= std::min(floor, budget));
    }
    // Between two layers that neither bound fixed, the one with the larger weight never keeps
    // fewer slots (ties and rounding aside: at most one slot apart the wrong way).
    for (int i = 0; i < layers; ++i)
      for (int j = 0; j < layers; ++j) {
        const int bi = b[std::size_t(i)], bj = b[std::size_t(j)];
        if (w[std::size_t(i)] > w[std::size_t(j)]) CHECK(bi >= bj - 1);
      }
  }
}

TEST_CASE("layer budgets: bad weights and budgets are named") {
  CHECK_THROWS_WITH_AS(allocate({1, 0}, 4, 8), doctest::Contains("weight of layer 1"), dc::Error);
  CHECK_THROWS_WITH_AS(allocate({NAN, 1}, 4, 8), doctest::Contains("positive and finite"), dc::Error);
  CHECK_THROWS_WITH_AS(allocate({-1, 1}, 4, 8), doctest::Contains("weight of layer 0"), dc::Error);
  CHECK_THROWS_WITH_AS(allocate({1, 1}, 9, 8), doctest::Contains("exceeds"), dc::Error);
  const std::vector<double> w{1, 1};
  const std::vector<char> three{1, 1, 1};
  CHECK_THROWS_WITH_AS(dc::allocate_layer_budgets(w, three, 4, 8), doctest::Contains("2 weights for 3 layers"),
                       dc::Error);
}

namespace {

struct TinyModel {
  dc::HfModel m = dc::load_hf_model(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied");
  dc::Transformer<dc::cpu> model{m.config, std::move(m.weights), 8};
  std::vector<std::int32_t> ids =
      dc::SafetensorsFile(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied/oracle.safetensors").read_i32("tokens");
};

std::unique_ptr<dc::EvictionPolicy> h2o_with(std::vector<double> weights) {
  return std::make_unique<dc::LayerBudgetedPolicy>(dc::make_baseline_policy("h2o"), std::move(weights), "h2o+layers");
}

}  // namespace

TEST_CASE("per-layer selection: uniform budgets equal the single-budget selection; shared sets need one budget") {
  TinyModel t;
  auto cache = t.model.make_cache(32);
  cache.set_observed_from(0);
  t.model.forward(std::span(t.ids).first(20), cache);
  for (const auto g : {dc::Granularity::layer, dc::Granularity::head, dc::Granularity::shared}) {
    const auto f = dc::gather_features(t.model.context(), cache, g);
    std::vector<float> scores(f.accumulated_mass.begin(), f.accumulated_mass.end());
    const std::vector<int> same{7, 7};
    CHECK(dc::select_keep_groups(scores, f, same) == dc::select_keep_groups(scores, f, 7));
    const std::vector<int> uneven{5, 9};
    if (g == dc::Granularity::shared) {
      CHECK_THROWS_WITH_AS(dc::select_keep_groups(scores, f, uneven), doctest::Contains("layer or head granularity"),
                           dc::Error);
    } else {
      const auto keep = dc::select_keep_groups(scores, f, uneven);
      for (int i = 0; i < f.num_groups(); ++i)
        CHECK(int(keep[std::size_t(i)].size()) == uneven[std::size_t(f.groups[std::size_t(i)].layer_begin)]);
    }
  }
}

TEST_CASE("a decoder keeps each layer at its budget; equal weights change nothing") {
  TinyModel t;
  const auto prompt = std::span<const std::int32_t>(t.ids).first(16);
  dc::Budget budget = dc::Budget::of_fraction(0.5);  // 8 of 16
  budget.chunk = 2;
  auto plain = dc::make_baseline_policy("h2o");
  auto equal = h2o_with({2.0, 2.0});
  auto uneven = h2o_with({3.0, 1.0});  // 12 and 4
  for (const auto mode : {dc::EvictionMode::prefill, dc::EvictionMode::decode}) {
    dc::EvictingDecoder<dc::cpu> a(t.model, *plain, budget, mode, 16, 8, dc::Granularity::head);
    dc::EvictingDecoder<dc::cpu> b(t.model, *equal, budget, mode, 16, 8, dc::Granularity::head);
    dc::EvictingDecoder<dc::cpu> c(t.model, *uneven, budget, mode, 16, 8, dc::Granularity::head);
    a.prefill(prompt);
    b.prefill(prompt);
    c.prefill(prompt);
    CHECK(c.layer_budgets() == std::vector<int>{12, 4});
    CHECK(c.cache().length(0) == 12);
    CHECK(c.cache().length(1) == 4);
    CHECK(c.cache().bytes_used() == a.cache().bytes_used());  // the same bytes, shared differently
    for (int s = 16; s < 24; ++s) {
      const auto x = a.step(t.ids[std::size_t(s)]);
      const std::vector<float> xa(x.begin(), x.end());
      const auto y = b.step(t.ids[std::size_t(s)]);
      CHECK(std::equal(xa.begin(), xa.end(), y.begin()));  // bitwise
      c.step(t.ids[std::size_t(s)]);
      if (mode == dc::EvictionMode::decode) {
        CHECK(c.cache().length(0) < 12 + budget.chunk);
        CHECK(c.cache().length(1) - c.cache().length(0) == 4 - 12);  // both layers grow together
      }
    }
    if (mode == dc::EvictionMode::decode) CHECK(c.evictions() > 1);
  }
  // A shared keep-set has one budget for every layer: the weights do not apply.
  dc::EvictingDecoder<dc::cpu> shared(t.model, *uneven, budget, dc::EvictionMode::prefill, 16, 8,
                                      dc::Granularity::shared);
  shared.prefill(prompt);
  CHECK(shared.layer_budgets().empty());
  CHECK(shared.cache().length(0) == 8);
  // Both decoders step through the same tokens with the same logits, bit for bit.
  auto same_logits = [&](dc::EvictingDecoder<dc::cpu>& a, dc::EvictingDecoder<dc::cpu>& b) {
    for (int s = 16; s < 24; ++s) {
      const auto x = a.step(t.ids[std::size_t(s)]);
      const std::vector<float> xd(x.begin(), x.end());
      const auto y = b.step(t.ids[std::size_t(s)]);
      CHECK(std::equal(xd.begin(), xd.end(), y.begin()));
    }
  };
  // Weights written for a 3-layer model apply by relative depth: of 3 layers the 2-layer model's
  // first takes the first and its last the last (math/layer_depth.hpp), so {3, 2, 1} keeps what
  // {3, 1} keeps, bit for bit.
  auto three = h2o_with({3.0, 2.0, 1.0});
  auto mapped = h2o_with({3.0, 1.0});
  dc::EvictingDecoder<dc::cpu> deeper(t.model, *three, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  dc::EvictingDecoder<dc::cpu> same(t.model, *mapped, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  deeper.prefill(prompt);
  same.prefill(prompt);
  CHECK(deeper.layer_budgets() == std::vector<int>{12, 4});
  same_logits(deeper, same);
  // Unless the policy leaves its rules per layer out on other models: then every layer keeps the
  // budget, as without weights. A learned policy that is H2O (a zero linear correction on H2O's
  // score), with and without weights for 3 layers.
  const dc::MlpLayout layout(1, {2}, dc::Activation::relu);
  dc::MlpPolicy learned({dc::PolicyInput::alpha}, layout, dc::linear_correction_params(layout, std::vector<float>{0.0f}), 0);
  learned.set_score_base(dc::ScoreBase::h2o);
  dc::MlpPolicy dropping = learned;
  dropping.set_layer_budget_weights({3.0, 2.0, 1.0});
  dropping.set_map_layer_rules(false);
  dc::MlpPolicy mapping = dropping;
  mapping.set_map_layer_rules(true);
  dc::EvictingDecoder<dc::cpu> dropped(t.model, dropping, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  dc::EvictingDecoder<dc::cpu> unweighted(t.model, learned, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  dc::EvictingDecoder<dc::cpu> mapped_too(t.model, mapping, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  dropped.prefill(prompt);
  unweighted.prefill(prompt);
  mapped_too.prefill(prompt);
  CHECK(dropped.layer_budgets().empty());
  CHECK(mapped_too.layer_budgets() == std::vector<int>{12, 4});
  same_logits(dropped, unweighted);
  CHECK(dropped.cache().length(0) == unweighted.cache().length(0));
}

// The nearest source layer by brute force: the one whose centre ((s + 0.5) / S of the depth) is
// closest to layer l's ((l + 0.5) / L), ties to the deeper; the oracle of the closed form.
int nearest_by_search(int l, int layers, int source_layers) {
  int best = 0;
  double best_distance = INFINITY;
  for (int s = 0; s < source_layers; ++s) {
    const double distance = std::abs((s + 0.5) / source_layers - (l + 0.5) / layers);
    if (distance <= best_distance + 1e-12) {
      best = s;
      best_distance = std::min(best_distance, distance);
    }
  }
  return best;
}

TEST_CASE("a decoder reserves each layer what its own budget can reach, with the logits of evicting in one full reservation") {
  TinyModel t;
  const int prompt = 16, new_tokens = 8;
  const auto tokens = std::span<const std::int32_t>(t.ids);
  REQUIRE(tokens.size() >= std::size_t(prompt + new_tokens));
  dc::Budget budget = dc::Budget::of_fraction(0.5);  // 8 of 16
  budget.chunk = 2;
  auto uneven = h2o_with({3.0, 1.0});  // 12 and 4
  const std::vector<int> layer_budgets{12, 4};
  for (const auto mode : {dc::EvictionMode::prefill, dc::EvictionMode::decode}) {
    CAPTURE(int(mode));
    dc::EvictingDecoder<dc::cpu> dec(t.model, *uneven, budget, mode, prompt, new_tokens, dc::Granularity::head);
    CHECK(dec.cache().capacities() == std::vector<int>{prompt + new_tokens, prompt + new_tokens});
    const auto first = dec.prefill(tokens.first(std::size_t(prompt)));
    const std::vector<float> prefill_logits(first.begin(), first.end());
    // Each layer: its budget plus every token still allowed (one capacity for both would be 20).
    CHECK(dec.cache().capacities() == std::vector<int>{12 + new_tokens, 4 + new_tokens});
    CHECK(dec.cache().bytes_reserved() == std::size_t(12 + 4 + 2 * new_tokens) * dec.cache().bytes_per_slot_layer());

    // The oracle: the same steps by hand in a cache that keeps its whole reservation.
    dc::KVCache<dc::cpu> cache = t.model.make_cache(prompt + new_tokens);
    cache.set_observed_from(uneven->observation_start(prompt));
    cache.collect_queries(uneven->query_statistics(), t.m.config.rope_theta);
    std::vector<float> logits(std::size_t(t.m.config.vocab_size));
    t.model.forward(tokens.first(std::size_t(prompt)), cache, std::span<float>(logits));
    cache.set_observed_from(0);
    dc::TokenFeatures f;
    const auto evict = [&] {
      dc::gather_features_into(f, t.model.context(), cache, dc::Granularity::head);
      std::vector<float> scores(std::size_t(f.size));
      uneven->score(f, budget.resolve(prompt), scores);
      dc::compact_groups(t.model.context(), cache, f,
                         dc::select_keep_groups(scores, f, std::span<const int>(layer_budgets)));
    };
    evict();
    CHECK(logits == prefill_logits);  // bitwise
    for (int s = prompt; s < prompt + new_tokens; ++s) {
      CAPTURE(s);
      t.model.forward(tokens.subspan(std::size_t(s), 1), cache, std::span<float>(logits));
      if (mode == dc::EvictionMode::decode && cache.evictable_length() >= 12 + budget.chunk) evict();
      const auto step = dec.step(tokens[std::size_t(s)]);
      CHECK(std::equal(logits.begin(), logits.end(), step.begin(), step.end()));
      for (int l = 0; l < 2; ++l) CHECK(dec.cache().length(l) == cache.length(l));
    }
    if (mode == dc::EvictionMode::prefill) {  // both layers are full: the error names the first
      CHECK(dec.cache().free_slots() == 0);
      CHECK_THROWS_WITH_AS(dec.step(tokens[0]),
                           doctest::Contains("past max_new_tokens: the cache is full at 20 slots in layer 0"),
                           dc::Error);
    } else {
      CHECK(dec.evictions() > 1);
    }
  }
}

TEST_CASE("layers at the same relative depth: the nearest centre, as a search over all layers finds it") {
  for (int layers = 1; layers <= 40; ++layers)
    for (int source = 1; source <= 40; ++source) {
      int previous = 0;
      for (int l = 0; l < layers; ++l) {
        CAPTURE(layers);
        CAPTURE(source);
        CAPTURE(l);
        const int s = dc::math::layer_at_same_depth(l, layers, source);
        CHECK(s == nearest_by_search(l, layers, source));
        CHECK(s >= previous);  // deeper layers map no shallower
        previous = s;
        if (layers == source) CHECK(s == l);
      }
    }
  // The first and last layers map to the first and last wherever the target is not deeper
  // than the source's half (SmolLM2's 30 layers onto Gemma 3's 18: 0 -> 0, 17 -> 29).
  CHECK(dc::math::layer_at_same_depth(0, 18, 30) == 0);
  CHECK(dc::math::layer_at_same_depth(17, 18, 30) == 29);
  CHECK_THROWS_WITH_AS(dc::math::layer_at_same_depth(18, 18, 30), doctest::Contains("layer 18 of a model of 18"),
                       dc::Error);
  CHECK_THROWS_WITH_AS(dc::math::layer_at_same_depth(0, 0, 30), doctest::Contains("must be positive"), dc::Error);
}

TEST_CASE("budget weights and layer lists carried to a model of another depth") {
  const std::vector<double> weights{0.5, 1.0, 1.5, 2.0, 2.5};
  CHECK(dc::layer_budget_weights_at_depth(weights, 5) == weights);
  CHECK(dc::layer_budget_weights_at_depth({}, 7).empty());
  for (int layers : {1, 2, 3, 8, 13}) {
    const auto mapped = dc::layer_budget_weights_at_depth(weights, layers);
    REQUIRE(mapped.size() == std::size_t(layers));
    for (int l = 0; l < layers; ++l)
      CHECK(mapped[std::size_t(l)] == weights[std::size_t(nearest_by_search(l, layers, 5))]);
  }
  // SmolLM2's retrieval layers 18-20 (of 30) on an 18-layer model: layer l is listed iff its
  // nearest source layer is.
  const std::vector<int> retrieval{18, 19, 20};
  const auto on_gemma = dc::layer_list_at_depth(retrieval, 30, 18);
  for (int l = 0; l < 18; ++l) {
    const int s = nearest_by_search(l, 18, 30);
    CHECK((std::find(on_gemma.begin(), on_gemma.end(), l) != on_gemma.end()) == (s >= 18 && s <= 20));
  }
  CHECK(!on_gemma.empty());
  CHECK(std::is_sorted(on_gemma.begin(), on_gemma.end()));
  CHECK(dc::layer_list_at_depth(retrieval, 30, 30) == retrieval);
  // A shallower model can miss a listed layer altogether: of 4 layers, layer 0 is nobody's
  // nearest on 2 (their centres map to 1 and 3).
  CHECK(dc::layer_list_at_depth(std::vector<int>{0}, 4, 2).empty());
  CHECK(dc::layer_list_at_depth(std::vector<int>{2, 3}, 4, 2) == std::vector<int>{1});
}

TEST_CASE("the learned policy keeps its layer weights in the checkpoint and rejects bad ones") {
  dc_test::TempDir dir("dc_layer_weights");
  auto p = dc::MlpPolicy::initialised({dc::PolicyInput::alpha, dc::PolicyInput::position}, {4}, 3);
  CHECK(p.layer_budget_weights().empty());
  p.set_layer_budget_weights({0.5, 1.5});
  dc::save_policy_checkpoint(dir / "p.dcpolicy", p.to_checkpoint());
  const auto q = dc::MlpPolicy::from_checkpoint(dc::load_policy_checkpoint(dir / "p.dcpolicy"));
  REQUIRE(q.layer_budget_weights().size() == 2);
  CHECK(q.layer_budget_weights()[0] == 0.5);
  CHECK(q.layer_budget_weights()[1] == 1.5);
  CHECK_THROWS_WITH_AS(p.set_layer_budget_weights({1.0, 0.0}), doctest::Contains("budget weight of layer 1"),
                       dc::Error);
  auto c = p.to_checkpoint();
  c.extra["layer_budget_weights"] = {1.0, "two"};
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(c), doctest::Contains("non-number"), dc::Error);
  c.extra["layer_budget_weights"] = {1.0, -2.0};
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(c), doctest::Contains("positive and finite"), dc::Error);
  c.extra["layer_budget_weights"] = 3;
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(c), doctest::Contains("not a non-empty array"), dc::Error);
  // Borrowed by a baseline through the registry.
  const auto h2o = dc::make_policy("h2o+layers=" + (dir / "p.dcpolicy").string(), 1, "");
  REQUIRE(h2o->layer_budget_weights().size() == 2);
  CHECK(h2o->layer_budget_weights()[1] == 1.5);
  CHECK(h2o->maps_layer_rules());
  // With the file's choice for other models: a file that drops its rules there drops the borrowed weights too.
  p.set_map_layer_rules(false);
  dc::save_policy_checkpoint(dir / "drop.dcpolicy", p.to_checkpoint());
  CHECK_FALSE(dc::make_policy("h2o+layers=" + (dir / "drop.dcpolicy").string(), 1, "")->maps_layer_rules());
  CHECK_THROWS_WITH_AS(dc::make_policy("h2o+layers=", 1, ""), doctest::Contains("no file given"), dc::Error);
}

TEST_CASE("layer sensitivity equals decoding each single-layer student alone") {
  TinyModel t;
  const auto prompt = std::span<const std::int32_t>(t.ids).first(16);
  const auto continuation = std::span<const std::int32_t>(t.ids).subspan(16, 6);
  auto h2o = dc::make_baseline_policy("h2o");
  const auto kl = dc::layer_sensitivity(t.model, *h2o, prompt, continuation, 4, dc::Granularity::head, 2);
  REQUIRE(kl.size() == 2);
  // The oracle: the teacher and each student run one at a time, KL by the metrics' function.
  auto prefill = [&](dc::KVCache<dc::cpu>& c) {
    c.set_observed_from(h2o->observation_start(16));
    t.model.forward(prompt, c);
  };
  auto teacher = t.model.make_cache(22);
  prefill(teacher);
  std::vector<std::vector<float>> full;
  for (int s = 0; s + 1 < 6; ++s) full.push_back(t.model.forward(continuation.subspan(std::size_t(s), 1), teacher));
  for (int l = 0; l < 2; ++l) {
    auto student = t.model.make_cache(22);
    prefill(student);
    student.set_observed_from(0);
    std::vector<int> budgets{16, 16};
    budgets[std::size_t(l)] = 4;
    dc::compress_to_layer_budgets(t.model.context(), student, *h2o, dc::Granularity::head, budgets, 4);
    CHECK(student.length(l) == 4);
    CHECK(student.length(1 - l) == 16);
    double sum = 0.0;
    for (int s = 0; s + 1 < 6; ++s)
      sum += dc::kl_divergence(full[std::size_t(s)], t.model.forward(continuation.subspan(std::size_t(s), 1), student));
    CHECK(kl[std::size_t(l)] == doctest::Approx(sum / 6.0).epsilon(1e-12));
    CHECK(kl[std::size_t(l)] > 0.0);
  }
  // A budget of the whole prompt evicts nothing: no KL at all.
  const auto none = dc::layer_sensitivity(t.model, *h2o, prompt, continuation, 16, dc::Granularity::head);
  CHECK(none[0] == 0.0);
  CHECK(none[1] == 0.0);
  CHECK_THROWS_WITH_AS(dc::layer_sensitivity(t.model, *h2o, prompt, continuation, 4, dc::Granularity::shared),
                       doctest::Contains("layer or head granularity"), dc::Error);
}
