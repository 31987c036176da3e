// Fidelity metrics against exact enumeration, the corpus windowing rule, and that a shared
// prefill adopted by EvictingDecoder behaves exactly like prefilling per policy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <distillcache/distillcache.hpp>

#include "../support/byte_tokenizer.hpp"
#include "../support/temp_dir.hpp"

TEST_CASE("KL, top-1 agreement and perplexity ratio equal exact enumeration") {
  const std::vector<float> full{1.0f, 2.0f, 0.5f, -1.0f}, evicted{0.0f, 2.5f, 0.5f, 3.0f};
  double zp = 0, zq = 0;
  for (int i = 0; i < 4; ++i) {
    zp += std::exp(double(full[std::size_t(i)]));
    zq += std::exp(double(evicted[std::size_t(i)]));
  }
  double kl = 0;
  for (int i = 0; i < 4; ++i) {
    const double p = std::exp(double(full[std::size_t(i)])) / zp, q = std::exp(double(evicted[std::size_t(i)])) / zq;
    kl += p * std::log(p / q);
  }
  CHECK(dc::kl_divergence(full, evicted) == doctest::Approx(kl).epsilon(1e-6));
  CHECK(dc::kl_divergence(full, full) == 0.0);

  dc::FidelityTotals t;
  t.add(full, evicted, 1);  // argmax 1 vs 3: disagree
  t.add(full, full, 0);
  CHECK(t.steps == 2);
  CHECK(t.top1_agreement() == doctest::Approx(0.5));
  CHECK(t.kl_mean() == doctest::Approx(kl / 2).epsilon(1e-6));
  const double nll_p = std::log(zp) - 2.0, nll_q = std::log(zq) - 2.5, nll_p0 = std::log(zp) - 1.0;
  CHECK(t.ppl_ratio() == doctest::Approx(std::exp((nll_q + nll_p0 - nll_p - nll_p0) / 2)).epsilon(1e-6));
  const std::vector<float> nan_row{0.0f, NAN, 0.0f, 0.0f};
  CHECK_THROWS_WITH_AS(t.add(full, nan_row, 0), doctest::Contains("NaN"), dc::Error);
  CHECK_THROWS_WITH_AS(t.add(full, evicted, 9), doctest::Contains("outside the vocabulary"), dc::Error);
}

TEST_CASE("token windows: sorted .txt files, back-to-back windows, remainder dropped") {
  dc_test::TempDir dir("dc_corpus");
  const dc::Tokenizer tok = dc_test::byte_tokenizer();  // n characters give n tokens
  std::ofstream(dir / "b.txt") << "0123456789";  // 10 tokens: windows [0,4) [4,8)
  std::ofstream(dir / "a.txt") << "abcde";       // 5 tokens: window [0,4)
  std::ofstream(dir / "c.md") << "ignored";
  const auto w = dc::token_windows(tok, dir.path, 4, 10);
  REQUIRE(w.size() == 3);
  CHECK(tok.decode(w[0]) == "abcd");
  CHECK(tok.decode(w[1]) == "0123");
  CHECK(tok.decode(w[2]) == "4567");
  CHECK(dc::token_windows(tok, dir.path, 4, 2).size() == 2);
  CHECK_THROWS_WITH_AS(dc::token_windows(tok, dir / "missing", 4, 2), doctest::Contains("does not exist"), dc::Error);
}

TEST_CASE("adopting a shared prefill equals prefilling per policy") {
  dc::HfModel m = dc::load_hf_model(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  dc::SafetensorsFile f(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied/oracle.safetensors");
  const auto ids = f.read_i32("tokens");
  const std::span<const std::int32_t> prompt = std::span(ids).first(16);
  for (const std::string name : {"h2o", "snapkv", "tova", "knorm"}) {
    CAPTURE(name);
    auto policy = dc::make_baseline_policy(name);
    dc::Budget budget = dc::Budget::of_fraction(0.5);
    budget.chunk = 2;
    dc::EvictingDecoder<dc::cpu> direct(model, *policy, budget, dc::EvictionMode::decode, 16, 8);
    dc::EvictingDecoder<dc::cpu> adopted(model, *policy, budget, dc::EvictionMode::decode, 16, 8);
    direct.prefill(prompt);
    auto shared = model.make_cache(16);
    shared.set_observed_from(policy->observation_start(16));
    const auto logits = model.forward(prompt, shared);
    adopted.adopt_prefill(shared, logits);
    CHECK(direct.cache().host_positions(0) == adopted.cache().host_positions(0));
    for (int t = 16; t < 24; ++t) {
      const auto x = direct.step(ids[std::size_t(t)]);
      const std::vector<float> xa(x.begin(), x.end());
      const auto y = adopted.step(ids[std::size_t(t)]);
      CHECK(std::equal(xa.begin(), xa.end(), y.begin()));
    }
    // A cache observed with the wrong window is refused.
    auto wrong = model.make_cache(16);
    wrong.set_observed_from(3);
    model.forward(prompt, wrong);
    CHECK_THROWS_WITH_AS(adopted.adopt_prefill(wrong, logits), doctest::Contains("observed queries from position 3"),
                         dc::Error);
  }
}

TEST_CASE("the future-attention oracle keeps each group's top-B of the continuation's attention, prefill only") {
  dc::HfModel m = dc::load_hf_model(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  dc::SafetensorsFile file(std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied/oracle.safetensors");
  const auto ids = file.read_i32("tokens");
  const std::span<const std::int32_t> prompt = std::span(ids).first(16), continuation = std::span(ids).subspan(16, 8);
  const std::vector<dc::Granularity> granularities = {dc::Granularity::head, dc::Granularity::shared};
  dc::FutureAttentionOracle oracle;
  oracle.prepare(model, prompt, continuation, granularities);
  auto cache = model.make_cache(16);
  cache.set_observed_from(0);
  model.forward(prompt, cache);
  for (auto g : granularities) {
    CAPTURE(dc::granularity_name(g));
    const dc::TokenFeatures f = dc::gather_features(model.context(), cache, g);
    const auto shares = dc::future_attention_shares(model, cache, f, continuation);
    std::vector<float> scores(std::size_t(f.size));
    oracle.score(f, 4, scores);
    CHECK(scores == shares);
  }
  // Through the evaluator: the budget-8 students keep, per (layer, KV head), the 8 rows of largest share.
  dc::FidelityEvaluator<dc::cpu, float> eval(model, {&oracle}, {dc::Budget::of_fraction(0.5)},
                                             dc::EvictionMode::prefill, {dc::Granularity::head});
  const dc::TokenFeatures f = dc::gather_features(model.context(), cache, dc::Granularity::head);
  const auto shares = dc::future_attention_shares(model, cache, f, continuation);
  eval.on_compressed([&](std::size_t, const dc::KVCache<dc::cpu>& kept) {
    for (const dc::FeatureGroup& g : f.groups) {
      const auto& positions = kept.host_positions(g.layer_begin, g.head_begin);
      REQUIRE(positions.size() == 8);
      float lowest_kept = INFINITY, highest_dropped = -INFINITY;
      for (int r = g.row_begin; r < g.row_end; ++r) {
        const bool in = std::find(positions.begin(), positions.end(), f.position[std::size_t(r)]) != positions.end();
        (in ? lowest_kept : highest_dropped) = in ? std::min(lowest_kept, shares[std::size_t(r)])
                                                  : std::max(highest_dropped, shares[std::size_t(r)]);
      }
      CHECK(lowest_kept >= highest_dropped);
    }
  });
  eval.add_context(prompt, continuation, [](std::size_t) {});
  CHECK(eval.total(0, 0, 0).steps == 8);

  // Rows it was not prepared for (what a decode-mode eviction would ask about) are refused.
  auto longer = model.make_cache(17);
  longer.set_observed_from(0);
  model.forward(std::span(ids).first(17), longer);
  const dc::TokenFeatures other = dc::gather_features(model.context(), longer, dc::Granularity::head);
  std::vector<float> scores(std::size_t(other.size));
  CHECK_THROWS_WITH_AS(oracle.score(other, 4, scores), doctest::Contains("use --mode prefill"), dc::Error);
  dc::FutureAttentionOracle unprepared;
  std::vector<float> head_scores(std::size_t(f.size));
  CHECK_THROWS_WITH_AS(unprepared.score(f, 4, head_scores), doctest::Contains("not prepared"), dc::Error);
}
