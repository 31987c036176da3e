#pragma once
// Hugging Face logit oracles (tests/fixtures/*/oracle.safetensors, made by tools/make_fixtures.py
// and tools/make_gemma_fixtures.py from the same checkpoints) and the three-path parity check
// every architecture's fixtures go through: (a) one prefill, (b) token-by-token decode, (c)
// chunked prefill then decode, each against HF's one full-sequence forward. Tolerance: max abs
// error 1e-4 (both sides fp32 from the same weights: only summation order and libm differ).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/safetensors.hpp>
#include <distillcache/model/transformer.hpp>

namespace dc_test {

inline constexpr float kHfParityTolerance = 1e-4f;

struct Oracle {
  std::vector<std::int32_t> tokens;
  dc::Tensor<float, dc::cpu> logits;  // [seq, vocab]
};

inline std::string fixture_folder(const std::string& name) { return std::string(DC_FIXTURE_DIR) + "/" + name; }

inline Oracle load_oracle(const std::string& folder) {
  dc::SafetensorsFile f(folder + "/oracle.safetensors");
  return {f.read_i32("tokens"), f.read_float("logits")};
}

// Max abs error of rows [first, first + rows) of got (host, [rows, vocab]) against the oracle.
inline float row_error(const Oracle& o, int first, const std::vector<float>& got) {
  const std::int64_t vocab = o.logits.dim(1);
  float worst = 0.0f;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::fmax(worst, std::fabs(got[i] - o.logits.data()[first * vocab + std::int64_t(i)]));
  return worst;
}

inline void check_hf_parity(const std::string& name) {
  const std::string folder = fixture_folder(name);
  const Oracle o = load_oracle(folder);
  const int seq = int(o.tokens.size());
  const std::span<const std::int32_t> tokens(o.tokens);

  auto make = [&](int max_chunk) {
    dc::HfModel m = dc::load_hf_model(folder);
    return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), max_chunk);
  };

  SUBCASE("(a) one full prefill") {
    auto model = make(64);
    auto cache = model.make_cache(seq);
    const float err = row_error(o, 0, model.forward(tokens, cache, dc::LogitsFor::all));
    MESSAGE(name << " full prefill: max abs error " << err);
    CHECK(err < kHfParityTolerance);
  }
  SUBCASE("(b) token-by-token decode") {
    auto model = make(1);
    auto cache = model.make_cache(seq);
    float worst = 0.0f;
    for (int t = 0; t < seq; ++t)
      worst = std::fmax(worst, row_error(o, t, model.forward(tokens.subspan(std::size_t(t), 1), cache)));
    MESSAGE(name << " token-by-token decode: max abs error " << worst);
    CHECK(worst < kHfParityTolerance);
  }
  SUBCASE("(c) chunked prefill of 16 tokens in chunks of 5, then decode") {
    auto model = make(5);
    auto cache = model.make_cache(seq);
    const int prefill = 16;
    float worst = row_error(o, 0, model.forward(tokens.first(prefill), cache, dc::LogitsFor::all));
    for (int t = prefill; t < seq; ++t)
      worst = std::fmax(worst, row_error(o, t, model.forward(tokens.subspan(std::size_t(t), 1), cache)));
    MESSAGE(name << " chunked prefill + decode: max abs error " << worst);
    CHECK(worst < kHfParityTolerance);
    CHECK(cache.length() == seq);
  }
}

}  // namespace dc_test
