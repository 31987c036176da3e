// KV-cache eviction on the CPU: evicted-cache decoding against a masked double-precision
// reference, the five features against explicit attention matrices, every baseline's keep-set
// against a straightforward reference, byte accounting, and budget errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include <distillcache/distillcache.hpp>

#include "../support/reference_transformer.hpp"
#include "../support/threads.hpp"

namespace {

const std::string kFixtures = DC_FIXTURE_DIR;

std::vector<int> fixture_tokens(const std::string& name) {
  dc::SafetensorsFile f(kFixtures + "/" + name + "/oracle.safetensors");
  const auto t = f.read_i32("tokens");
  return {t.begin(), t.end()};
}

double max_abs_diff(std::span<const float> got, const std::vector<double>& want) {
  double m = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - want[i]));
  return m;
}

}  // namespace

TEST_CASE("decoding with an evicted cache equals full-cache decoding masked to the kept tokens") {
  for (const std::string name : {"tiny_mistral", "tiny_llama_tied", "tiny_mistral_swa"}) {
    CAPTURE(name);
    dc::HfModel m = dc::load_hf_model(kFixtures + "/" + name);
    const dc::HostWeights reference_weights = dc::load_hf_model(kFixtures + "/" + name).weights;
    const dc::ModelConfig cfg = m.config;
    dc::Transformer<dc::cpu> model(cfg, std::move(m.weights), 8);
    const auto tokens = fixture_tokens(name);
    const int prompt = 16;

    // evicted_at[k]: first query position that no longer sees key position k.
    std::vector<int> evicted_at(tokens.size(), INT_MAX);
    auto cache = model.make_cache(int(tokens.size()));
    std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
    model.forward(std::span(ids).first(prompt), cache);

    // Evict after prefill: keep 8 of 16 slots (slot == position here).
    const std::vector<std::int32_t> keep1{0, 1, 5, 7, 8, 12, 14, 15};
    for (int k = 0; k < prompt; ++k)
      if (!std::binary_search(keep1.begin(), keep1.end(), k)) evicted_at[std::size_t(k)] = prompt;
    cache.compact(model.context(), keep1);
    CHECK(cache.length() == 8);

    std::vector<std::vector<float>> got;
    for (int t = prompt; t < int(tokens.size()); ++t) {
      if (t == 20) {
        // Evict during decoding too: drop positions 1, 8 and 17 (slots 1, 4 and 9).
        const std::vector<std::int32_t> keep2{0, 2, 3, 5, 6, 7, 8, 10, 11};
        for (int pos : {1, 8, 17}) evicted_at[std::size_t(pos)] = 20;
        cache.compact(model.context(), keep2);
        CHECK(cache.host_positions(0) == std::vector<std::int32_t>{0, 5, 7, 12, 14, 15, 16, 18, 19});
      }
      got.push_back(model.forward(std::span(ids).subspan(std::size_t(t), 1), cache));
    }
    const auto ref = dc_test::reference_forward(cfg, reference_weights, tokens, [&](int q, int k) {
      return q < evicted_at[std::size_t(k)];
    });
    double worst = 0.0;
    for (int t = prompt; t < int(tokens.size()); ++t)
      worst = std::max(worst, max_abs_diff(got[std::size_t(t - prompt)], ref.logits[std::size_t(t)]));
    MESSAGE(name << ": evicted decode vs masked reference, max abs error " << worst);
    CHECK(worst < 1e-4);
    // The eviction changed the result (the test can fail): compare with unmasked decoding.
    const auto full = dc_test::reference_forward(cfg, reference_weights, tokens, [](int, int) { return true; });
    CHECK(max_abs_diff(got.back(), full.logits.back()) > 1e-3);
  }
}

TEST_CASE("the five features equal a naive computation from explicit attention matrices") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_llama_tied");
  const dc::HostWeights w = dc::load_hf_model(kFixtures + "/tiny_llama_tied").weights;
  const dc::ModelConfig cfg = m.config;
  dc::Transformer<dc::cpu> model(cfg, std::move(m.weights), 5);
  const auto tokens = fixture_tokens("tiny_llama_tied");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  const int prompt = 16, observed_from = 10, steps = 3;
  auto cache = model.make_cache(prompt + steps);
  cache.set_observed_from(observed_from);
  model.forward(std::span(ids).first(prompt), cache);  // chunks of 5: the window starts mid-chunk
  cache.set_observed_from(0);
  for (int t = prompt; t < prompt + steps; ++t) model.forward(std::span(ids).subspan(std::size_t(t), 1), cache);
  const dc::TokenFeatures f = dc::gather_features(model.context(), cache);

  const std::vector<int> seq(tokens.begin(), tokens.begin() + prompt + steps);
  const auto ref = dc_test::reference_forward(cfg, w, seq, [](int, int) { return true; });
  const int n = prompt + steps, H = cfg.num_heads, L = cfg.num_layers, KV = cfg.num_kv_heads;
  REQUIRE(f.size == n);
  double worst_alpha = 0, worst_sigma = 0, worst_entropy = 0, worst_norm = 0, worst_last = 0;
  for (int k = 0; k < n; ++k) {
    double mass = 0, ent_mass = 0, queries = 0, last = 0;
    std::vector<double> head_mass(std::size_t(H), 0.0);
    for (int l = 0; l < L; ++l)
      for (int q = std::max(observed_from, k); q < n; ++q) {
        queries += 1.0 / H;  // counted once per (layer, query); divided back below
        for (int h = 0; h < H; ++h) {
          const auto& row = ref.probs[std::size_t(l)][std::size_t(h)][std::size_t(q)];
          double entropy = 0;
          for (double p : row)
            if (p > 0) entropy -= p * std::log(p);
          const double p = row[std::size_t(k)];
          mass += p;
          ent_mass += p * entropy;
          head_mass[std::size_t(h)] += p;
          if (q == n - 1) last += p / L;
        }
      }
    queries *= H;  // = layers x observed queries that see k
    const double alpha = mass / (queries * H);
    double mean = 0, sq = 0;
    for (double hm : head_mass) {
      mean += hm / queries / H;
      sq += (hm / queries) * (hm / queries) / H;
    }
    double vnorm = 0;
    for (int l = 0; l < L; ++l)
      for (int g = 0; g < KV; ++g) vnorm += ref.value_norm[std::size_t(l)][std::size_t(g)][std::size_t(k)] / (L * KV);
    const std::size_t s = std::size_t(k);
    using F = dc::Feature;
    worst_alpha = std::max(worst_alpha, std::fabs(f.feature(k, F::alpha) - alpha));
    worst_sigma = std::max(worst_sigma, std::fabs(f.feature(k, F::head_variance) - (sq - mean * mean)));
    worst_entropy = std::max(worst_entropy, std::fabs(f.feature(k, F::entropy) - ent_mass / mass));
    worst_norm = std::max(worst_norm, std::fabs(f.feature(k, F::value_norm) - vnorm) / vnorm);
    worst_last = std::max(worst_last, std::fabs(f.last_query_mass[s] - last / H));
    CHECK(f.feature(k, F::position) == doctest::Approx(double(k) / (n - 1)));
    CHECK(f.accumulated_mass[s] == doctest::Approx(mass).epsilon(1e-4));
  }
  MESSAGE("feature errors: alpha " << worst_alpha << ", sigma " << worst_sigma << ", entropy "
                                   << worst_entropy << ", value norm (rel) " << worst_norm
                                   << ", last-query mass " << worst_last);
  CHECK(worst_alpha < 1e-5);
  CHECK(worst_sigma < 1e-5);
  CHECK(worst_entropy < 1e-4);
  CHECK(worst_norm < 1e-5);
  CHECK(worst_last < 1e-5);

  // Statistics move with their slots: compaction permutes features, it does not change them.
  const std::vector<std::int32_t> keep{0, 3, 4, 9, 17, 18};
  cache.compact(model.context(), keep);
  const dc::TokenFeatures g = dc::gather_features(model.context(), cache);
  REQUIRE(g.size == int(keep.size()));
  for (std::size_t i = 0; i < keep.size(); ++i) {
    CHECK(g.position[i] == f.position[std::size_t(keep[i])]);
    CHECK(g.feature(int(i), dc::Feature::alpha) == f.feature(keep[i], dc::Feature::alpha));
    CHECK(g.feature(int(i), dc::Feature::entropy) == f.feature(keep[i], dc::Feature::entropy));
    CHECK(g.key_norm[i] == f.key_norm[std::size_t(keep[i])]);
  }
}

namespace {

// Fixed inputs for the baselines: `groups` groups of 20 rows at positions 0..19 with
// deterministic features (group g's values shifted by g, so the groups rank differently).
dc::TokenFeatures fixed_features(int groups = 1) {
  dc::TokenFeatures f;
  f.latest_position = 19;
  f.granularity = groups == 1 ? dc::Granularity::shared : dc::Granularity::head;
  for (int g = 0; g < groups; ++g) {
    f.groups.push_back({0, 1, g, g + 1, f.size, f.size + 20});
    for (int i = 0; i < 20; ++i) {
      const int v = i + 3 * g;
      f.group.push_back(g);
      f.slot.push_back(i);
      f.position.push_back(i);
      const float row[dc::kNumFeatures] = {float((v * 7) % 11) / 10.0f, 1.0f, 0.0f, 0.0f, float(i) / 19.0f};
      f.append_features(row);
      f.accumulated_mass.push_back(float((v * 5) % 13));
      f.last_query_mass.push_back(float((v * 3) % 17) / 16.0f);
      f.key_norm.push_back(float((v * 11) % 19));
      f.expected_attention.push_back(0.0f);
    }
    f.size += 20;
  }
  f.validate();
  return f;
}

}  // namespace

TEST_CASE("validate names the first bad entry when the check runs in parallel (> 65536 rows)") {
  const dc::TokenFeatures good = fixed_features(4000);  // 80000 rows: the parallel pass
  REQUIRE(good.size == 80000);
  auto fails_with = [&](auto&& spoil, const char* message) {
    dc::TokenFeatures f = good;
    spoil(f);
    CHECK_THROWS_WITH_AS(f.validate(), doctest::Contains(message), dc::Error);
  };
  fails_with([](dc::TokenFeatures& f) { f.key_norm[79999] = NAN; }, "'key_norm': entry 79999 is NaN");
  fails_with([](dc::TokenFeatures& f) { f.column(dc::Feature::alpha)[70001] = INFINITY; },
             "'alpha' of row 70001 is +inf");
  fails_with([](dc::TokenFeatures& f) { f.group[75000] = 0; }, "row 75000 has group 0, lies in group 3750");
  // A group reaching past the last row is named before any row's group is read.
  fails_with([](dc::TokenFeatures& f) { f.groups.back().row_end += 5; }, "and end by 80000");
  // Two faults: the row's group is reported before a non-finite value.
  fails_with([](dc::TokenFeatures& f) {
    f.group[100] = 7;
    f.column(dc::Feature::entropy)[50] = NAN;
  }, "row 100 has group 7");
  // One group of every row (a shared keep-set): the float columns still split by rows among the
  // threads, and a bad entry in either half is found.
  dc::TokenFeatures one = good;
  one.groups = {{0, 1, 0, 1, 0, one.size}};
  std::fill(one.group.begin(), one.group.end(), 0);
  one.validate();
  for (const int row : {0, 39999, 40000, 79999}) {
    dc::TokenFeatures f = one;
    f.last_query_mass[std::size_t(row)] = -INFINITY;
    const std::string message = "'last_query_mass': entry " + std::to_string(row) + " is -inf";
    CHECK_THROWS_WITH_AS(f.validate(), doctest::Contains(message.c_str()), dc::Error);
  }
}

namespace {

// Reference: sort by (key descending, position ascending), take the first `budget`.
std::vector<std::int32_t> top_by(const std::vector<double>& key, int budget) {
  std::vector<std::int32_t> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[std::size_t(a)] > key[std::size_t(b)]; });
  idx.resize(std::size_t(budget));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// The keep-set of every group.
dc::KeepSets keep_sets_of(dc::EvictionPolicy& p, const dc::TokenFeatures& f, int budget) {
  std::vector<float> s(std::size_t(f.size));
  p.score(f, budget, s);
  return dc::select_keep_groups(s, f, budget);
}

std::vector<std::int32_t> keep_of(dc::EvictionPolicy& p, const dc::TokenFeatures& f, int budget) {
  return keep_sets_of(p, f, budget).at(0);
}

}  // namespace

TEST_CASE("each baseline keeps what a straightforward reference keeps") {
  const auto f = fixed_features();
  const int B = 8;
  std::vector<double> key(20);

  dc::StreamingPolicy streaming;  // 4 sinks + most recent
  CHECK(keep_of(streaming, f, B) == std::vector<std::int32_t>{0, 1, 2, 3, 16, 17, 18, 19});

  dc::H2OPolicy h2o;  // 4 most recent + top-4 accumulated mass among the rest
  for (int i = 0; i < 20; ++i) key[std::size_t(i)] = i >= 16 ? 1e9 : f.accumulated_mass[std::size_t(i)];
  CHECK(keep_of(h2o, f, B) == top_by(key, B));
  auto h2o_quarter = dc::make_baseline_policy("h2o:recent=0.25");  // 2 most recent + top-6
  CHECK(h2o_quarter->name() == "h2o:recent=0.25");
  for (int i = 0; i < 20; ++i) key[std::size_t(i)] = i >= 18 ? 1e9 : f.accumulated_mass[std::size_t(i)];
  CHECK(keep_of(*h2o_quarter, f, B) == top_by(key, B));
  CHECK(keep_of(*dc::make_baseline_policy("h2o:recent=0.5"), f, B) == keep_of(h2o, f, B));
  CHECK_THROWS_WITH_AS(dc::make_baseline_policy("h2o:recent=half"), doctest::Contains("is not a number"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::make_baseline_policy("h2o:recent=1.5"), doctest::Contains("must lie in [0, 1]"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::make_baseline_policy("h2o:recent="), doctest::Contains("is not a number"), dc::Error);

  dc::SnapKVPolicy snapkv(4, 3);  // last 4 kept + top-4 of avg-pooled alpha (kernel 3, zero pad)
  for (int i = 0; i < 20; ++i) {
    double pooled = 0;
    for (int j = i - 1; j <= i + 1; ++j)
      if (j >= 0 && j < 16) pooled += f.feature(j, dc::Feature::alpha);  // the window is not pooled
    key[std::size_t(i)] = i >= 16 ? 1e9 : pooled / 3;
  }
  CHECK(keep_of(snapkv, f, B) == top_by(key, B));
  std::vector<float> snap_scores(20);
  snapkv.score(f, B, snap_scores);  // the key before the window pools zeros from the window side
  CHECK(snap_scores[15] == doctest::Approx((f.feature(14, dc::Feature::alpha) + f.feature(15, dc::Feature::alpha)) / 3));

  dc::ObservedAttentionPolicy observed;  // mean attention received, no recent window
  for (int i = 0; i < 20; ++i) key[std::size_t(i)] = f.feature(i, dc::Feature::alpha);
  CHECK(keep_of(observed, f, B) == top_by(key, B));

  dc::TOVAPolicy tova;
  for (int i = 0; i < 20; ++i) key[std::size_t(i)] = i == 19 ? 1e9 : f.last_query_mass[std::size_t(i)];
  CHECK(keep_of(tova, f, B) == top_by(key, B));  // the newest token is always kept

  dc::KNormPolicy knorm;
  for (int i = 0; i < 20; ++i) key[std::size_t(i)] = -f.key_norm[std::size_t(i)];
  CHECK(keep_of(knorm, f, B) == top_by(key, B));

  dc::RandomPolicy r1(7), r2(7), r3(8);
  const auto k1 = keep_of(r1, f, B);
  CHECK(k1.size() == std::size_t(B));
  CHECK(std::is_sorted(k1.begin(), k1.end()));
  CHECK(k1 == keep_of(r2, f, B));  // same seed, same subset
  CHECK(k1 != keep_of(r3, f, B));

  CHECK_THROWS_WITH_AS(dc::make_baseline_policy("lru"), doctest::Contains("unknown policy 'lru'"), dc::Error);
  for (const auto& name : dc::baseline_policy_names()) CHECK(dc::make_baseline_policy(name)->name() == name);
}

TEST_CASE("select_keep protects sinks and recent tokens and rejects NaN scores") {
  const std::vector<float> scores{9, 0, 0, 8, 7, 6, 0, 0};
  const std::vector<std::int32_t> pos{0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(dc::select_keep(scores, pos, 4) == std::vector<std::int32_t>{0, 3, 4, 5});
  CHECK(dc::select_keep(scores, pos, 4, /*sink=*/2, /*recent=*/1) == std::vector<std::int32_t>{0, 1, 3, 7});
  CHECK(dc::select_keep(scores, pos, 20).size() == 8);
  const std::vector<float> bad{0, NAN};
  CHECK_THROWS_WITH_AS(dc::select_keep(bad, std::span(pos).first(2), 1), doctest::Contains("NaN"), dc::Error);
}

TEST_CASE("select_keep equals a full sort, on both of its paths (few dropped: one pass; many: nth_element)") {
  // Oracle: every slot sorted by (protected first, score descending, position ascending), the
  // first B listed in slot order. Scores from 4 values, so ties are everywhere; positions a
  // permutation, so slot order is not position order; budgets from B = n - 1 (the one-pass
  // path, a decode-time eviction) down to 0 (nth_element).
  std::uint64_t state = 12345;
  auto next = [&state](int bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int((state >> 33) % std::uint64_t(bound));
  };
  int checked = 0;
  for (int n : {1, 2, 17, 64, 200, 2064})
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> scores(static_cast<std::size_t>(n));
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      std::iota(pos.begin(), pos.end(), 100);
      for (int i = n - 1; i > 0; --i) std::swap(pos[std::size_t(i)], pos[std::size_t(next(i + 1))]);
      for (auto& x : scores) {  // trial 3: a third of them infinite (H2O's recent rows, masked rows)
        x = float(next(4));
        if (trial == 3 && next(3) == 0) x = next(2) ? INFINITY : -INFINITY;
        // trial 4: nine in ten +inf (the learned policy's forced rows), so the one-pass path
        // seeds its heap past them; trial 5: at most 2 below +inf, fewer than it drops
        if (trial == 4 && next(10) != 0) x = INFINITY;
        if (trial == 5) x = next(n) < 2 ? x : INFINITY;
      }
      const int sink = trial == 2 ? std::min(2, n) : 0, recent = trial == 2 ? std::min(3, n - sink) : 0;
      for (int drop : {1, 2, 3, n / 16, n / 16 + 1, n / 2, n}) {
        const int budget = n - drop;
        if (budget < 0 || budget < sink + recent) continue;
        std::vector<std::int32_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::vector<std::int32_t> by_position = order;
        std::sort(by_position.begin(), by_position.end(),
                  [&](std::int32_t a, std::int32_t b) { return pos[std::size_t(a)] < pos[std::size_t(b)]; });
        std::vector<char> is_protected(static_cast<std::size_t>(n), 0);
        for (int i = 0; i < sink; ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;
        for (int i = n - recent; i < n; ++i) is_protected[std::size_t(by_position[std::size_t(i)])] = 1;
        std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
          const auto ua = std::size_t(a), ub = std::size_t(b);
          if (is_protected[ua] != is_protected[ub]) return is_protected[ua] > is_protected[ub];
          if (scores[ua] != scores[ub]) return scores[ua] > scores[ub];
          return pos[ua] < pos[ub];
        });
        std::vector<std::int32_t> want(order.begin(), order.begin() + budget);
        std::sort(want.begin(), want.end());
        CHECK(dc::select_keep(scores, pos, budget, sink, recent) == want);
        ++checked;
      }
    }
  CHECK(checked > 100);
}

TEST_CASE("EvictingDecoder keeps the cache within B (+ chunk) and its bytes match the budget") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  dc::H2OPolicy policy;
  dc::Budget budget = dc::Budget::of_fraction(0.5);
  budget.chunk = 3;
  dc::EvictingDecoder<dc::cpu> dec(model, policy, budget, dc::EvictionMode::decode, 16, 8);
  dec.prefill(std::span(ids).first(16));
  CHECK(dec.budget_tokens() == 8);
  CHECK(dec.cache().length() == 8);
  CHECK(dec.cache().bytes_used() == std::size_t(8) * m.config.num_layers * dec.cache().bytes_per_slot_layer());
  for (int t = 16; t < 24; ++t) {
    dec.step(ids[std::size_t(t)]);
    CHECK(dec.cache().length() <= 8 + 3 - 1);  // reaching B + chunk evicts back to B
  }
  CHECK(dec.evictions() == 1 + 8 / 3);

  // Prefill-only mode never evicts while decoding.
  dc::EvictingDecoder<dc::cpu> once(model, policy, budget, dc::EvictionMode::prefill, 16, 8);
  once.prefill(std::span(ids).first(16));
  for (int t = 16; t < 24; ++t) once.step(ids[std::size_t(t)]);
  CHECK(once.cache().length() == 16);
  CHECK(once.evictions() == 1);
}

TEST_CASE("EvictingDecoder gives the evicted slots' memory back, with the logits of evicting in the full reservation") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  REQUIRE(ids.size() >= 24);
  dc::H2OPolicy policy;
  dc::Budget budget = dc::Budget::of_fraction(0.25);
  budget.chunk = 3;
  const int prompt = 16, new_tokens = 8, b = budget.resolve(prompt);
  dc::EvictingDecoder<dc::cpu> dec(model, policy, budget, dc::EvictionMode::decode, prompt, new_tokens,
                                   dc::Granularity::head);
  const auto every_layer = [&](int capacity) { return std::vector<int>(std::size_t(m.config.num_layers), capacity); };
  CHECK(dec.cache().capacities() == every_layer(prompt + new_tokens));
  dec.prefill(std::span(ids).first(std::size_t(prompt)));
  // What decoding can reach: the compressed length plus every token still allowed.
  CHECK(dec.cache().capacities() == every_layer(b + new_tokens));
  CHECK(dec.cache().bytes_reserved() == std::size_t(b + new_tokens) * m.config.num_layers *
                                             dec.cache().bytes_per_slot_layer());

  // The oracle: the same steps by hand in a cache that keeps its whole reservation.
  dc::KVCache<dc::cpu> cache = model.make_cache(prompt + new_tokens);
  cache.set_observed_from(policy.observation_start(prompt));
  cache.collect_queries(policy.query_statistics(), m.config.rope_theta);
  std::vector<float> logits(std::size_t(m.config.vocab_size));
  model.forward(std::span(ids).first(std::size_t(prompt)), cache, std::span<float>(logits));
  cache.set_observed_from(0);
  dc::TokenFeatures f;
  auto evict = [&] {
    dc::gather_features_into(f, model.context(), cache, dc::Granularity::head);
    std::vector<float> scores(std::size_t(f.size));
    policy.score(f, b, scores);
    dc::compact_groups(model.context(), cache, f, dc::select_keep_groups(scores, f, b));
  };
  evict();
  CHECK(dec.logits().size() == logits.size());
  CHECK(std::equal(logits.begin(), logits.end(), dec.logits().begin()));
  for (int t = prompt; t < prompt + new_tokens; ++t) {
    model.forward(std::span(ids).subspan(std::size_t(t), 1), cache, std::span<float>(logits));
    if (cache.evictable_length() >= b + budget.chunk) evict();
    dec.step(ids[std::size_t(t)]);
    CAPTURE(t);
    CHECK(std::equal(logits.begin(), logits.end(), dec.logits().begin()));
    CHECK(dec.cache().length() == cache.length());
  }
  CHECK(dec.evictions() == 1 + new_tokens / budget.chunk);

  // The next prompt has the whole reservation again.
  dec.prefill(std::span(ids).first(std::size_t(prompt)));
  CHECK(dec.cache().capacities() == every_layer(b + new_tokens));
  CHECK(dec.cache().length() == b);
}

TEST_CASE("the default chunk grows with the budget: B / 64 tokens, at least 16; a set chunk wins") {
  dc::Budget budget = dc::Budget::of_tokens(1280);
  CHECK(budget.chunk_for(8) == 16);
  CHECK(budget.chunk_for(1087) == 16);
  CHECK(budget.chunk_for(1088) == 17);
  CHECK(budget.chunk_for(2048) == 32);
  dc::Budget fixed = budget;
  fixed.chunk = 5;
  CHECK(fixed.chunk_for(2048) == 5);

  // A decoder at B = 1280 evicts every 1280 / 64 = 20 decoded tokens.
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  m.config.max_position = 1400;
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::int32_t> token(0, m.config.vocab_size - 1);
  std::vector<std::int32_t> ids(1360);
  for (auto& t : ids) t = token(rng);
  dc::H2OPolicy policy;
  dc::EvictingDecoder<dc::cpu> dec(model, policy, budget, dc::EvictionMode::decode, 1300, 60);
  dec.prefill(std::span(ids).first(1300));
  CHECK(dec.chunk_tokens() == 20);
  CHECK(dec.cache().length() == 1280);
  int longest = 0;
  for (int t = 1300; t < 1360; ++t) {
    dec.step(ids[std::size_t(t)]);
    longest = std::max(longest, dec.cache().length());
  }
  CHECK(longest == 1280 + 20 - 1);  // reaching B + chunk evicts back to B
  CHECK(dec.evictions() == 1 + 60 / 20);
}

TEST_CASE("impossible budgets give clear errors") {
  CHECK_THROWS_WITH_AS(dc::Budget::of_tokens(0).resolve(16), doctest::Contains("budget is 0"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_fraction(0.0).resolve(16), doctest::Contains("budget is 0"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_tokens(-3).resolve(16), doctest::Contains("must be positive"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_fraction(-0.5).resolve(16), doctest::Contains("(0, 1]"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_tokens(17).resolve(16), doctest::Contains("exceed the prompt length"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_fraction(1.5).resolve(16), doctest::Contains("(0, 1]"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_fraction(NAN).resolve(16), doctest::Contains("not finite"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::Budget::of_fraction(INFINITY).resolve(16), doctest::Contains("not finite"), dc::Error);
  dc::Budget protected_too_much = dc::Budget::of_tokens(4);
  protected_too_much.sink = 3;
  protected_too_much.recent = 2;
  CHECK_THROWS_WITH_AS(protected_too_much.resolve(16), doctest::Contains("exceed the budget"), dc::Error);
  CHECK(dc::Budget::of_fraction(0.25).resolve(1000) == 250);
  CHECK(dc::Budget::of_fraction(0.125).resolve(9) == 2);  // rounds up
}

#if defined(_OPENMP)
TEST_CASE("eviction decisions and logits are identical for 1 and 2 OpenMP threads") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_llama_tied");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 5);
  const auto tokens = fixture_tokens("tiny_llama_tied");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  auto run = [&](int threads) {
    return dc_test::with_threads(threads, [&] {
      dc::SnapKVPolicy policy(4, 3);
      dc::Budget budget = dc::Budget::of_fraction(0.5);
      budget.chunk = 2;
      dc::EvictingDecoder<dc::cpu> dec(model, policy, budget, dc::EvictionMode::decode, 16, 8);
      auto first = dec.prefill(std::span(ids).first(16));
      std::vector<float> out(first.begin(), first.end());
      for (int t = 16; t < 24; ++t) {
        const auto l = dec.step(ids[std::size_t(t)]);
        out.insert(out.end(), l.begin(), l.end());
      }
      const auto features = dc::gather_features(model.context(), dec.cache());
      for (const auto& column : features.columns) out.insert(out.end(), column.begin(), column.end());
      return std::make_pair(dec.cache().host_positions(0), out);
    });
  };
  const auto one = run(1), two = run(2);
  CHECK(one.first == two.first);
  CHECK(one.second == two.second);
}
#endif

namespace {

// Per-(layer, KV head) keep-set of `count` of the slots [0, n): a different pseudo-random choice
// for every layer and head.
std::vector<std::int32_t> scattered_keep(int n, int count, int layer, int head) {
  std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  std::stable_sort(slots.begin(), slots.end(), [&](int a, int b) {
    return (a * 5 + 3 * head + 7 * layer) % n < (b * 5 + 3 * head + 7 * layer) % n;
  });
  slots.resize(std::size_t(count));
  std::sort(slots.begin(), slots.end());
  return slots;
}

}  // namespace

TEST_CASE("per-head keep-sets: decoding equals the reference masked per (layer, KV head)") {
  for (const std::string name : {"tiny_mistral", "tiny_mistral_swa"}) {
    CAPTURE(name);
    dc::HfModel m = dc::load_hf_model(kFixtures + "/" + name);
    const dc::HostWeights reference_weights = dc::load_hf_model(kFixtures + "/" + name).weights;
    const dc::ModelConfig cfg = m.config;
    REQUIRE(cfg.num_kv_heads >= 2);
    dc::Transformer<dc::cpu> model(cfg, std::move(m.weights), 8);
    const auto tokens = fixture_tokens(name);
    std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
    const int prompt = 16, L = cfg.num_layers, KV = cfg.num_kv_heads;
    // evicted_at[l][g][k]: first query position that no longer sees key k through (l, g).
    std::vector<std::vector<std::vector<int>>> evicted_at(
        std::size_t(L), std::vector<std::vector<int>>(std::size_t(KV), std::vector<int>(tokens.size(), INT_MAX)));
    auto cache = model.make_cache(int(tokens.size()));
    model.forward(std::span(ids).first(prompt), cache);

    // Evict after prefill: every (layer, head) keeps its own 8 of the 16 slots.
    for (int l = 0; l < L; ++l) {
      std::vector<std::int32_t> flat;
      for (int g = 0; g < KV; ++g) {
        const auto keep = scattered_keep(prompt, 8, l, g);
        for (int k = 0; k < prompt; ++k)
          if (!std::binary_search(keep.begin(), keep.end(), k)) evicted_at[std::size_t(l)][std::size_t(g)][std::size_t(k)] = prompt;
        flat.insert(flat.end(), keep.begin(), keep.end());
      }
      cache.compact_heads(model.context(), l, flat);
      CHECK_FALSE(cache.heads_share_slots(l));
    }
    CHECK(cache.length() == 8);
    CHECK(cache.bytes_used() == std::size_t(8) * L * cache.bytes_per_slot_layer());

    std::vector<std::vector<float>> got;
    for (int t = prompt; t < int(tokens.size()); ++t) {
      if (t == 20) {  // evict during decoding too: each head drops 3 of its 12 slots
        for (int l = 0; l < L; ++l) {
          std::vector<std::int32_t> flat;
          for (int g = 0; g < KV; ++g) {
            const auto& pos = cache.host_positions(l, g);
            const auto keep = scattered_keep(int(pos.size()), int(pos.size()) - 3, l, g + 1);
            for (int s = 0; s < int(pos.size()); ++s)
              if (!std::binary_search(keep.begin(), keep.end(), s))
                evicted_at[std::size_t(l)][std::size_t(g)][std::size_t(pos[std::size_t(s)])] = 20;
            flat.insert(flat.end(), keep.begin(), keep.end());
          }
          cache.compact_heads(model.context(), l, flat);
        }
        CHECK(cache.length() == 9);
      }
      got.push_back(model.forward(std::span(ids).subspan(std::size_t(t), 1), cache));
    }
    const auto ref = dc_test::reference_forward(cfg, reference_weights, tokens, [&](int l, int g, int q, int k) {
      return q < evicted_at[std::size_t(l)][std::size_t(g)][std::size_t(k)];
    });
    double worst = 0.0;
    for (int t = prompt; t < int(tokens.size()); ++t)
      worst = std::max(worst, max_abs_diff(got[std::size_t(t - prompt)], ref.logits[std::size_t(t)]));
    MESSAGE(name << ": per-head evicted decode vs masked reference, max abs error " << worst);
    CHECK(worst < 1e-4);
    // The heads' sets really differ: masking every head like head 0 gives other logits.
    const auto like_head0 = dc_test::reference_forward(cfg, reference_weights, tokens, [&](int l, int, int q, int k) {
      return q < evicted_at[std::size_t(l)][0][std::size_t(k)];
    });
    CHECK(max_abs_diff(got.back(), like_head0.logits.back()) > 1e-3);
  }
}

TEST_CASE("the gather's value norm sums per group are the column's, so a policy scores the same from either") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 5);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  auto cache = model.make_cache(14);
  cache.set_observed_from(0);
  model.forward(std::span(ids).first(14), cache);
  std::vector<dc::PolicyInput> inputs = dc::paper_policy_inputs();
  inputs.push_back(dc::PolicyInput::last_alpha);
  auto policy = dc::MlpPolicy::initialised(inputs, {8}, 5);
  for (auto granularity : {dc::Granularity::shared, dc::Granularity::layer, dc::Granularity::head}) {
    CAPTURE(dc::granularity_name(granularity));
    dc::TokenFeatures f = dc::gather_features(model.context(), cache, granularity);
    REQUIRE(f.group_value_norm_sum.size() == f.groups.size());
    for (std::size_t g = 0; g < f.groups.size(); ++g) {
      double column = 0.0;
      for (int r = f.groups[g].row_begin; r < f.groups[g].row_end; ++r) column += f.feature(r, dc::Feature::value_norm);
      CHECK(f.group_value_norm_sum[g] == doctest::Approx(column).epsilon(1e-12));
      CHECK(f.group_value_norm_sum[g] ==
            dc::value_norm_sum(f.column(dc::Feature::value_norm) + f.groups[g].row_begin, f.groups[g].rows()));
    }
    std::vector<float> gathered(std::size_t(f.size)), summed_here(std::size_t(f.size));
    policy.score(f, 5, gathered);
    f.group_value_norm_sum.clear();  // as features built by hand: the policy sums the column
    policy.score(f, 5, summed_here);
    CHECK(std::memcmp(gathered.data(), summed_here.data(), gathered.size() * sizeof(float)) == 0);
    f.group_value_norm_sum.assign(1 + f.groups.size(), 0.0);
    CHECK_THROWS_WITH_AS(f.validate(), doctest::Contains("value norm sums for"), dc::Error);
  }
}

TEST_CASE("head- and layer-granular features equal a naive computation per (layer, KV head)") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  const dc::HostWeights w = dc::load_hf_model(kFixtures + "/tiny_mistral").weights;
  const dc::ModelConfig cfg = m.config;
  dc::Transformer<dc::cpu> model(cfg, std::move(m.weights), 5);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  const int n = 14, observed_from = 6;
  auto cache = model.make_cache(n);
  cache.set_observed_from(observed_from);
  model.forward(std::span(ids).first(n), cache);
  const std::vector<int> seq(tokens.begin(), tokens.begin() + n);
  const auto ref = dc_test::reference_forward(cfg, w, seq, [](int, int) { return true; });
  const int H = cfg.num_heads, L = cfg.num_layers, KV = cfg.num_kv_heads, G = H / KV;

  // Naive features of key k over layers [l0, l1) and KV heads [g0, g1).
  struct Naive { double alpha, sigma, entropy, vnorm, knorm, last; };
  auto naive = [&](int k, int l0, int l1, int g0, int g1) {
    double mass = 0, ent_mass = 0, queries = 0, last = 0, vnorm = 0, knorm = 0;
    std::vector<double> head_mass;
    for (int l = l0; l < l1; ++l) {
      for (int g = g0; g < g1; ++g) {
        vnorm += ref.value_norm[std::size_t(l)][std::size_t(g)][std::size_t(k)];
        knorm += ref.key_norm[std::size_t(l)][std::size_t(g)][std::size_t(k)];
      }
      for (int q = std::max(observed_from, k); q < n; ++q) queries += 1;
    }
    for (int g = g0; g < g1; ++g)
      for (int h = g * G; h < (g + 1) * G; ++h) {
        double hm = 0;
        for (int l = l0; l < l1; ++l)
          for (int q = std::max(observed_from, k); q < n; ++q) {
            const auto& row = ref.probs[std::size_t(l)][std::size_t(h)][std::size_t(q)];
            double entropy = 0;
            for (double p : row)
              if (p > 0) entropy -= p * std::log(p);
            const double p = row[std::size_t(k)];
            mass += p;
            ent_mass += p * entropy;
            hm += p;
            if (q == n - 1) last += p;
          }
        head_mass.push_back(hm / queries);
      }
    const double heads = double(head_mass.size()), covered = double((l1 - l0) * (g1 - g0));
    double mean = 0, sq = 0;
    for (double hm : head_mass) {
      mean += hm / heads;
      sq += hm * hm / heads;
    }
    return Naive{mass / (queries * heads), sq - mean * mean, ent_mass / mass, vnorm / covered,
                 knorm / covered, last / heads / (l1 - l0)};
  };
  auto check_rows = [&](const dc::TokenFeatures& f) {
    f.validate();
    double worst = 0;
    for (const auto& grp : f.groups)
      for (int r = grp.row_begin; r < grp.row_end; ++r) {
        const int k = f.position[std::size_t(r)];
        const Naive want = naive(k, grp.layer_begin, grp.layer_end, grp.head_begin, grp.head_end);
        using F = dc::Feature;
        worst = std::max({worst, std::fabs(f.feature(r, F::alpha) - want.alpha),
                          std::fabs(f.feature(r, F::head_variance) - want.sigma),
                          std::fabs(f.feature(r, F::entropy) - want.entropy) / 10,
                          std::fabs(f.feature(r, F::value_norm) - want.vnorm) / want.vnorm,
                          std::fabs(f.key_norm[std::size_t(r)] - want.knorm) / want.knorm,
                          std::fabs(f.last_query_mass[std::size_t(r)] - want.last)});
      }
    return worst;
  };
  const auto head = dc::gather_features(model.context(), cache, dc::Granularity::head);
  REQUIRE(head.num_groups() == L * KV);
  REQUIRE(head.size == L * KV * n);
  const auto layer = dc::gather_features(model.context(), cache, dc::Granularity::layer);
  REQUIRE(layer.num_groups() == L);
  REQUIRE(layer.size == L * n);
  const auto shared = dc::gather_features(model.context(), cache, dc::Granularity::shared);
  const double worst_head = check_rows(head), worst_layer = check_rows(layer), worst_shared = check_rows(shared);
  MESSAGE("feature errors: head " << worst_head << ", layer " << worst_layer << ", shared " << worst_shared);
  CHECK(worst_head < 1e-5);
  CHECK(worst_layer < 1e-5);
  CHECK(worst_shared < 1e-5);
  // The heads of a group see different attention: head rows are not copies of each other.
  CHECK(head.feature(n - 3, dc::Feature::alpha) != head.feature(n + n - 3, dc::Feature::alpha));

  // After per-head compaction only head granularity can be gathered; statistics move with slots.
  std::vector<std::int32_t> flat;
  for (int g = 0; g < KV; ++g) {
    const auto keep = scattered_keep(n, 6, 0, g);
    flat.insert(flat.end(), keep.begin(), keep.end());
  }
  cache.compact_heads(model.context(), 0, flat);
  CHECK_THROWS_WITH_AS(dc::gather_features(model.context(), cache, dc::Granularity::layer),
                       doctest::Contains("hold different slots"), dc::Error);
  cache.compact_layer(model.context(), 1, scattered_keep(n, 6, 1, 0));
  const auto after = dc::gather_features(model.context(), cache, dc::Granularity::head);
  CHECK(after.size == L * KV * 6);
  // The decoder gathers into the set of its previous eviction: every field is replaced, whatever
  // the set held (here more rows, another granularity, fewer groups).
  dc::TokenFeatures reused = layer;
  dc::gather_features_into(reused, model.context(), cache, dc::Granularity::head);
  CHECK(reused.granularity == after.granularity);
  CHECK(reused.size == after.size);
  CHECK(reused.latest_position == after.latest_position);
  CHECK(reused.num_groups() == after.num_groups());
  for (int g = 0; g < after.num_groups(); ++g)
    CHECK((reused.groups[std::size_t(g)].row_begin == after.groups[std::size_t(g)].row_begin &&
           reused.groups[std::size_t(g)].row_end == after.groups[std::size_t(g)].row_end &&
           reused.groups[std::size_t(g)].head_begin == after.groups[std::size_t(g)].head_begin &&
           reused.groups[std::size_t(g)].layer_begin == after.groups[std::size_t(g)].layer_begin));
  CHECK(reused.columns == after.columns);
  CHECK(reused.group == after.group);
  CHECK(reused.slot == after.slot);
  CHECK(reused.position == after.position);
  CHECK(reused.accumulated_mass == after.accumulated_mass);
  CHECK(reused.last_query_mass == after.last_query_mass);
  CHECK(reused.key_norm == after.key_norm);
  CHECK(reused.has_expected_attention == after.has_expected_attention);
  CHECK(reused.expected_attention == after.expected_attention);
  CHECK(reused.group_value_norm_sum == after.group_value_norm_sum);
  for (int g = 0; g < KV; ++g)
    for (int i = 0; i < 6; ++i) {
      const int before_row = g * n + flat[std::size_t(g * 6 + i)];
      CHECK(after.position[std::size_t(g * 6 + i)] == head.position[std::size_t(before_row)]);
      CHECK(after.feature(g * 6 + i, dc::Feature::alpha) == head.feature(before_row, dc::Feature::alpha));
    }
}

TEST_CASE("grouped selection: each group keeps its own top-B; SnapKV pools inside its group") {
  const auto f = fixed_features(3);
  const int B = 6;
  dc::H2OPolicy h2o;
  dc::SnapKVPolicy snapkv(4, 3);
  dc::KNormPolicy knorm;
  const auto h2o_sets = keep_sets_of(h2o, f, B), snap_sets = keep_sets_of(snapkv, f, B),
             knorm_sets = keep_sets_of(knorm, f, B);
  REQUIRE(h2o_sets.size() == 3);
  std::vector<double> key(20);
  for (int g = 0; g < 3; ++g) {
    const int base = g * 20;
    for (int i = 0; i < 20; ++i) key[std::size_t(i)] = i >= 17 ? 1e9 : f.accumulated_mass[std::size_t(base + i)];
    CHECK(h2o_sets[std::size_t(g)] == top_by(key, B));
    for (int i = 0; i < 20; ++i) {
      double pooled = 0;
      for (int j = i - 1; j <= i + 1; ++j)  // zero padding at the group's edges and the window
        if (j >= 0 && j < 16) pooled += f.feature(base + j, dc::Feature::alpha);
      key[std::size_t(i)] = i >= 16 ? 1e9 : pooled / 3;
    }
    CHECK(snap_sets[std::size_t(g)] == top_by(key, B));
    for (int i = 0; i < 20; ++i) key[std::size_t(i)] = -f.key_norm[std::size_t(base + i)];
    CHECK(knorm_sets[std::size_t(g)] == top_by(key, B));
  }
  CHECK(knorm_sets[0] != knorm_sets[1]);  // the groups rank differently
}

TEST_CASE("EvictingDecoder at head granularity: per-head sets, exact bytes; TOVA keeps one set per layer") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  const int L = m.config.num_layers;
  dc::Budget budget = dc::Budget::of_fraction(0.5);
  budget.chunk = 3;
  dc::KNormPolicy knorm;
  dc::EvictingDecoder<dc::cpu> dec(model, knorm, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  CHECK(dec.granularity() == dc::Granularity::head);
  dec.prefill(std::span(ids).first(16));
  bool differ = false;
  for (int l = 0; l < L; ++l) differ = differ || !dec.cache().heads_share_slots(l);
  CHECK(differ);  // key norms differ between heads
  CHECK(dec.cache().bytes_used() == std::size_t(8) * L * dec.cache().bytes_per_slot_layer());
  for (int t = 16; t < 24; ++t) {
    dec.step(ids[std::size_t(t)]);
    CHECK(dec.cache().length() <= 8 + 3 - 1);
  }
  // Prompt compression: every (layer, head) keeps exactly its 8 lowest-norm keys.
  dc::EvictingDecoder<dc::cpu> once(model, knorm, budget, dc::EvictionMode::prefill, 16, 8, dc::Granularity::head);
  once.prefill(std::span(ids).first(16));
  auto full = model.make_cache(16);
  model.forward(std::span(ids).first(16), full);
  const auto f = dc::gather_features(model.context(), full, dc::Granularity::head);
  REQUIRE(f.num_groups() == L * m.config.num_kv_heads);
  for (const auto& g : f.groups) {
    std::vector<double> key;
    for (int r = g.row_begin; r < g.row_end; ++r) key.push_back(-f.key_norm[std::size_t(r)]);
    CHECK(once.cache().host_positions(g.layer_begin, g.head_begin) == top_by(key, 8));
  }

  dc::TOVAPolicy tova;
  dc::EvictingDecoder<dc::cpu> per_layer(model, tova, budget, dc::EvictionMode::decode, 16, 8, dc::Granularity::head);
  CHECK(per_layer.granularity() == dc::Granularity::layer);
  per_layer.prefill(std::span(ids).first(16));
  for (int l = 0; l < L; ++l) CHECK(per_layer.cache().heads_share_slots(l));
  CHECK(dc::parse_granularity("head") == dc::Granularity::head);
  CHECK_THROWS_WITH_AS(dc::parse_granularity("token"), doctest::Contains("unknown granularity 'token'"), dc::Error);
}

TEST_CASE("expected attention equals a naive double-precision computation from the queries") {
  // kvpress's ExpectedAttentionPress, written out: queries (before RoPE) of positions >= 4 give a
  // mean and covariance per head; the mean rotation R over the next F positions maps them to
  // mu' = R mu, C' = R C R^T; a key's logit is mu'.k/sqrt(d) + k'C'k/(2d); softmax over the
  // non-sink keys, mean over the KV group's heads, times ||v||.
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  const dc::HostWeights w = dc::load_hf_model(kFixtures + "/tiny_mistral").weights;
  const dc::ModelConfig cfg = m.config;
  dc::Transformer<dc::cpu> model(cfg, std::move(m.weights), 5);
  const auto tokens = fixture_tokens("tiny_mistral");
  std::vector<std::int32_t> ids(tokens.begin(), tokens.end());
  const int n = 20, sinks = 4, future = 16;
  auto cache = model.make_cache(n);
  cache.collect_queries({sinks, future}, cfg.rope_theta);
  model.forward(std::span(ids).first(n), cache);
  const auto f = dc::gather_features(model.context(), cache, dc::Granularity::head);
  REQUIRE(f.has_expected_attention);
  const std::vector<int> seq(tokens.begin(), tokens.begin() + n);
  const auto ref = dc_test::reference_forward(cfg, w, seq, [](int, int) { return true; });
  const int H = cfg.num_heads, KV = cfg.num_kv_heads, G = H / KV, d = cfg.head_dim;
  double worst = 0.0;
  for (int l = 0; l < cfg.num_layers; ++l)
    for (int g = 0; g < KV; ++g) {
      std::vector<double> mass(std::size_t(n), 0.0);
      for (int h = g * G; h < (g + 1) * G; ++h) {
        std::vector<double> mu(std::size_t(d), 0.0), cov(std::size_t(d) * d, 0.0);
        for (int t = sinks; t < n; ++t)
          for (int i = 0; i < d; ++i) mu[std::size_t(i)] += ref.queries[std::size_t(l)][std::size_t(t)][std::size_t(h * d + i)] / (n - sinks);
        for (int t = sinks; t < n; ++t)
          for (int i = 0; i < d; ++i)
            for (int j = 0; j < d; ++j) {
              const auto& q = ref.queries[std::size_t(l)][std::size_t(t)];
              cov[std::size_t(i * d + j)] += (q[std::size_t(h * d + i)] - mu[std::size_t(i)]) *
                                             (q[std::size_t(h * d + j)] - mu[std::size_t(j)]) / (n - sinks);
            }
        // R as a dense matrix: the mean over positions n..n+future-1 of the RoPE rotation.
        std::vector<double> R(std::size_t(d) * d, 0.0);
        for (int p = n; p < n + future; ++p)
          for (int i = 0; i < d / 2; ++i) {
            const double a = p / std::pow(double(cfg.rope_theta), 2.0 * i / d);
            R[std::size_t(i * d + i)] += std::cos(a) / future;
            R[std::size_t((i + d / 2) * d + i + d / 2)] += std::cos(a) / future;
            R[std::size_t(i * d + i + d / 2)] -= std::sin(a) / future;
            R[std::size_t((i + d / 2) * d + i)] += std::sin(a) / future;
          }
        std::vector<double> mu2(std::size_t(d), 0.0), rc(std::size_t(d) * d, 0.0), c2(std::size_t(d) * d, 0.0);
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j) {
            mu2[std::size_t(i)] += R[std::size_t(i * d + j)] * mu[std::size_t(j)];
            for (int k = 0; k < d; ++k) rc[std::size_t(i * d + j)] += R[std::size_t(i * d + k)] * cov[std::size_t(k * d + j)];
          }
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j)
            for (int k = 0; k < d; ++k) c2[std::size_t(i * d + j)] += rc[std::size_t(i * d + k)] * R[std::size_t(j * d + k)];
        std::vector<double> z(std::size_t(n), 0.0);
        double zmax = -1e300, sum = 0.0;
        for (int t = sinks; t < n; ++t) {
          const auto& k = ref.keys[std::size_t(l)][std::size_t(t)];
          double lin = 0.0, quad = 0.0;
          for (int i = 0; i < d; ++i) {
            lin += mu2[std::size_t(i)] * k[std::size_t(g * d + i)];
            for (int j = 0; j < d; ++j) quad += k[std::size_t(g * d + i)] * c2[std::size_t(i * d + j)] * k[std::size_t(g * d + j)];
          }
          z[std::size_t(t)] = lin / std::sqrt(double(d)) + quad / (2.0 * d);
          zmax = std::max(zmax, z[std::size_t(t)]);
        }
        for (int t = sinks; t < n; ++t) sum += std::exp(z[std::size_t(t)] - zmax);
        for (int t = sinks; t < n; ++t) mass[std::size_t(t)] += std::exp(z[std::size_t(t)] - zmax) / sum / G;
      }
      const int group = l * KV + g;
      const auto& grp = f.groups[std::size_t(group)];
      double best = 0.0;
      for (int t = sinks; t < n; ++t) {
        const double want = mass[std::size_t(t)] * ref.value_norm[std::size_t(l)][std::size_t(g)][std::size_t(t)];
        best = std::max(best, want);
        const double got = f.expected_attention[std::size_t(grp.row_begin + t)];
        worst = std::max(worst, std::fabs(got - want) / want);
      }
      for (int t = 0; t < sinks; ++t)  // sinks carry the head's largest score
        CHECK(f.expected_attention[std::size_t(grp.row_begin + t)] == doctest::Approx(best).epsilon(1e-4));
    }
  MESSAGE("expected attention: worst relative error " << worst);
  CHECK(worst < 1e-4);

  // The policy keeps the sinks and the top of the score; without statistics it refuses.
  dc::ExpectedAttentionPolicy policy(sinks, future);
  std::vector<float> s(std::size_t(f.size));
  policy.score(f, 8, s);
  CHECK(s[0] == INFINITY);
  const auto plain = dc::gather_features(model.context(), model.make_cache(4), dc::Granularity::head);
  std::vector<float> none;
  CHECK_THROWS_WITH_AS(policy.score(plain, 1, none), doctest::Contains("no expected attention"), dc::Error);
}
