// The CPU transformer against Hugging Face transformers' logits (tests/fixtures/*/oracle.*,
// made by tools/make_fixtures.py from the same checkpoints). Tolerance: max abs error 1e-4.
// Three ways through the same sequence must all agree with the one HF full-sequence forward:
// (a) one prefill, (b) token-by-token decode, (c) chunked prefill then decode.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <span>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/safetensors.hpp>

#include "../support/hf_oracle.hpp"
#include "../support/threads.hpp"

namespace {

constexpr float kTolerance = dc_test::kHfParityTolerance;
using dc_test::load_oracle;
using dc_test::Oracle;
using dc_test::row_error;
void check_model(const std::string& name) { dc_test::check_hf_parity(name); }

}  // namespace

TEST_CASE("Mistral, full attention, fp32 weights, matches Hugging Face") { check_model("tiny_mistral"); }

TEST_CASE("Mistral, sliding window 8 < sequence, sharded fp16 weights, matches Hugging Face") {
  check_model("tiny_mistral_swa");
}

TEST_CASE("Llama, GQA group 4, tied embeddings, bf16 weights, matches Hugging Face") {
  check_model("tiny_llama_tied");
}

TEST_CASE("the sliding window matters: disabling it changes the logits past the window") {
  const std::string folder = std::string(DC_FIXTURE_DIR) + "/tiny_mistral_swa";
  const Oracle o = load_oracle(folder);
  dc::HfModel m = dc::load_hf_model(folder);
  REQUIRE(m.config.sliding_window == 8);
  m.config.sliding_window = 0;
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  auto cache = model.make_cache(int(o.tokens.size()));
  auto logits = model.forward(o.tokens, cache, dc::LogitsFor::all);
  const std::vector<float> early(logits.begin(), logits.begin() + 8 * 256);
  CHECK(row_error(o, 0, early) < kTolerance);  // positions < window are unaffected
  const std::vector<float> late(logits.begin() + 8 * 256, logits.end());
  CHECK(row_error(o, 8, late) > 0.05f);
}

TEST_CASE("forward rejects bad tokens, a full cache and contexts past max_position") {
  dc::HfModel m = dc::load_hf_model(std::string(DC_FIXTURE_DIR) + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 8);
  auto cache = model.make_cache(4);
  const std::vector<std::int32_t> bad{1, 256};
  CHECK_THROWS_WITH_AS(model.forward(bad, cache), doctest::Contains("outside vocabulary"), dc::Error);
  const std::vector<std::int32_t> negative{-1};
  CHECK_THROWS_AS(model.forward(negative, cache), dc::Error);
  CHECK_THROWS_WITH_AS(model.forward(std::vector<std::int32_t>{}, cache), doctest::Contains("no tokens"),
                       dc::Error);
  const std::vector<std::int32_t> five{1, 2, 3, 4, 5};
  CHECK_THROWS_WITH_AS(model.forward(five, cache), doctest::Contains("KV cache full"), dc::Error);
  CHECK_THROWS_WITH_AS(model.make_cache(100000), doctest::Contains("max_position"), dc::Error);
  auto other = dc::KVCache<dc::cpu>(dc::cache_shape_of(dc::ModelConfig::mistral_7b_v0_1()), 4);
  CHECK_THROWS_WITH_AS(model.forward(five, other), doctest::Contains("does not match"), dc::Error);
}

TEST_CASE("bf16 CPU weights: exact for a bf16 checkpoint, close to Hugging Face for fp32 ones") {
  // tiny_llama_tied is stored in bf16, so rounding its weights to bf16 changes nothing: the bf16
  // path must meet the fp32 tolerance (the compiler may contract the widened loads into FMAs
  // differently, so the last bits can differ; measured 1.1e-5 on logits around 30).
  for (const std::string name : {"tiny_llama_tied", "tiny_mistral", "tiny_mistral_swa"}) {
    CAPTURE(name);
    const std::string folder = std::string(DC_FIXTURE_DIR) + "/" + name;
    const Oracle o = load_oracle(folder);
    dc::HfModel m = dc::load_hf_model(folder);
    dc::Transformer<dc::cpu, dc::bf16> half(m.config, dc::convert_host_weights<dc::bf16>(m.weights), 5);
    dc::Transformer<dc::cpu> full(m.config, std::move(m.weights), 5);
    const int seq = int(o.tokens.size());
    auto cache_half = half.make_cache(seq), cache_full = full.make_cache(seq);
    const auto got = half.forward(o.tokens, cache_half, dc::LogitsFor::all);
    const auto want = full.forward(o.tokens, cache_full, dc::LogitsFor::all);
    const float err = row_error(o, 0, got);
    MESSAGE(name << " bf16 weights: max abs error vs Hugging Face " << err);
    if (name == "tiny_llama_tied") {
      CHECK(err < kTolerance);
    } else {
      CHECK(got != want);      // the rounding is real...
      CHECK(err < 2e-2f);      // ...and small: bf16 keeps 8 bits, logits here are O(1)
    }
  }
}

#if defined(_OPENMP)
TEST_CASE("logits are bitwise identical for 1 and 2 OpenMP threads") {
  const std::string folder = std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied";
  const Oracle o = load_oracle(folder);
  auto run = [&](int threads) {
    return dc_test::with_threads(threads, [&] {
      dc::HfModel m = dc::load_hf_model(folder);
      dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 7);
      auto cache = model.make_cache(int(o.tokens.size()));
      return model.forward(o.tokens, cache, dc::LogitsFor::all);
    });
  };
  CHECK(run(1) == run(2));
}
#endif
