// Eviction on a model with local sliding-window layers (the tiny Gemma 3 fixture: layers
// sliding, sliding, full, sliding; window 8; tests/fixtures/tiny_gemma3). What must hold:
// trimming a local layer to what its next query sees changes no logit (the mask hides the rest);
// policies choose keep-sets for the global layer alone, at every granularity, and the budget
// counts its slots; an evicting decoder's logits are those of a cache where only the global
// layer lost the evicted tokens and the local layers kept everything.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/safetensors.hpp>

#include "../support/hf_oracle.hpp"

namespace {

constexpr int kWindow = 8, kGlobal = 2, kLayers = 4;

dc::Transformer<dc::cpu> tiny_gemma() {
  dc::HfModel m = dc::load_hf_model(dc_test::fixture_folder("tiny_gemma3"));
  return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 64);
}

std::vector<std::int32_t> tokens() { return dc_test::load_oracle(dc_test::fixture_folder("tiny_gemma3")).tokens; }

}  // namespace

TEST_CASE("the tiny Gemma cache knows its local and global layers") {
  auto model = tiny_gemma();
  const auto cache = model.make_cache(32);
  for (int l = 0; l < kLayers; ++l) {
    CAPTURE(l);
    CHECK(cache.window(l) == (l == kGlobal ? 0 : kWindow));
    CHECK(cache.evictable(l) == (l == kGlobal));
  }
  CHECK(cache.evictable_layers() == 1);
  CHECK(cache.first_evictable_layer() == kGlobal);
  // A model whose every layer is windowed (Mistral v0.1) evicts all of them under the window.
  dc::CacheShape all = cache.shape();
  all.layer_windows.assign(kLayers, kWindow);
  const dc::KVCache<dc::cpu> windowed(all, 32);
  CHECK(windowed.evictable_layers() == kLayers);
}

TEST_CASE("trimming local layers to their window changes no logit") {
  auto model = tiny_gemma();
  const auto ids = tokens();
  REQUIRE(ids.size() > std::size_t(2 * kWindow));
  const int n = int(ids.size());
  auto plain = model.make_cache(n), trimmed = model.make_cache(n);
  std::vector<float> a(std::size_t(model.config().vocab_size)), b(a.size());
  for (int t = 0; t < n; ++t) {
    CAPTURE(t);
    const auto token = std::span<const std::int32_t>(ids).subspan(std::size_t(t), 1);
    model.forward(token, plain, a);
    model.forward(token, trimmed, b);
    trimmed.trim_to_windows(model.context());
    CHECK(a == b);  // bitwise: masked slots add exact zeros, so dropping them changes nothing
    for (int l = 0; l < kLayers; ++l)
      CHECK(trimmed.length(l) == (l == kGlobal ? t + 1 : std::min(t + 1, kWindow - 1)));
  }
  // Only what the next query sees remains (it adds itself), in position order.
  CHECK(trimmed.host_positions(0).front() == n - kWindow + 1);
  CHECK(trimmed.host_positions(0).back() == n - 1);
  CHECK(trimmed.bytes_used() < plain.bytes_used());
}

TEST_CASE("features and keep-sets cover only the global layer at every granularity") {
  auto model = tiny_gemma();
  const auto ids = tokens();
  const int n = 20;
  auto cache = model.make_cache(n);
  cache.set_observed_from(0);
  model.forward(std::span<const std::int32_t>(ids).first(n), cache);
  const auto shared = dc::gather_features(model.context(), cache, dc::Granularity::shared);
  const auto layer = dc::gather_features(model.context(), cache, dc::Granularity::layer);
  const auto head = dc::gather_features(model.context(), cache, dc::Granularity::head);
  for (const dc::TokenFeatures* f : {&shared, &layer, &head}) {
    f->validate();
    REQUIRE(f->num_groups() == 1);
    CHECK(f->size == n);
  }
  CHECK(layer.groups[0].layer_begin == kGlobal);
  CHECK(head.groups[0].layer_begin == kGlobal);
  // One global layer: the shared group's sums are that layer's alone, not the local layers'.
  CHECK(shared.columns == layer.columns);
  CHECK(shared.accumulated_mass == layer.accumulated_mass);
}

TEST_CASE("an evicting decoder on Gemma evicts the global layer and trims the local ones") {
  auto model = tiny_gemma();
  const auto ids = tokens();
  const int prompt = 16, budget = 6;
  const int steps = int(ids.size()) - prompt;
  REQUIRE(steps >= 4);
  for (const auto g : {dc::Granularity::shared, dc::Granularity::layer, dc::Granularity::head}) {
    CAPTURE(dc::granularity_name(g));
    auto policy = dc::make_baseline_policy("h2o");
    dc::Budget b = dc::Budget::of_tokens(budget);
    b.chunk = 2;
    dc::EvictingDecoder<dc::cpu> dec(model, *policy, b, dc::EvictionMode::decode, prompt, steps, g);
    const auto prompt_ids = std::span<const std::int32_t>(ids).first(prompt);
    const auto prefilled = dec.prefill(prompt_ids);
    const std::vector<float> got(prefilled.begin(), prefilled.end());
    CHECK(dec.cache().length(kGlobal) == budget);
    for (int l = 0; l < kLayers; ++l)
      if (l != kGlobal) CHECK(dec.cache().length(l) == kWindow - 1);

    // Oracle: the full prefill with only the global layer compacted to the decoder's keep-set.
    auto oracle = model.make_cache(prompt + steps);
    std::vector<float> want(got.size());
    model.forward(prompt_ids, oracle, want);
    CHECK(got == want);
    // Gives the oracle's global layer the decoder's keep-set (its slots, found by position).
    auto follow_decoder = [&] {
      std::vector<std::int32_t> keep;
      const auto& held = oracle.host_positions(kGlobal);
      for (std::int32_t p : dec.cache().host_positions(kGlobal))
        keep.push_back(std::int32_t(std::find(held.begin(), held.end(), p) - held.begin()));
      oracle.compact_layer(model.context(), kGlobal, keep);
    };
    follow_decoder();

    int evictions = dec.evictions();
    for (int t = prompt; t < prompt + steps; ++t) {
      CAPTURE(t);
      const auto step_logits = dec.step(ids[std::size_t(t)]);
      model.forward(std::span<const std::int32_t>(ids).subspan(std::size_t(t), 1), oracle, want);
      double worst = 0.0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, double(std::fabs(step_logits[i] - want[i])));
      CHECK(worst == 0.0);
      CHECK(dec.cache().evictable_length() <= budget + b.chunk);
      for (int l = 0; l < kLayers; ++l)
        if (l != kGlobal) CHECK(dec.cache().length(l) <= kWindow + b.chunk);
      if (dec.evictions() > evictions) {
        evictions = dec.evictions();
        follow_decoder();
      }
    }
    CHECK(dec.evictions() > 1);
  }
}
