// The real SmolLM2-135M-Instruct (Q4_1 GGUF: token_embd Q8_0, matrices Q4_1, norms F32) through
// dc::GgufFile and dc::load_gguf_model. The file is not committed: scripts/fetch_model.sh puts it
// in ${XDG_CACHE_HOME:-$HOME/.cache}/distillcache/, or point DC_SMOLLM2_GGUF at it.
// Expected values (tests/fixtures/gguf/smollm2_rows.safetensors) come from the gguf Python
// package's dequantizer and from Hugging Face transformers loading the same GGUF file.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf.hpp>
#include <distillcache/io/gguf_model.hpp>
#include <distillcache/io/safetensors.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kRows = std::string(DC_FIXTURE_DIR) + "/gguf/smollm2_rows.safetensors";

fs::path model_path() {
  if (const char* env = std::getenv("DC_SMOLLM2_GGUF"); env && *env) return env;
  fs::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) cache = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home) cache = fs::path(home) / ".cache";
  return cache / "distillcache" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The model path, or a failed test telling the user how to get it.
bool have_model(fs::path& path) {
  path = model_path();
  if (fs::is_regular_file(path)) return true;
  FAIL_CHECK("SmolLM2 GGUF not found at " << path.string()
                                          << ": run scripts/fetch_model.sh (or set DC_SMOLLM2_GGUF)");
  return false;
}

// Bitwise equal, or within 1e-6 relative where a compiler fuses Q4_1's q * d + m.
bool close(float got, float want) {
  return std::memcmp(&got, &want, sizeof(float)) == 0 ||
         std::fabs(got - want) <= 1e-6f * std::fmax(1.0f, std::fabs(want));
}

}  // namespace

TEST_CASE("SmolLM2 GGUF: metadata, config and tensor table") {
  fs::path path;
  if (!have_model(path)) return;
  const dc::GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.tensors().size() == 272);
  CHECK(f.get("tokenizer.ggml.tokens").size() == 49152);
  CHECK(f.get("tokenizer.ggml.merges").size() == 48900);
  CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.get("tokenizer.ggml.tokens").string_at(7042) == "\xC4\xA0Paris");  // "ĠParis"

  const dc::ModelConfig c = dc::gguf_model_config(f);
  CHECK(c.architecture == "llama");
  CHECK(c.num_layers == 30);
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 49152);
  CHECK(c.max_position == 8192);
  CHECK(c.rope_theta == 100000.0f);
  CHECK(c.rms_eps == doctest::Approx(1e-5).epsilon(1e-6));
  CHECK(c.sliding_window == 0);
  CHECK(c.tie_embeddings);

  int q8 = 0, q41 = 0, f32 = 0;
  for (const auto& t : f.tensors()) {
    if (t.ggml_type() == dc::GgmlType::q8_0) ++q8;
    if (t.ggml_type() == dc::GgmlType::q4_1) ++q41;
    if (t.ggml_type() == dc::GgmlType::f32) ++f32;
  }
  CHECK(q8 == 1);
  CHECK(q41 == 210);
  CHECK(f32 == 61);
  CHECK(f.tensor("token_embd.weight").shape() == dc::Shape{49152, 576});
  CHECK(f.tensor("blk.0.attn_k.weight").shape() == dc::Shape{192, 576});
}

TEST_CASE("SmolLM2 GGUF: every tensor dequantizes to finite values; rows equal gguf.quants") {
  fs::path path;
  if (!have_model(path)) return;
  const dc::GgufFile f(path);
  dc::SafetensorsFile rows(kRows);

  for (const auto& t : f.tensors()) {
    const auto x = f.read_tensor(t);
    bool finite = true;
    for (std::int64_t i = 0; i < x.numel(); ++i) finite = finite && std::isfinite(x.data()[i]);
    CAPTURE(t.name);
    CHECK(finite);

    auto check_rows = [&](const char* index_key, const char* value_key) {
      const auto idx = rows.read_i32(index_key);
      const auto want = rows.read_float(value_key);
      const std::int64_t cols = x.dim(1);
      REQUIRE(want.dim(1) == cols);
      int bad = 0;
      for (std::size_t r = 0; r < idx.size(); ++r)
        for (std::int64_t j = 0; j < cols; ++j)
          bad += !close(x.data()[std::int64_t(idx[r]) * cols + j], want.data()[std::int64_t(r) * cols + j]);
      CHECK(bad == 0);
    };
    if (t.name == "token_embd.weight") check_rows("token_embd_rows", "token_embd");  // Q8_0
    if (t.name == "blk.0.attn_q.weight") check_rows("attn_q0_rows", "attn_q0");       // Q4_1
    if (t.name == "output_norm.weight") {
      const auto want = rows.read_float("output_norm");
      CHECK(std::memcmp(x.data(), want.data(), want.bytes()) == 0);
    }
  }
}

TEST_CASE("SmolLM2 GGUF: load_gguf_model unpermutes Q, and its logits match Hugging Face") {
  fs::path path;
  if (!have_model(path)) return;
  dc::SafetensorsFile rows(kRows);

  const auto start = std::chrono::steady_clock::now();
  dc::HfModel m = dc::load_gguf_model(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Reported, not asserted: speed is measured in benchmarks, and sanitizer builds are slow.
  MESSAGE("load_gguf_model(SmolLM2-135M Q4_1, 98 MB -> fp32): " << seconds << " s");

  // Q row r of a head takes stored row rope_unpermute_source(r): rows 0, 1, 575 of the file
  // land at rows 0, 32 (first of the second half) and 575 (last row of the last head).
  const auto q_rows = rows.read_float("attn_q0");  // file rows 0, 1, 575
  const float* wq = m.weights.layers[0].wq.data();
  CHECK(std::memcmp(wq + 0 * 576, q_rows.data() + 0 * 576, 576 * 4) == 0);
  CHECK(std::memcmp(wq + 32 * 576, q_rows.data() + 1 * 576, 576 * 4) == 0);
  CHECK(std::memcmp(wq + 575 * 576, q_rows.data() + 2 * 576, 576 * 4) == 0);

  // Logits for "<bos>The capital of France is" against transformers on the same file.
  const auto tokens = rows.read_i32("hf_tokens");
  const auto vocab_ids = rows.read_i32("hf_vocab_ids");
  const auto hf_logits = rows.read_float("hf_logits");  // [tokens, vocab_ids]
  const auto hf_argmax = rows.read_i32("hf_argmax");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  auto cache = model.make_cache(int(tokens.size()));
  const auto logits = model.forward(tokens, cache, dc::LogitsFor::all);
  const std::size_t vocab = 49152;
  float worst = 0.0f;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    std::size_t best = 0;
    for (std::size_t v = 1; v < vocab; ++v)
      if (logits[t * vocab + v] > logits[t * vocab + best]) best = v;
    CHECK(int(best) == hf_argmax[t]);
    for (std::size_t k = 0; k < vocab_ids.size(); ++k)
      worst = std::fmax(worst, std::fabs(logits[t * vocab + std::size_t(vocab_ids[k])] -
                                         hf_logits.data()[t * vocab_ids.size() + k]));
  }
  MESSAGE("SmolLM2 logits vs Hugging Face (same GGUF): max abs error " << worst);
  CHECK(worst < 2e-3f);
  CHECK(hf_argmax.back() == 7042);  // "ĠParis"
}

TEST_CASE("SmolLM2 GGUF: the kept Q4_1/Q8_0 blocks decode to load_gguf_model's weights; logits near fp32") {
  fs::path path;
  if (!have_model(path)) return;
  const dc::GgufFile file(path);
  dc::HfModel m = dc::load_gguf_model(file);
  const auto kept = dc::load_gguf_quantized_weights(file, m.config);
  // Every matrix, Q/K rows un-permuted as whole blocks, decodes to the fp32 loader's values.
  auto same = [](const dc::QuantizedMatrix& q, const dc::Tensor<float, dc::cpu>& t, dc::QuantFormat format) {
    if (q.format() != format || q.shape() != t.shape()) return false;
    std::vector<float> row(static_cast<std::size_t>(q.cols()));
    for (std::int64_t r = 0; r < q.rows(); ++r) {
      q.dequantize_row(r, row.data());
      if (std::memcmp(row.data(), t.data() + r * q.cols(), row.size() * sizeof(float)) != 0) return false;
    }
    return true;
  };
  CHECK(same(kept.embed, m.weights.embed, dc::QuantFormat::q8_0));
  for (std::size_t l = 0; l < kept.layers.size(); ++l) {
    CAPTURE(l);
    const auto& q = kept.layers[l];
    const auto& f = m.weights.layers[l];
    CHECK(same(q.wq, f.wq, dc::QuantFormat::q4_1));
    CHECK(same(q.wk, f.wk, dc::QuantFormat::q4_1));
    CHECK(same(q.wv, f.wv, dc::QuantFormat::q4_1));
    CHECK(same(q.wo, f.wo, dc::QuantFormat::q4_1));
    CHECK(same(q.w_gate, f.w_gate, dc::QuantFormat::q4_1));
    CHECK(same(q.w_up, f.w_up, dc::QuantFormat::q4_1));
    CHECK(same(q.w_down, f.w_down, dc::QuantFormat::q4_1));
  }
  // The forward passes differ by the activations' 8-bit rounding alone: same next token for
  // "The capital of France is" ("ĠParis") and a small KL (measured 0.012 mean over its 7 positions).
  dc::SafetensorsFile rows(kRows);
  const auto tokens = rows.read_i32("hf_tokens");
  const int vocab = m.config.vocab_size;
  dc::Transformer<dc::cpu, dc::quantized> quantized(m.config, dc::load_gguf_quantized_weights(file, m.config), 16);
  dc::Transformer<dc::cpu> fp32(m.config, std::move(m.weights), 16);
  auto run = [&](auto& model) {
    auto cache = model.make_cache(int(tokens.size()));
    return model.forward(tokens, cache, dc::LogitsFor::all);
  };
  const auto a = run(fp32), b = run(quantized);
  std::vector<double> kl(tokens.size());
  dc::kl_rows_reference(dc::Context<dc::cpu>{}, a.data(), b.data(), int(tokens.size()), vocab, kl.data());
  double mean = 0.0;
  for (double v : kl) mean += v / double(kl.size());
  MESSAGE("SmolLM2, the GGUF's own blocks against its fp32 decoding: mean KL " << mean);
  CHECK(mean < 0.02);
  const std::size_t last = (tokens.size() - 1) * std::size_t(vocab);
  CHECK(std::max_element(b.begin() + std::ptrdiff_t(last), b.end()) - (b.begin() + std::ptrdiff_t(last)) == 7042);
}
