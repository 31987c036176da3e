// The CPU transformer with Gemma 3's switches against Hugging Face's Gemma3ForCausalLM
// (tests/fixtures/tiny_gemma3*/, from tools/make_gemma_fixtures.py). Tolerance: max abs error
// 1e-4, as for Llama/Mistral (test_hf_parity.cpp): both sides compute in fp32 from the same fp32
// (or bf16-upcast) weights, so only summation order and libm rounding differ.
// The fixtures have 4 layers (sliding, sliding, full, sliding), window 8 < 24 tokens, RoPE bases
// 1e4 local / 1e6 global and query_pre_attn_scalar 24, so each of those matters (checked below
// by switching it off) and each way through the sequence must reproduce HF's one forward.
#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/safetensors.hpp>

#include "../support/hf_oracle.hpp"

namespace {

constexpr float kTolerance = dc_test::kHfParityTolerance;
using dc_test::load_oracle;
using dc_test::Oracle;
using dc_test::row_error;
std::string folder_of(const std::string& name) { return dc_test::fixture_folder(name); }

dc::Transformer<dc::cpu> make_model(const std::string& folder, int max_chunk,
                                    void (*edit)(dc::ModelConfig&) = nullptr) {
  dc::HfModel m = dc::load_hf_model(folder);
  if (edit) edit(m.config);
  return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), max_chunk);
}

void check_model(const std::string& name) { dc_test::check_hf_parity(name); }

// Full-prefill logits with one config switch changed.
std::vector<float> logits_with(const Oracle& o, void (*edit)(dc::ModelConfig&)) {
  auto model = make_model(folder_of("tiny_gemma3"), 64, edit);
  auto cache = model.make_cache(int(o.tokens.size()));
  return model.forward(o.tokens, cache, dc::LogitsFor::all);
}

}  // namespace

TEST_CASE("Gemma 3 config.json: layer kinds, RoPE bases, scales and switches") {
  const dc::ModelConfig c = dc::load_hf_config(folder_of("tiny_gemma3") + "/config.json");
  CHECK(c.architecture == "gemma3");
  CHECK(c.num_layers == 4);
  CHECK(c.head_dim == 32);
  CHECK(c.num_kv_heads == 1);
  CHECK(c.sliding_window == 8);
  CHECK(c.window_of(0) == 8);
  CHECK(c.window_of(1) == 8);
  CHECK(c.window_of(2) == 0);  // the global layer
  CHECK(c.window_of(3) == 8);
  CHECK(c.rope_theta_of(0) == 10000.0f);
  CHECK(c.rope_theta_of(2) == 1000000.0f);
  CHECK(c.attention_scale() == static_cast<float>(1.0 / std::sqrt(24.0)));
  CHECK(c.embedding_scale() == 8.0f);
  CHECK(c.tie_embeddings);
  CHECK(c.qk_norm);
  CHECK(c.sandwich_norms);
  CHECK(c.activation == dc::ModelConfig::Activation::gelu_tanh);
  CHECK(c.final_logit_softcap == 0.0f);
  CHECK(dc::load_hf_config(folder_of("tiny_gemma3_softcap") + "/config.json").final_logit_softcap == 3.0f);
}

TEST_CASE("Gemma 3 config.json without layer_types: every sliding_window_pattern-th layer global") {
  const nlohmann::json j = {{"model_type", "gemma3_text"}, {"vocab_size", 16},  {"hidden_size", 8},
                            {"intermediate_size", 8},      {"num_hidden_layers", 7},
                            {"num_attention_heads", 2},    {"num_key_value_heads", 1},
                            {"head_dim", 4},               {"max_position_embeddings", 32},
                            {"sliding_window", 4},         {"sliding_window_pattern", 3},
                            {"rope_theta", 5e5},           {"rope_local_base_freq", 2e4}};
  const dc::ModelConfig c = dc::parse_hf_config(j, "test");
  for (int l = 0; l < 7; ++l) CHECK(c.is_sliding(l) == (l != 2 && l != 5));
  CHECK(c.rope_theta_of(0) == 2e4f);
  CHECK(c.rope_theta_of(2) == 5e5f);
  CHECK(c.attention_scale() == 1.0f / 16.0f);  // query_pre_attn_scalar defaults to 256
  nlohmann::json scaled = j;
  scaled["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  CHECK_THROWS_WITH_AS(dc::parse_hf_config(scaled, "test"), doctest::Contains("RoPE scaling is not implemented"),
                       dc::Error);
  nlohmann::json capped = j;
  capped["attn_logit_softcapping"] = 50.0;
  CHECK_THROWS_WITH_AS(dc::parse_hf_config(capped, "test"), doctest::Contains("attention soft-capping"), dc::Error);
}

TEST_CASE("Gemma 3, fp32 weights, tied embeddings, matches Hugging Face") { check_model("tiny_gemma3"); }

TEST_CASE("Gemma 3, bf16 weights, final logit soft-capping 3, matches Hugging Face") {
  check_model("tiny_gemma3_softcap");
}

TEST_CASE("Gemma 3: each switch matters, so the fixture would catch its absence") {
  const Oracle o = load_oracle(folder_of("tiny_gemma3"));
  const std::int64_t vocab = o.logits.dim(1);
  const std::vector<float> base = logits_with(o, nullptr);
  REQUIRE(row_error(o, 0, base) < kTolerance);

  // No window on the sliding layers: positions < 8 see the same keys, later ones do not.
  const std::vector<float> no_window = logits_with(o, [](dc::ModelConfig& c) { c.sliding_window = 0; });
  CHECK(row_error(o, 0, std::vector<float>(no_window.begin(), no_window.begin() + 8 * vocab)) < kTolerance);
  CHECK(row_error(o, 8, std::vector<float>(no_window.begin() + 8 * vocab, no_window.end())) > 0.05f);
  // Every layer windowed (the global layer too), or the local RoPE base used globally.
  CHECK(row_error(o, 0, logits_with(o, [](dc::ModelConfig& c) { c.sliding_layers.assign(4, true); })) > 0.05f);
  CHECK(row_error(o, 0, logits_with(o, [](dc::ModelConfig& c) { c.rope_theta_local = 0.0f; })) > 0.05f);
  // The Llama attention scale 1/sqrt(head_dim) instead of query_pre_attn_scalar^-0.5.
  CHECK(row_error(o, 0, logits_with(o, [](dc::ModelConfig& c) { c.query_pre_attn_scalar = 0.0f; })) > 0.05f);
}

TEST_CASE("Gemma 3: batched decoding equals single-sequence decoding, bit for bit") {
  const Oracle o = load_oracle(folder_of("tiny_gemma3"));
  auto model = make_model(folder_of("tiny_gemma3"), 8);
  const std::span<const std::int32_t> tokens(o.tokens);
  const std::int64_t vocab = o.logits.dim(1);
  // Two sequences of 12 and 10 prompt tokens (both past the window of 8), then 3 steps together.
  auto a = model.make_cache(24), b = model.make_cache(24);
  auto ra = model.make_cache(24), rb = model.make_cache(24);
  model.forward(tokens.first(12), a, dc::LogitsFor::none);
  model.forward(tokens.subspan(2, 10), b, dc::LogitsFor::none);
  model.forward(tokens.first(12), ra, dc::LogitsFor::none);
  model.forward(tokens.subspan(2, 10), rb, dc::LogitsFor::none);
  for (int step = 0; step < 3; ++step) {
    const std::vector<std::int32_t> next{o.tokens[std::size_t(12 + step)], o.tokens[std::size_t(20 + step)]};
    std::vector<dc::KVCache<dc::cpu>*> caches{&a, &b};
    std::vector<float> batch(std::size_t(2 * vocab));
    model.forward_batch(next, caches, batch);
    const auto one = model.forward(std::span<const std::int32_t>(next).first(1), ra);
    const auto two = model.forward(std::span<const std::int32_t>(next).subspan(1, 1), rb);
    CHECK(std::equal(one.begin(), one.end(), batch.begin()));
    CHECK(std::equal(two.begin(), two.end(), batch.begin() + vocab));
  }
}

TEST_CASE("Gemma 3: the transformer refuses weights without the norms its config needs") {
  dc::HfModel m = dc::load_hf_model(folder_of("tiny_gemma3"));
  dc::HostWeights no_q_norm = dc::load_hf_model(folder_of("tiny_gemma3")).weights;
  no_q_norm.layers[1].q_norm = {};
  CHECK_THROWS_WITH_AS(dc::Transformer<dc::cpu>(m.config, std::move(no_q_norm), 8),
                       doctest::Contains("no q_norm/k_norm"), dc::Error);
  m.weights.layers[3].ffn_out_norm = {};
  CHECK_THROWS_WITH_AS(dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 8),
                       doctest::Contains("no attn_out_norm/ffn_out_norm"), dc::Error);
}
