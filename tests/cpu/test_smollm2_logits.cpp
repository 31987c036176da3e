// The real model: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32) on 256 tokens of real
// text against Hugging Face transformers loading the same file (tests/fixtures/smollm2, made by
// tools/make_smollm2_fixtures.py). Tolerance: max abs error 2e-3 on the oracle's top-64 logits
// and the row's logsumexp, identical argmax, at every fixture position.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf_model.hpp>

#include "../support/smollm2_path.hpp"

TEST_CASE("SmolLM2-135M logits match Hugging Face on real text") {
  const auto path = dc_test::smollm2_gguf_path();
  if (!std::filesystem::exists(path)) FAIL("missing " << path << ": run scripts/fetch_model.sh");
  dc::SafetensorsFile oracle(std::string(DC_FIXTURE_DIR) + "/smollm2/logits.safetensors");
  const auto tokens = oracle.read_i32("tokens");
  const auto positions = oracle.read_i32("positions");
  const auto top_ids = oracle.read_i32("top_ids");
  const auto top_logits = oracle.read_float("top_logits");
  const auto lse = oracle.read_float("logsumexp");
  const auto argmax = oracle.read_i32("argmax");
  const std::size_t top = std::size_t(top_logits.dim(1));

  dc::HfModel m = dc::load_gguf_model(path);
  REQUIRE(m.config.num_layers == 30);
  const int vocab = m.config.vocab_size;
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  auto cache = model.make_cache(int(tokens.size()));
  const auto logits = model.forward(tokens, cache, dc::LogitsFor::all);

  float worst = 0.0f, worst_lse = 0.0f;
  for (std::size_t p = 0; p < positions.size(); ++p) {
    const float* row = logits.data() + std::size_t(positions[p]) * std::size_t(vocab);
    for (std::size_t k = 0; k < top; ++k)
      worst = std::fmax(worst, std::fabs(row[top_ids[p * top + k]] - top_logits.data()[p * top + k]));
    dc::math::OnlineSoftmax s;
    for (int v = 0; v < vocab; ++v) s.push(row[v]);
    worst_lse = std::fmax(worst_lse, std::fabs(s.log_sum_exp() - lse.data()[p]));
    CHECK_MESSAGE(dc::argmax(std::span<const float>(row, std::size_t(vocab))) == argmax[p],
                  "argmax differs at position " << positions[p]);
  }
  MESSAGE("SmolLM2 vs Hugging Face: max abs error " << worst << " (top-64 logits), " << worst_lse
                                                    << " (logsumexp)");
  CHECK(worst < 2e-3f);
  CHECK(worst_lse < 2e-3f);
}
