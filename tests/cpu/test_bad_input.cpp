// Every public entry point rejects bad input with a dc::Error that names the problem.
//
// One table drives the test: each row is a bad input, the call that receives it, and a phrase
// its message must contain. docs/errors.md is this table with the messages of a real run:
//   DC_ERROR_TABLE=1 build/tests/test_bad_input     (prints the markdown rows)
// Hostile files are covered in depth by test_gguf, test_safetensors, test_hf_loader,
// test_policy_checkpoint and the fuzz regressions; the rows here are the representative cases a
// user meets first.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/policy_checkpoint.hpp>

#include "../support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kFixtures = DC_FIXTURE_DIR;

struct BadInput {
  std::string area;    // the entry point
  std::string input;   // what is wrong
  std::function<void()> call;
  std::string expect;  // a phrase the message must contain
};

// A tiny Mistral (vocab 256, 2 layers, max_position 256) shared by the rows.
dc::Transformer<dc::cpu>& tiny_model() {
  static dc::Transformer<dc::cpu> model = [] {
    dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
    return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 8);
  }();
  return model;
}

std::vector<std::int32_t> prompt(int n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ids[std::size_t(i)] = 1 + (7 * i) % 200;
  return ids;
}

// Features of a 4-slot cache as the decoder would hand them to a policy.
dc::TokenFeatures tiny_features() {
  auto& model = tiny_model();
  auto cache = model.make_cache(8);
  cache.set_observed_from(0);
  model.forward(prompt(4), cache);
  return dc::gather_features(model.context(), cache);
}

// A policy that breaks its contract.
struct NanPolicy final : dc::EvictionPolicy {
  std::string name() const override { return "nan"; }
  void score_slots(const dc::TokenFeatures&, int, std::span<float> s) override {
    for (float& x : s) x = NAN;
  }
};

void overwrite(const fs::path& file, std::uint64_t offset, const void* bytes, std::size_t n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(offset));
  f.write(static_cast<const char*>(bytes), std::streamsize(n));
}

// A copy of tiny_mistral with one weight set to NaN.
void nan_weight_checkpoint(const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors"})
    fs::copy_file(kFixtures + "/tiny_mistral/" + name, dir / name);
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), std::streamsize(header_len));
  in.close();
  const auto offsets = nlohmann::json::parse(header)["model.layers.1.mlp.up_proj.weight"]["data_offsets"];
  const float nan = NAN;
  overwrite(dir / "model.safetensors", 8 + header_len + offsets[0].get<std::uint64_t>() + 3 * 4, &nan,
            4);
}

// A copy of the tiny GGUF (all BF16) with one weight set to +inf.
fs::path inf_weight_gguf(const fs::path& dir) {
  const fs::path path = dir / "inf.gguf";
  fs::copy_file(kFixtures + "/gguf/tiny_llama_tied.gguf", path);
  std::uint64_t at = 0;
  {
    dc::GgufFile f(path);
    const dc::GgufTensorInfo* t = f.find_tensor("output_norm.weight");
    REQUIRE(t != nullptr);
    REQUIRE(t->ggml_type() == dc::GgmlType::bf16);
    at = f.data_offset() + t->offset;
  }
  const std::uint16_t bf16_inf = 0x7f80;  // the top half of the fp32 +inf pattern
  overwrite(path, at, &bf16_inf, 2);
  return path;
}

// A small valid policy checkpoint (2 inputs, hidden [2]: 9 weights), saved under dir.
dc::PolicyCheckpoint tiny_policy() {
  dc::PolicyCheckpoint c;
  c.feature_normalisation = "scale_free_v1";
  c.inputs = {"alpha", "position"};
  c.hidden = {2};
  c.weights = {0.5f, -1.0f, 0.25f, 2.0f, 0.0f, 1.0f, 3.0f, -4.5f, 0.125f};
  return c;
}
fs::path saved_policy(const fs::path& dir, const std::string& name) {
  fs::create_directories(dir);
  dc::save_policy_checkpoint(dir / name, tiny_policy());
  return dir / name;
}

// Rewrites a saved policy checkpoint through edit (metadata JSON, data section) and reseals it
// with a correct checksum, so the reader gets past the checksum to the field checks.
fs::path edited_policy(const fs::path& dir, const std::string& name,
                       const std::function<void(nlohmann::json&, std::vector<std::uint8_t>&)>& edit) {
  const fs::path p = saved_policy(dir, name);
  std::ifstream in(p, std::ios::binary);
  std::vector<std::uint8_t> b{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  in.close();
  std::uint64_t meta_len = 0;
  std::memcpy(&meta_len, b.data() + 12, 8);
  nlohmann::json meta = nlohmann::json::parse(b.begin() + 20, b.begin() + 20 + std::ptrdiff_t(meta_len));
  std::vector<std::uint8_t> data(b.begin() + 20 + std::ptrdiff_t(meta_len), b.end() - 8);
  edit(meta, data);
  const std::string text = meta.dump();
  std::string out(b.begin(), b.begin() + 12);  // magic and version
  for (int i = 0; i < 8; ++i) out += char(std::uint8_t(text.size() >> (8 * i)));
  out += text;
  out.append(data.begin(), data.end());
  const std::uint64_t sum =
      dc::detail::fnv1a64({reinterpret_cast<const std::uint8_t*>(out.data()), out.size()});
  for (int i = 0; i < 8; ++i) out += char(std::uint8_t(sum >> (8 * i)));
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size()));
  return p;
}

std::vector<BadInput> bad_inputs(const dc_test::TempDir& tmp) {
  static dc::Transformer<dc::cpu>& model = tiny_model();  // static: not captured, never dangles
  static const dc::ModelConfig& cfg = model.config();
  std::vector<BadInput> rows;
  auto add = [&](std::string area, std::string input, std::function<void()> call, std::string expect) {
    rows.push_back({std::move(area), std::move(input), std::move(call), std::move(expect)});
  };

  // ---- model files -------------------------------------------------------------------------
  add("load_gguf_model", "file does not exist", [&] { dc::load_gguf_model(tmp / "missing.gguf"); },
      "file missing");
  add("load_gguf_model", "not a GGUF file (a config.json)",
      [&] { dc::load_gguf_model(kFixtures + "/tiny_mistral/config.json"); }, "not a GGUF file");
  add("load_gguf_model", "file truncated in the tensor data", [&] {
    const fs::path p = tmp / "truncated.gguf";
    fs::copy_file(kFixtures + "/gguf/tiny_llama_tied.gguf", p);
    fs::resize_file(p, fs::file_size(p) - 1000);
    dc::load_gguf_model(p);
  }, "truncated");
  add("load_gguf_model", "a weight is +inf", [&] { dc::load_gguf_model(inf_weight_gguf(tmp.path)); },
      "tensor 'output_norm.weight': entry 0 is +inf");
  add("load_hf_model", "folder without config.json", [&] { dc::load_hf_model(tmp.path); },
      "config.json");
  add("load_hf_model", "a weight is NaN", [&] {
    nan_weight_checkpoint(tmp / "nan_ckpt");
    dc::load_hf_model(tmp / "nan_ckpt");
  }, "tensor 'model.layers.1.mlp.up_proj.weight': entry 3 is NaN");
  add("SafetensorsFile", "empty file", [&] {
    std::ofstream(tmp / "empty.safetensors").close();
    dc::SafetensorsFile f(tmp / "empty.safetensors");
  }, "shorter than the 8-byte header length");
  add("ModelConfig::validate", "heads not a multiple of kv_heads", [&] {
    dc::ModelConfig c = cfg;
    c.num_kv_heads = 3;
    c.validate();
  }, "num_key_value_heads");

  // ---- tokenizer --------------------------------------------------------------------------
  add("Tokenizer", "unsupported tokenizer model", [&] {
    dc::TokenizerData d;
    d.model = "bert";
    d.tokens = {"a"};
    dc::Tokenizer{d};
  }, "tokenizer model 'bert' is not supported");
  add("Tokenizer::decode", "token id outside the vocabulary", [&] {
    dc::TokenizerData d;
    d.model = "llama";
    d.tokens = {"<unk>", "a", "b"};
    d.scores = {0.0f, -1.0f, -2.0f};
    (void)dc::Tokenizer(d).decode(std::vector<std::int32_t>{1, 3});
  }, "token id 3");

  // ---- transformer --------------------------------------------------------------------------
  add("Transformer", "max_chunk 0", [&] {
    dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
    dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 0);
  }, "max_chunk must be positive");
  add("Transformer", "weights with fewer layers than the config", [&] {
    dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
    m.weights.layers.pop_back();
    dc::Transformer<dc::cpu>(m.config, std::move(m.weights));
  }, "weights have 1 layers, config says 2");
  add("forward", "empty prompt", [&] {
    auto cache = model.make_cache(8);
    model.forward(std::vector<std::int32_t>{}, cache);
  }, "no tokens");
  add("forward", "token id outside the vocabulary", [&] {
    auto cache = model.make_cache(8);
    model.forward(std::vector<std::int32_t>{5, 256}, cache);
  }, "token id 256 at index 1 outside vocabulary [0, 256)");
  add("forward", "negative token id", [&] {
    auto cache = model.make_cache(8);
    model.forward(std::vector<std::int32_t>{-1}, cache);
  }, "token id -1");
  add("forward", "more tokens than the cache holds", [&] {
    auto cache = model.make_cache(4);
    model.forward(prompt(5), cache);
  }, "KV cache full");
  add("forward", "more tokens than one layer of the cache holds", [&] {
    std::vector<int> capacities(std::size_t(cfg.num_layers), 8);
    capacities.back() = 3;
    auto cache = model.make_cache(std::span<const int>(capacities));
    model.forward(prompt(5), cache);
  }, "exceed capacity 3 of layer");
  add("make_cache", "context longer than the model supports", [&] { model.make_cache(cfg.max_position + 1); },
      "exceeds the model's max_position");
  add("forward", "cache made for another model", [&] {
    dc::KVCache<dc::cpu> other(dc::cache_shape_of(dc::ModelConfig::mistral_7b_v0_1()), 4);
    model.forward(prompt(2), other);
  }, "does not match the model");
  add("forward", "logits buffer too small", [&] {
    auto cache = model.make_cache(8);
    std::vector<float> out(10);
    model.forward(prompt(2), cache, out);
  }, "logits buffer holds 10 floats, need 256");
  add("forward", "weights that make the logits NaN", [&] {
    dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
    m.weights.final_norm.data()[0] = NAN;  // the loaders reject this; hand-built weights may not
    dc::Transformer<dc::cpu> broken(m.config, std::move(m.weights));
    auto cache = broken.make_cache(4);
    broken.forward(prompt(2), cache);
  }, "the model produced non-finite logits");
  add("forward (CUDA)", "cache or weights on another GPU than the model",
      [&] { dc::check_same_device(0, 1, "the KV cache"); },
      "the KV cache is on CUDA device 1 but the model runs on CUDA device 0");

  // ---- KV cache -----------------------------------------------------------------------------
  add("KVCache", "capacity 0", [&] { dc::KVCache<dc::cpu>(dc::cache_shape_of(cfg), 0); }, "capacity must be positive");
  add("KVCache", "layer capacities not one per layer",
      [&] { dc::KVCache<dc::cpu>(dc::CacheShape{3, 2, 2, 4, 0, {}}, std::vector<int>{8, 8}); },
      "2 layer capacities for 3 layers");
  add("KVCache", "one layer's capacity 0",
      [&] { dc::KVCache<dc::cpu>(dc::CacheShape{3, 2, 2, 4, 0, {}}, std::vector<int>{8, 0, 8}); },
      "capacity must be positive, got 0 in layer 1");
  add("KVCache", "query heads not a multiple of kv heads", [&] { dc::KVCache<dc::cpu>(dc::CacheShape{2, 3, 2, 4, 0, {}}, 4); },
      "3 query heads are not a multiple of 2 kv heads");
  add("KVCache", "layer windows not one per layer", [&] { dc::KVCache<dc::cpu>(dc::CacheShape{2, 2, 2, 4, 0, {8}}, 4); },
      "1 layer windows for 2 layers");
  add("KVCache", "negative layer window", [&] { dc::KVCache<dc::cpu>(dc::CacheShape{2, 2, 2, 4, 0, {0, -1}}, 4); },
      "layer 1 has window -1 (0 = global, else positive)");
  add("KVCache::compact_heads", "keep entries not a multiple of the kv heads", [&] {
    auto cache = dc::KVCache<dc::cpu>(dc::CacheShape{1, 4, 2, 4, 0, {}}, 8);
    cache.append({}, 4);
    cache.compact_heads({}, 0, std::vector<std::int32_t>{0, 1, 2});
  }, "3 keep entries are not 2 equal per-head keep-sets");
  add("KVCache::compact_heads", "a head's keep-set not ascending", [&] {
    auto cache = dc::KVCache<dc::cpu>(dc::CacheShape{1, 4, 2, 4, 0, {}}, 8);
    cache.append({}, 4);
    cache.compact_heads({}, 0, std::vector<std::int32_t>{0, 1, 3, 2});
  }, "keep-set of kv head 1 must be strictly ascending");
  add("KVCache::compact", "keep-set not ascending", [&] {
    auto cache = model.make_cache(8);
    model.forward(prompt(4), cache);
    cache.compact({}, std::vector<std::int32_t>{2, 1});
  }, "strictly ascending");
  add("KVCache::compact", "slot past the end", [&] {
    auto cache = model.make_cache(8);
    model.forward(prompt(4), cache);
    cache.compact({}, std::vector<std::int32_t>{0, 4});
  }, "slot 4 of kv head 0 outside [0, 4)");
  add("KVCache", "layer index out of range", [&] { model.make_cache(4).length(2); },
      "layer 2 outside [0, 2)");
  add("KVCache::copy_from", "caches of different models", [&] {
    auto cache = model.make_cache(4);
    cache.copy_from({}, dc::KVCache<dc::cpu>(dc::cache_shape_of(dc::ModelConfig::mistral_7b_v0_1()), 4));
  }, "different model shapes");
  add("KVCache::truncate", "longer than the cache", [&] { model.make_cache(4).truncate(1); },
      "truncate to 1 outside [0, 0]");

  // ---- budgets ------------------------------------------------------------------------------
  add("Budget::resolve", "zero budget", [&] { dc::Budget::of_tokens(0).resolve(16); }, "budget is 0");
  add("Budget::resolve", "negative token count", [&] { dc::Budget::of_tokens(-3).resolve(16); },
      "must be positive");
  add("Budget::resolve", "more tokens than the prompt", [&] { dc::Budget::of_tokens(17).resolve(16); },
      "exceed the prompt length");
  add("Budget::resolve", "fraction above 1", [&] { dc::Budget::of_fraction(1.5).resolve(16); },
      "(0, 1]");
  add("Budget::resolve", "fraction NaN", [&] { dc::Budget::of_fraction(NAN).resolve(16); },
      "not finite");
  add("Budget::resolve", "sink + recent above the budget", [&] {
    dc::Budget b = dc::Budget::of_tokens(4);
    b.sink = 3;
    b.recent = 2;
    b.resolve(16);
  }, "exceed the budget of 4");
  add("Budget::resolve", "negative chunk", [&] {
    dc::Budget b = dc::Budget::of_tokens(4);
    b.chunk = -1;
    b.resolve(16);
  }, "chunk must be >= 1");
  add("Budget::resolve", "empty prompt", [&] { dc::Budget::of_tokens(4).resolve(0); },
      "the prompt is empty");

  // ---- features and policies ----------------------------------------------------------------
  add("EvictionPolicy::score", "a feature is NaN", [&] {
    auto& m = tiny_model();
    auto cache = m.make_cache(8);
    cache.set_observed_from(0);
    m.forward(prompt(4), cache);
    cache.stats(1)[2] = NAN;  // slot 2's attention mass in layer 1
    const dc::TokenFeatures f = dc::gather_features(m.context(), cache);
    std::vector<float> s(4);
    dc::make_baseline_policy("h2o")->score(f, 2, s);
  }, "features: 'alpha' of row 2 is NaN");
  add("EvictionPolicy::score", "a feature is inf", [&] {
    dc::TokenFeatures f = tiny_features();
    f.column(dc::Feature::value_norm)[1] = INFINITY;
    std::vector<float> s(4);
    dc::make_baseline_policy("knorm")->score(f, 2, s);
  }, "features: 'value_norm' of row 1 is +inf");
  add("EvictionPolicy::score", "a raw statistic is inf", [&] {
    dc::TokenFeatures f = tiny_features();
    f.key_norm[3] = -INFINITY;
    std::vector<float> s(4);
    dc::make_baseline_policy("knorm")->score(f, 2, s);
  }, "features: 'key_norm': entry 3 is -inf");
  add("EvictionPolicy::score", "feature columns of different lengths", [&] {
    dc::TokenFeatures f = tiny_features();
    f.key_norm.pop_back();
    std::vector<float> s(4);
    dc::make_baseline_policy("tova")->score(f, 2, s);
  }, "'key_norm' has 3 entries for 4 rows");
  add("EvictionPolicy::score", "groups that do not tile the rows", [&] {
    dc::TokenFeatures f = tiny_features();
    f.groups[0].row_end = 3;
    std::vector<float> s(4);
    dc::make_baseline_policy("tova")->score(f, 2, s);
  }, "groups cover 3 of 4 rows");
  add("EvictionPolicy::score", "scores span of the wrong size", [&] {
    std::vector<float> s(3);
    dc::make_baseline_policy("h2o")->score(tiny_features(), 2, s);
  }, "3 scores for 4 slots");
  add("EvictionPolicy::score", "negative budget", [&] {
    std::vector<float> s(4);
    dc::make_baseline_policy("h2o")->score(tiny_features(), -1, s);
  }, "negative budget -1");
  add("EvictionPolicy::score", "a policy writes a NaN score", [&] {
    std::vector<float> s(4);
    NanPolicy().score(tiny_features(), 2, s);
  }, "policy 'nan' gave row 0 (position 0) a NaN score");
  add("make_baseline_policy", "unknown name", [&] { dc::make_baseline_policy("lru"); },
      "unknown policy 'lru' (known: full, random");
  add("make_baseline_policy", "H2O's recent fraction not a number", [&] { dc::make_baseline_policy("h2o:recent=half"); },
      "policy 'h2o:recent=half': the recent fraction 'half' is not a number");
  add("make_baseline_policy", "H2O's recent fraction outside [0, 1]", [&] { dc::make_baseline_policy("h2o:recent=2"); },
      "policy 'h2o:recent=2': the recent fraction must lie in [0, 1]");
  add("select_keep", "NaN score", [&] {
    dc::select_keep(std::vector<float>{0, NAN}, std::vector<std::int32_t>{0, 1}, 1);
  }, "score of slot 1 is NaN");
  add("select_keep", "scores and positions of different lengths", [&] {
    dc::select_keep(std::vector<float>{0, 1}, std::vector<std::int32_t>{0}, 1);
  }, "2 scores for 1 positions");
  add("select_keep", "negative sink", [&] {
    dc::select_keep(std::vector<float>{0, 1, 2}, std::vector<std::int32_t>{0, 1, 2}, 1, -1);
  }, "must be >= 0");
  add("gather_features", "per-layer keep-sets gathered together", [&] {
    auto cache = model.make_cache(8);
    model.forward(prompt(4), cache);
    cache.compact_layer({}, 0, std::vector<std::int32_t>{0, 1});
    dc::gather_features(model.context(), cache);
  }, "hold different slots");
  add("parse_granularity", "unknown name", [&] { dc::parse_granularity("token"); },
      "unknown granularity 'token' (known: shared, layer, head)");

  // ---- the evicting decoder -----------------------------------------------------------------
  // Static: the rows run after this function returns.
  static const std::shared_ptr<dc::EvictionPolicy> h2o = dc::make_baseline_policy("h2o");
  static const dc::Budget half = dc::Budget::of_fraction(0.5);
  add("EvictingDecoder", "max_prompt 0", [&] {
    dc::EvictingDecoder<dc::cpu>(model, *h2o, half, dc::EvictionMode::decode, 0, 4);
  }, "max_prompt 0 must be positive");
  add("EvictingDecoder", "max_prompt + max_new_tokens past max_position", [&] {
    dc::EvictingDecoder<dc::cpu>(model, *h2o, half, dc::EvictionMode::decode, 200, 100);
  }, "exceed the model's max_position 256");
  add("EvictingDecoder::prefill", "empty prompt", [&] {
    dc::EvictingDecoder<dc::cpu> dec(model, *h2o, half, dc::EvictionMode::decode, 8, 4);
    dec.prefill(std::vector<std::int32_t>{});
  }, "empty prompt");
  add("EvictingDecoder::prefill", "prompt longer than max_prompt", [&] {
    dc::EvictingDecoder<dc::cpu> dec(model, *h2o, half, dc::EvictionMode::decode, 8, 4);
    dec.prefill(prompt(9));
  }, "prompt of 9 tokens exceeds max_prompt 8");
  add("EvictingDecoder::prefill", "budget larger than the prompt", [&] {
    dc::EvictingDecoder<dc::cpu> dec(model, *h2o, dc::Budget::of_tokens(12), dc::EvictionMode::decode, 16, 4);
    dec.prefill(prompt(8));
  }, "12 tokens exceed the prompt length 8");
  add("EvictingDecoder::step", "step before prefill", [&] {
    dc::EvictingDecoder<dc::cpu> dec(model, *h2o, half, dc::EvictionMode::decode, 8, 4);
    dec.step(1);
  }, "step() before prefill()");
  add("EvictingDecoder::step", "more steps than max_new_tokens", [&] {
    dc::EvictingDecoder<dc::cpu> dec(model, *h2o, half, dc::EvictionMode::prefill, 8, 2);
    dec.prefill(prompt(8));
    for (int i = 0; i < 7; ++i) dec.step(1);
  }, "past max_new_tokens");
  add("EvictingDecoder::adopt_prefill", "cache prefilled with another observation window", [&] {
    auto cache = model.make_cache(8);
    cache.set_observed_from(0);
    const auto logits = model.forward(prompt(8), cache);
    auto snapkv = dc::make_baseline_policy("snapkv");  // observes the last 64 queries: from 0
    auto tova = dc::make_baseline_policy("tova");      // observes the last query only: from 7
    dc::EvictingDecoder<dc::cpu>(model, *snapkv, half, dc::EvictionMode::decode, 8, 4)
        .adopt_prefill(cache, logits);
    dc::EvictingDecoder<dc::cpu>(model, *tova, half, dc::EvictionMode::decode, 8, 4)
        .adopt_prefill(cache, logits);
  }, "policy 'tova' needs 7");

  // ---- sampling and metrics -----------------------------------------------------------------
  add("argmax", "no logits", [&] { dc::argmax({}); }, "argmax: no logits");
  add("argmax", "a NaN logit", [&] { dc::argmax(std::vector<float>{0, NAN, 1}); },
      "argmax: logit of token 1 is NaN");
  add("argmax", "every logit -inf", [&] { dc::argmax(std::vector<float>{-INFINITY, -INFINITY}); },
      "every logit is -inf");
  add("sample_token", "temperature negative", [&] {
    std::mt19937 rng(1);
    dc::sample_token(std::vector<float>{0, 1}, {-1.0f, 0}, rng);
  }, "temperature must be finite and >= 0");
  add("sample_token", "temperature NaN", [&] {
    std::mt19937 rng(1);
    dc::sample_token(std::vector<float>{0, 1}, {NAN, 0}, rng);
  }, "temperature must be finite and >= 0");
  add("sample_token", "top_k negative", [&] {
    std::mt19937 rng(1);
    dc::sample_token(std::vector<float>{0, 1}, {1.0f, -2}, rng);
  }, "top_k must be >= 0");
  add("sample_token", "a +inf logit", [&] {
    std::mt19937 rng(1);
    dc::sample_token(std::vector<float>{0, INFINITY}, {1.0f, 0}, rng);
  }, "sample_token: logit of token 1 is +inf");
  add("kl_divergence", "rows of different lengths", [&] {
    dc::kl_divergence(std::vector<float>{0, 1}, std::vector<float>{0});
  }, "kl_divergence: 2 vs 1 logits");
  add("kl_divergence", "a NaN logit", [&] {
    dc::kl_divergence(std::vector<float>{0, 1}, std::vector<float>{NAN, 0});
  }, "log_sum_exp: logit of token 0 is NaN");
  add("FidelityTotals::add", "target outside the vocabulary", [&] {
    dc::FidelityTotals t;
    volatile std::int32_t target = 2;  // opaque to GCC, whose -Warray-bounds ignores the check
    t.add(std::vector<float>{0, 1}, std::vector<float>{0, 1}, target);
  }, "target token 2 outside the vocabulary");
  add("FidelityEvaluator", "no budgets", [&] {
    dc::FidelityEvaluator<dc::cpu, float>(model, {h2o.get()}, {}, dc::EvictionMode::decode);
  }, "give at least one of each");
  add("FidelityEvaluator", "null policy", [&] {
    dc::FidelityEvaluator<dc::cpu, float>(model, {nullptr}, {half}, dc::EvictionMode::decode);
  }, "policy 0 is null");
  add("FidelityEvaluator::add_context", "empty continuation", [&] {
    dc::FidelityEvaluator<dc::cpu, float> e(model, {h2o.get()}, {half}, dc::EvictionMode::decode);
    e.add_context(prompt(8), std::vector<std::int32_t>{}, [](std::size_t) {});
  }, "empty prompt or continuation");
  add("tasks::find_task", "unknown task name", [&] { dc::tasks::find_task("niah_single_9"); },
      "unknown task 'niah_single_9' (known: niah_single_1, niah_single_2");
  add("tasks::TaskPromptBuilder::build", "length too short for the task", [&] {
    std::vector<std::string> words;
    for (char a = 'a'; a <= 'd'; ++a)
      for (char b = 'a'; b <= 'e'; ++b) words.push_back(std::string("wor") + a + b);
    const auto list = dc::tasks::WordList::from_words(words);
    dc::TokenizerData bytes;  // one token per byte
    bytes.model = "gpt2";
    for (int c = 0; c < 256; ++c) {
      std::string s;
      dc::detail::tok::append_utf8(s, dc::detail::tok::byte_to_cp()[std::size_t(c)]);
      bytes.tokens.push_back(s);
    }
    const dc::Tokenizer tok(bytes);
    dc::tasks::TaskPromptBuilder(tok, {}, {&list, nullptr}, 0).build(dc::tasks::find_task("niah_single_1"), 300, 0);
  }, "length 300 is too short for task niah_single_1");
  add("tasks::WordList::from_words", "too few usable words", [&] {
    dc::tasks::WordList::from_words({"apple", "Berlin", "it's"});
  }, "word list: 1 usable words (lowercase a-z, 3 to 12 letters); the tasks need at least 16");
  add("tasks::ChatTemplate::from_jinja", "a template that is not ChatML", [&] {
    dc::tasks::ChatTemplate::from_jinja("[INST] {{ messages[0]['content'] }} [/INST]");
  }, "chat template not supported: only ChatML");
  add("parse_protocol", "unknown protocol", [&] { dc::parse_protocol("aware"); },
      "unknown protocol 'aware' (known: query-aware, query-agnostic)");
  add("wilson_interval", "more successes than trials", [&] { dc::wilson_interval(3, 2); },
      "wilson_interval: 3 successes of 2 trials");

  add("Transformer::forward_batch", "fewer tokens than caches", [&] {
    auto a = model.make_cache(4), b = model.make_cache(4);
    std::vector<dc::KVCache<dc::cpu>*> caches{&a, &b};
    std::vector<float> out(2 * std::size_t(model.config().vocab_size));
    model.forward_batch(std::vector<std::int32_t>{1}, caches, out);
  }, "forward_batch: 1 tokens for 2 caches (one token per sequence)");
  add("Transformer::forward_batch", "one cache twice", [&] {
    auto a = model.make_cache(4);
    std::vector<dc::KVCache<dc::cpu>*> caches{&a, &a};
    std::vector<float> out(2 * std::size_t(model.config().vocab_size));
    model.forward_batch(std::vector<std::int32_t>{1, 2}, caches, out);
  }, "forward_batch: sequences 0 and 1 share one KV cache");
  add("MlpPolicy::set_recent_fraction", "fraction 1", [&] {
    dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).set_recent_fraction(1.0);
  }, "mlp policy: recent_fraction 1 outside [0, 1)");
  add("MlpPolicy::set_newest_query_reserve", "reserve and recent window the whole budget", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_recent_fraction(0.5);
    policy.set_newest_query_reserve(0.5);
  }, "mlp policy: recent_fraction 0.5 plus newest_query_reserve 0.5 leave nothing of the budget to the MLP (their sum must be below 1)");
  add("MlpPolicy::set_newest_query_reserve_elsewhere", "no reserve layers", [&] {
    dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).set_newest_query_reserve_elsewhere({{1.0, 0.25}});
  }, "mlp policy: a reserve elsewhere needs newest_query_reserve_layers (without them the reserve is in every layer and nothing is elsewhere)");
  add("MlpPolicy::set_newest_query_layers", "a layer twice", [&] {
    dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).set_newest_query_layers({3, 1, 3});
  }, "mlp policy: newest_query_layers names a layer twice");
  add("MlpPolicy::set_newest_query_layers_up_to", "no newest-query layers", [&] {
    dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).set_newest_query_layers_up_to(0.375);
  }, "mlp policy: newest_query_layers_up_to below 1 needs newest_query_layers (set it to 1 before removing them)");
  add("MlpPolicy::set_newest_query_layers_up_to", "a fraction past 1", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_newest_query_layers({1});
    policy.set_newest_query_layers_up_to(1.5);
  }, "mlp policy: newest_query_layers_up_to 1.5 outside (0, 1]");
  add("MlpPolicy::set_newest_query_pins", "shares without guide layers", [&] {
    dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).set_newest_query_pins({}, {{1.0, 0.1}});
  }, "mlp policy: newest-query pins need both guide layers and shares, or neither (no guide layer given)");
  add("MlpPolicy::set_newest_query_pins", "pins and recent window the whole budget", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_recent_fraction(0.5);
    policy.set_newest_query_pins({1}, {{1.0, 0.5}});
  }, "mlp policy: recent_fraction 0.5 plus newest_query_pins 0.5 leave nothing of the budget to the MLP (their sum must be below 1)");
  add("MlpPolicy::set_newest_query_pins", "pins, window and reserve elsewhere the whole budget", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_recent_fraction(0.5);
    policy.set_newest_query_reserve(0.25);
    policy.set_newest_query_reserve_layers({1});
    policy.set_newest_query_reserve_elsewhere({{0.25, 0.0}, {0.5, 0.3}});
    policy.set_newest_query_pins({1}, {{1.0, 0.2}});
  }, "mlp policy: recent_fraction 0.5 plus newest_query_pins and the newest_query_reserve_elsewhere reach 1 of the budget at budget fraction 0.5: nothing left to the MLP (their sum must be below 1)");
  add("MlpPolicy::score", "a pin guide layer the model lacks", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_newest_query_pins({2}, {{1.0, 0.25}});
    const dc::TokenFeatures f = tiny_features();
    std::vector<float> scores(std::size_t(f.size));
    policy.score(f, 2, scores);
  }, "newest-query pins: guide layer 2 named, the model has 2 layers");
  add("MlpPolicy::score", "a newest-query layer the model lacks", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_newest_query_layers({1, 2});
    const dc::TokenFeatures f = tiny_features();
    std::vector<float> scores(std::size_t(f.size));
    policy.score(f, 2, scores);
  }, "newest-query rows: layer 2 named, the model has 2 layers");
  add("MlpPolicy::set_newest_query_layers", "a layer past the rules' model", [&] {
    auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
    policy.set_layer_budget_weights({1.0, 1.0, 1.5});
    policy.set_newest_query_layers({3});
  }, "mlp policy: layer 3 named in rules for a model of 3 layers");
  add("MlpPolicy::from_checkpoint", "a layer count that is not one", [&] {
    auto c = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).to_checkpoint();
    c.extra["layer_rules_model_layers"] = -2;
    (void)dc::MlpPolicy::from_checkpoint(c);
  }, "policy checkpoint: 'layer_rules_model_layers' is -2, not a layer count");
  add("MlpPolicy::from_checkpoint", "an unknown choice for other models", [&] {
    auto c = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).to_checkpoint();
    c.extra["layer_rules_on_other_models"] = "scale";
    (void)dc::MlpPolicy::from_checkpoint(c);
  }, "layer rules on other models: 'scale' is neither 'map' nor 'drop'");
  add("MlpPolicy::from_checkpoint", "unknown score base", [&] {
    auto c = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1).to_checkpoint();
    c.extra["score_base"] = "snapkv";
    (void)dc::MlpPolicy::from_checkpoint(c);
  }, "unknown score base 'snapkv' (known: none, h2o)");
  add("linear_correction_params", "a SiLU network", [&] {
    const std::vector<float> w(5, 0.5f);
    (void)dc::linear_correction_params(dc::MlpLayout(5, {16, 8}, dc::Activation::silu), w);
  }, "linear correction: the MLP must use ReLU");
  add("compass_search", "a minimum step above the step", [&] {
    dc::CompassSearchOptions o;
    o.step = 0.1;
    o.min_step = 0.5;
    (void)dc::compass_search({0.0f}, o, [](const std::vector<std::vector<float>>& p) {
      return std::vector<double>(p.size(), 0.0);
    });
  }, "compass search: minimum step 0.5 must be in (0, step = 0.1]");
  add("policy_inputs", "budget_age at a budget of 0", [&] {
    dc::TokenFeatures f;
    const std::vector<dc::PolicyInput> age = {dc::PolicyInput::budget_age};
    dc::policy_inputs(f, age, 0);
  }, "policy_inputs: budget_age needs a budget of at least 1 row, got 0");

  // ---- policy checkpoints -------------------------------------------------------------------
  add("load_policy_checkpoint", "not a checkpoint (a config.json)",
      [&] { dc::load_policy_checkpoint(kFixtures + "/tiny_mistral/config.json"); },
      "not a distillcache policy checkpoint");
  add("load_policy_checkpoint", "file truncated in the tensor data", [&] {
    const fs::path p = saved_policy(tmp / "policy", "cut.dcp");
    fs::resize_file(p, fs::file_size(p) - 10);
    dc::load_policy_checkpoint(p);
  }, "truncated tensor data");
  add("load_policy_checkpoint", "a byte flipped (bad checksum)", [&] {
    const fs::path p = saved_policy(tmp / "policy", "flipped.dcp");
    const std::uint8_t x = 0x40;
    overwrite(p, fs::file_size(p) - 12, &x, 1);  // inside the last weight
    dc::load_policy_checkpoint(p);
  }, "bad checksum");
  add("load_policy_checkpoint", "unknown format version", [&] {
    const fs::path p = saved_policy(tmp / "policy", "v2.dcp");
    const std::uint32_t v = 2;
    overwrite(p, 8, &v, 4);
    dc::load_policy_checkpoint(p);
  }, "unknown format version 2");
  add("load_policy_checkpoint", "no input features", [&] {
    dc::load_policy_checkpoint(edited_policy(tmp / "policy", "no_inputs.dcp", [](auto& meta, auto&) {
      meta["inputs"] = nlohmann::json::array();
    }));
  }, "the policy has 0 input features; it needs 1 to 64");
  add("load_policy_checkpoint", "a weight is NaN", [&] {
    dc::load_policy_checkpoint(edited_policy(tmp / "policy", "nan.dcp", [](auto&, auto& data) {
      const float nan = NAN;
      std::memcpy(data.data() + 3 * 4, &nan, 4);
    }));
  }, "tensor 'weights': entry 3 is NaN");
  add("save_policy_checkpoint", "weights not matching the architecture", [&] {
    dc::PolicyCheckpoint c = tiny_policy();
    c.hidden = {3};
    dc::save_policy_checkpoint(tmp / "wrong_count.dcp", c);
  }, "'weights' holds 9 floats, but an MLP with 2 inputs, hidden [3] and one output has 13 parameters");
  add("save_policy_checkpoint", "folder does not exist",
      [&] { dc::save_policy_checkpoint(tmp / "nowhere" / "p.dcp", tiny_policy()); },
      "No such file or directory");

  // ---- text corpora -------------------------------------------------------------------------
  add("list_text_files", "path does not exist", [&] { dc::list_text_files(tmp / "nowhere"); },
      "does not exist");
  add("list_text_files", "folder without .txt files", [&] {
    fs::create_directories(tmp / "no_text");
    dc::list_text_files(tmp / "no_text");
  }, "no .txt files");
  return rows;
}

}  // namespace

TEST_CASE("every bad input raises dc::Error naming the problem") {
  dc_test::TempDir tmp("dc_bad_input");
  const bool print = std::getenv("DC_ERROR_TABLE") != nullptr;
  if (print) std::cout << "| entry point | bad input | message |\n|---|---|---|\n";
  for (const BadInput& row : bad_inputs(tmp)) {
    CAPTURE(row.area);
    CAPTURE(row.input);
    std::string message;
    try {
      row.call();
    } catch (const dc::Error& e) {
      message = e.message();
    }
    CHECK_MESSAGE(message.find(row.expect) != std::string::npos, "message: '", message,
                  "' lacks '", row.expect, "'");
    if (print) {
      // Paths under the temp folder change per run; show them relative to it.
      std::string shown = message;
      for (std::size_t at; (at = shown.find(tmp.path.string())) != std::string::npos;)
        shown.replace(at, tmp.path.string().size(), "$TMP");
      for (std::size_t at; (at = shown.find(kFixtures)) != std::string::npos;)
        shown.replace(at, kFixtures.size(), "tests/fixtures");
      // Escape table bars; search on after each escape, which itself holds a bar.
      for (std::size_t at = 0; (at = shown.find('|', at)) != std::string::npos; at += 2)
        shown.replace(at, 1, "\\|");
      std::cout << "| `" << row.area << "` | " << row.input << " | " << shown << " |\n";
    }
  }
}

TEST_CASE("the -inf logits that are allowed behave: zero probability, never sampled") {
  const std::vector<float> logits{-INFINITY, 0.0f, std::log(3.0f), -INFINITY};
  CHECK(dc::log_sum_exp(logits) == doctest::Approx(std::log(4.0)).epsilon(1e-6));
  CHECK(dc::argmax(logits) == 2);
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const auto t = dc::sample_token(logits, {1.0f, 0}, rng);
    CHECK((t == 1 || t == 2));
  }
  // P allows token 0 that Q bans: KL(P || Q) is +inf; the reverse is finite.
  const std::vector<float> p{0.0f, 0.0f}, q{-INFINITY, 0.0f};
  CHECK(std::isinf(dc::kl_divergence(p, q)));
  CHECK(dc::kl_divergence(q, p) == doctest::Approx(std::log(2.0)).epsilon(1e-6));
}
