// The real model: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32) on 256 tokens of real
// text against Hugging Face transformers loading the same file (tests/fixtures/smollm2, made by
// tools/make_smollm2_fixtures.py). Tolerance: max abs error 2e-3 on the oracle's top-64 logits
// and the row's logsumexp, identical argmax, at every fixture position.
// $DC_SMOLLM2_TEST_TOKENS=N checks only the first N tokens (the model is causal, so their logits
// are the same as in the whole run): the sanitizer stage of scripts/test.sh sets it, since 256
// tokens through 135M parameters take minutes there.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <span>
#include <vector>
#include <filesystem>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf_model.hpp>

#include "../support/smollm2_path.hpp"

namespace {

struct Oracle {
  dc::SafetensorsFile file{std::string(DC_FIXTURE_DIR) + "/smollm2/logits.safetensors"};
  std::vector<std::int32_t> tokens = file.read_i32("tokens");
  std::vector<std::int32_t> positions = file.read_i32("positions");
  std::vector<std::int32_t> top_ids = file.read_i32("top_ids");
  dc::Tensor<float, dc::cpu> top_logits = file.read_float("top_logits");
  dc::Tensor<float, dc::cpu> lse = file.read_float("logsumexp");
  std::vector<std::int32_t> argmax = file.read_i32("argmax");

  // Keeps the first $DC_SMOLLM2_TEST_TOKENS tokens and the fixture positions among them.
  Oracle() {
    const char* env = std::getenv("DC_SMOLLM2_TEST_TOKENS");
    if (!env || !*env) return;
    const std::size_t n = std::stoul(env);
    REQUIRE(n >= 1);
    if (n >= tokens.size()) return;
    tokens.resize(n);
    std::size_t kept = 0;
    while (kept < positions.size() && std::size_t(positions[kept]) < n) ++kept;
    REQUIRE(kept >= 1);
    positions.resize(kept);
  }
};

struct Agreement {
  float worst = 0.0f, worst_lse = 0.0f;  // max abs error: top-64 logits, logsumexp
  int argmax_same = 0, rows = 0;
  std::vector<float> logits;  // [tokens, vocab]
};

template <class W>
Agreement compare(const Oracle& o, const dc::ModelConfig& config, dc::Weights<dc::cpu, W> weights,
                  dc::DType kv_type = dc::DType::f32) {
  const int vocab = config.vocab_size;
  dc::Transformer<dc::cpu, W> model(config, std::move(weights), 64);
  auto cache = model.make_cache(int(o.tokens.size()), kv_type);
  Agreement a;
  a.logits = model.forward(o.tokens, cache, dc::LogitsFor::all);
  const std::size_t top = std::size_t(o.top_logits.dim(1));
  for (std::size_t p = 0; p < o.positions.size(); ++p) {
    const float* row = a.logits.data() + std::size_t(o.positions[p]) * std::size_t(vocab);
    for (std::size_t k = 0; k < top; ++k)
      a.worst = std::fmax(a.worst, std::fabs(row[o.top_ids[p * top + k]] - o.top_logits.data()[p * top + k]));
    const std::span<const float> r(row, std::size_t(vocab));
    a.worst_lse = std::fmax(a.worst_lse, std::fabs(dc::log_sum_exp(r) - o.lse.data()[p]));
    a.argmax_same += dc::argmax(r) == o.argmax[p];
    ++a.rows;
  }
  return a;
}

dc::HfModel load_smollm2() {
  const auto path = dc_test::smollm2_gguf_path();
  if (!std::filesystem::exists(path)) FAIL("missing " << path << ": run scripts/fetch_model.sh");
  dc::HfModel m = dc::load_gguf_model(path);
  REQUIRE(m.config.num_layers == 30);
  return m;
}

// The fp32 run, made once for both test cases (loading and running the model dominate the
// test's time, minutes under the sanitizers).
const Agreement& fp32_agreement(const Oracle& o) {
  static const Agreement a = [&] {
    dc::HfModel m = load_smollm2();
    return compare(o, m.config, std::move(m.weights));
  }();
  return a;
}

// How close another weight storage's run is to the fp32 run: mean and max KL(fp32 || other) over
// every position, and how often the argmax agrees.
struct Closeness {
  double mean_kl = 0.0, max_kl = 0.0;
  int same_argmax = 0;
};
Closeness closeness(const Oracle& o, const Agreement& full, const Agreement& other) {
  const std::size_t vocab = full.logits.size() / o.tokens.size();
  Closeness c;
  for (std::size_t t = 0; t < o.tokens.size(); ++t) {
    const auto p = std::span<const float>(full.logits).subspan(t * vocab, vocab);
    const auto q = std::span<const float>(other.logits).subspan(t * vocab, vocab);
    const double d = dc::kl_divergence(p, q);
    c.mean_kl += d / double(o.tokens.size());
    c.max_kl = std::max(c.max_kl, d);
    c.same_argmax += dc::argmax(p) == dc::argmax(q);
  }
  return c;
}

}  // namespace

TEST_CASE("SmolLM2-135M logits match Hugging Face on real text") {
  const Oracle o;
  const Agreement& a = fp32_agreement(o);
  MESSAGE("SmolLM2 vs Hugging Face: max abs error " << a.worst << " (top-64 logits), " << a.worst_lse
                                                    << " (logsumexp)");
  CHECK(a.argmax_same == a.rows);
  CHECK(a.worst < 2e-3f);
  CHECK(a.worst_lse < 2e-3f);
}

// bf16 weights are an approximation of the checkpoint, so the bar is the distribution: the mean
// KL(fp32 || bf16) over all the fixture's tokens, and the argmax at the oracle's positions.
TEST_CASE("SmolLM2-135M with bf16 weights stays close to the fp32 model") {
  const Oracle o;
  const Agreement& full = fp32_agreement(o);
  dc::HfModel m = load_smollm2();
  const Agreement half = compare(o, m.config, dc::convert_host_weights<dc::bf16>(std::move(m.weights)));
  const Closeness c = closeness(o, full, half);
  MESSAGE("SmolLM2 bf16 vs fp32 weights over " << o.tokens.size() << " positions: mean KL " << c.mean_kl
          << " nats, max " << c.max_kl << ", same argmax " << c.same_argmax << "; vs Hugging Face: max abs error "
          << half.worst << " (top-64 logits), argmax " << half.argmax_same << "/" << half.rows);
  CHECK(c.mean_kl < 1e-3);
  CHECK(c.same_argmax >= int(o.tokens.size()) * 95 / 100);
}

// The file's own Q4_1/Q8_0 blocks with 8-bit activations (integer dot products): the weights
// are exactly the fp32 run's, so the difference is the activations' rounding alone; Q8_0
// re-quantization of every matrix adds its weight rounding on top.
TEST_CASE("SmolLM2-135M with its GGUF blocks kept (8-bit activations) stays close to the fp32 model") {
  const Oracle o;
  const Agreement& full = fp32_agreement(o);
  const dc::GgufFile file(dc_test::smollm2_gguf_path());
  const dc::ModelConfig config = dc::gguf_model_config(file);
  const Agreement kept = compare(o, config, dc::load_gguf_quantized_weights(file, config));
  const Closeness c = closeness(o, full, kept);
  MESSAGE("SmolLM2 GGUF blocks vs fp32 over " << o.tokens.size() << " positions: mean KL " << c.mean_kl
          << " nats, max " << c.max_kl << ", same argmax " << c.same_argmax << "; vs Hugging Face argmax "
          << kept.argmax_same << "/" << kept.rows);
  CHECK(c.mean_kl < 6e-3);  // measured 2.7e-3, max 0.021, same argmax at 245 of 256
  CHECK(c.same_argmax >= int(o.tokens.size()) * 90 / 100);
}

// A bf16 KV cache (fp32 weights): every key and value rounded to 8 significant bits.
TEST_CASE("SmolLM2-135M with a bf16 KV cache stays close to the fp32 cache") {
  const Oracle o;
  const Agreement& full = fp32_agreement(o);
  dc::HfModel m = load_smollm2();
  const Agreement half = compare(o, m.config, std::move(m.weights), dc::DType::bf16);
  const Closeness c = closeness(o, full, half);
  MESSAGE("SmolLM2 bf16 vs fp32 KV cache over " << o.tokens.size() << " positions: mean KL " << c.mean_kl
          << " nats, max " << c.max_kl << ", same argmax " << c.same_argmax << "; vs Hugging Face argmax "
          << half.argmax_same << "/" << half.rows);
  CHECK(c.mean_kl < 1e-3);
  CHECK(c.same_argmax >= int(o.tokens.size()) * 95 / 100);
}
