// dc::GgufFile, the dequantizers and the GGUF model loader, against fixtures written by the
// reference `gguf` Python package (tools/make_gguf_fixtures.py: tests/fixtures/gguf/), against
// Hugging Face logits, and against hostile files built byte by byte here. Every malformed file
// must raise a dc::Error that names the problem, before any allocation the file asks for.
#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/temp_dir.hpp"
#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf.hpp>
#include <distillcache/io/gguf_dequant.hpp>
#include <distillcache/io/gguf_model.hpp>
#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/safetensors.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(DC_FIXTURE_DIR) + "/gguf";
const char* const kTypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};

// ---------------------------------------------------------------------------------------------
// A GGUF writer for hand-made (and deliberately broken) files.
// ---------------------------------------------------------------------------------------------
using Bytes = std::vector<unsigned char>;

void put_u32(Bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u64(Bytes& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_str(Bytes& b, const std::string& s) {
  put_u64(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
template <class T>
void put_raw(Bytes& b, T v) {
  unsigned char tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}

struct RawTensor {
  std::string name;
  std::vector<std::uint64_t> ne;
  std::uint32_t type = 0;
  Bytes data;
  std::optional<std::uint64_t> offset;  // default: packed and aligned after the previous one
};

struct GgufBuilder {
  std::uint32_t magic = 0x46554747;
  std::uint32_t version = 3;
  std::optional<std::uint64_t> tensor_count, kv_count;  // overrides
  std::uint32_t alignment = 32;                          // padding used (not written as a key)
  Bytes kv;
  std::uint64_t n_kv = 0;
  std::vector<RawTensor> tensors;
  std::uint64_t truncate = 0;  // bytes cut off the end

  // A key with a hand-serialised value (type word + payload).
  void raw_kv(const std::string& key, std::uint32_t type, const Bytes& payload) {
    put_str(kv, key);
    put_u32(kv, type);
    kv.insert(kv.end(), payload.begin(), payload.end());
    ++n_kv;
  }
  void u32(const std::string& key, std::uint32_t v) {
    Bytes p;
    put_u32(p, v);
    raw_kv(key, 4, p);
  }
  void f32(const std::string& key, float v) {
    Bytes p;
    put_raw(p, v);
    raw_kv(key, 6, p);
  }
  void str(const std::string& key, const std::string& v) {
    Bytes p;
    put_str(p, v);
    raw_kv(key, 8, p);
  }
  void tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint32_t type, Bytes data) {
    tensors.push_back({name, std::move(ne), type, std::move(data), std::nullopt});
  }
  void f32_tensor(const std::string& name, std::vector<std::uint64_t> ne, const std::vector<float>& v) {
    Bytes d(v.size() * 4);
    if (!v.empty()) std::memcpy(d.data(), v.data(), d.size());
    tensor(name, std::move(ne), 0, std::move(d));
  }

  Bytes build() const {
    Bytes b;
    put_u32(b, magic);
    put_u32(b, version);
    put_u64(b, tensor_count.value_or(tensors.size()));
    put_u64(b, kv_count.value_or(n_kv));
    b.insert(b.end(), kv.begin(), kv.end());
    std::vector<std::uint64_t> offsets;
    std::uint64_t next = 0;
    for (const auto& t : tensors) {
      const std::uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = (std::max(next, off + t.data.size()) + alignment - 1) / alignment * alignment;
      put_str(b, t.name);
      put_u32(b, static_cast<std::uint32_t>(t.ne.size()));
      for (auto d : t.ne) put_u64(b, d);
      put_u32(b, t.type);
      put_u64(b, off);
    }
    while (b.size() % alignment) b.push_back(0);
    const std::size_t data_start = b.size();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].data.empty()) continue;
      const std::size_t begin = data_start + std::size_t(offsets[i]);
      if (b.size() < begin) b.insert(b.end(), begin - b.size(), 0);
      for (std::size_t j = 0; j < tensors[i].data.size(); ++j) {
        if (begin + j < b.size()) b[begin + j] = tensors[i].data[j];  // overlapping tensors
        else b.push_back(tensors[i].data[j]);
      }
    }
    while (b.size() % alignment) b.push_back(0);
    b.erase(b.end() - std::ptrdiff_t(std::min<std::size_t>(truncate, b.size())), b.end());
    return b;
  }
};

using dc_test::TempDir;

fs::path write_file(const TempDir& dir, const std::string& name, const Bytes& bytes) {
  const fs::path p = dir.path / name;
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return p;
}

// A small valid file: a few keys and one F32 tensor [2, 32].
GgufBuilder small_file() {
  GgufBuilder g;
  g.str("general.architecture", "test");
  g.u32("test.n", 7);
  g.f32_tensor("w", {32, 2}, std::vector<float>(64, 1.5f));
  return g;
}

std::string error_of(const fs::path& p) {
  try {
    dc::GgufFile f(p);
  } catch (const dc::Error& e) {
    return e.message();
  }
  return "<no error>";
}

bool same_float(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

dc::GgufValueType value_type_from(const std::string& name) {
  static const std::pair<const char*, dc::GgufValueType> names[] = {
      {"UINT8", dc::GgufValueType::u8},     {"INT8", dc::GgufValueType::i8},
      {"UINT16", dc::GgufValueType::u16},   {"INT16", dc::GgufValueType::i16},
      {"UINT32", dc::GgufValueType::u32},   {"INT32", dc::GgufValueType::i32},
      {"FLOAT32", dc::GgufValueType::f32},  {"BOOL", dc::GgufValueType::boolean},
      {"STRING", dc::GgufValueType::string}, {"ARRAY", dc::GgufValueType::array},
      {"UINT64", dc::GgufValueType::u64},   {"INT64", dc::GgufValueType::i64},
      {"FLOAT64", dc::GgufValueType::f64}};
  for (const auto& [n, t] : names)
    if (name == n) return t;
  FAIL("unknown type name in metadata.json: " << name);
  return dc::GgufValueType::u8;
}

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.is_open());
  return nlohmann::json::parse(in);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------------------------

TEST_CASE("metadata of every value type reads back as the gguf package wrote it") {
  const nlohmann::json doc = load_json(kDir + "/metadata.json");
  for (const char* type : kTypes) {
    CAPTURE(type);
    const dc::GgufFile f(kDir + "/types_" + type + ".gguf");
    CHECK(f.version() == 3);
    CHECK(f.alignment() == doc.at("alignment").at(type).get<std::uint32_t>());
    CHECK(f.get_string("general.architecture") == "test");
    CHECK(f.keys().front() == "general.architecture");

    for (const auto& e : doc.at("entries")) {
      const std::string key = e.at("key").get<std::string>();
      CAPTURE(key);
      const nlohmann::json& want = e.at("value");
      const dc::GgufValue& v = f.get(key);
      REQUIRE(v.type() == value_type_from(e.at("type").get<std::string>()));
      switch (v.type()) {
        case dc::GgufValueType::u64:
          CHECK(f.get_uint(key) == want.get<std::uint64_t>());
          if (want.get<std::uint64_t>() > std::uint64_t(INT64_MAX))
            CHECK_THROWS_WITH_AS(f.get_int(key), doctest::Contains("does not fit in int64"), dc::Error);
          else
            CHECK(f.get_int(key) == want.get<std::int64_t>());
          break;
        case dc::GgufValueType::u8: case dc::GgufValueType::i8: case dc::GgufValueType::u16:
        case dc::GgufValueType::i16: case dc::GgufValueType::u32: case dc::GgufValueType::i32:
        case dc::GgufValueType::i64:
          CHECK(f.get_int(key) == want.get<std::int64_t>());
          break;
        case dc::GgufValueType::f32:
        case dc::GgufValueType::f64:
          CHECK(f.get_float(key) == want.get<double>());  // f32 -> double is exact
          break;
        case dc::GgufValueType::boolean:
          CHECK(f.get_bool(key) == want.get<bool>());
          break;
        case dc::GgufValueType::string:
          CHECK(f.get_string(key) == want.get<std::string>());
          break;
        case dc::GgufValueType::array: {
          const auto elem = value_type_from(e.at("element_type").get<std::string>());
          REQUIRE(v.element_type() == elem);
          CHECK(v.size() == want.size());
          if (elem == dc::GgufValueType::string) {
            CHECK(f.get_string_array(key) == want.get<std::vector<std::string>>());
            CHECK(v.string_at(want.size() - 1) == want.back().get<std::string>());
          } else if (elem == dc::GgufValueType::f32) {
            CHECK(f.get_float_array(key) == want.get<std::vector<float>>());
          } else if (elem == dc::GgufValueType::f64) {
            CHECK(v.as_double_array() == want.get<std::vector<double>>());
            CHECK_THROWS_WITH_AS(f.get_float_array(key), doctest::Contains("out of float range"), dc::Error);
          } else if (elem == dc::GgufValueType::boolean) {
            CHECK(v.as_bool_array() == want.get<std::vector<bool>>());
          } else if (elem == dc::GgufValueType::array) {
            REQUIRE(v.items().size() == want.size());
            for (std::size_t i = 0; i < want.size(); ++i) {
              if (e.at("inner_type") == "STRING")
                CHECK(v.items()[i].as_string_array() == want[i].get<std::vector<std::string>>());
              else
                CHECK(v.items()[i].as_int_array() == want[i].get<std::vector<std::int64_t>>());
            }
          } else if (elem == dc::GgufValueType::u64) {
            std::vector<std::int64_t> expect;
            for (const auto& x : want) expect.push_back(std::int64_t(x.get<std::uint64_t>()));
            CHECK(f.get_int_array(key) == expect);
          } else {
            CHECK(f.get_int_array(key) == want.get<std::vector<std::int64_t>>());
          }
          break;
        }
      }
    }
  }
}

TEST_CASE("metadata getters name the key when it is missing or of another type") {
  const dc::GgufFile f(kDir + "/types_f32.gguf");
  CHECK_FALSE(f.has("no.such.key"));
  CHECK(f.find("no.such.key") == nullptr);
  CHECK_THROWS_WITH_AS(f.get_int("no.such.key"), doctest::Contains("'no.such.key' missing"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_string("test.u8"), doctest::Contains("'test.u8' is uint8, not a string"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_int("test.string"), doctest::Contains("'test.string' is string, not an integer"),
                       dc::Error);
  CHECK_THROWS_WITH_AS(f.get_float("test.i32"), doctest::Contains("test.i32"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_bool("test.u8"), doctest::Contains("not a bool"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_string_array("test.arr_i32"),
                       doctest::Contains("'test.arr_i32' is array of int32, not an array of strings"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_int_array("test.arr_f32"), doctest::Contains("test.arr_f32"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_float_array("test.string"), doctest::Contains("test.string"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_uint("test.i8"), doctest::Contains("negative"), dc::Error);
  CHECK_THROWS_WITH_AS(f.get_string("test.u8"), doctest::Contains(("gguf '" + kDir + "/types_f32.gguf'").c_str()), dc::Error);
}

// ---------------------------------------------------------------------------------------------
// Dequantization
// ---------------------------------------------------------------------------------------------

TEST_CASE("every tensor type dequantizes exactly as gguf.quants.dequantize") {
  dc::SafetensorsFile expected(kDir + "/expected.safetensors");
  const std::pair<const char*, dc::GgmlType> types[] = {
      {"f32", dc::GgmlType::f32},   {"f16", dc::GgmlType::f16},   {"bf16", dc::GgmlType::bf16},
      {"q8_0", dc::GgmlType::q8_0}, {"q4_0", dc::GgmlType::q4_0}, {"q4_1", dc::GgmlType::q4_1}};
  for (const auto& entry : types) {
    const std::string type = entry.first;
    const dc::GgmlType id = entry.second;
    const dc::GgufFile f(kDir + "/types_" + type + ".gguf");
    REQUIRE(f.tensors().size() == 2);
    for (const char* name : {"a", "b"}) {
      CAPTURE(type);
      CAPTURE(name);
      const dc::GgufTensorInfo& info = f.tensor(name);
      CHECK(info.ggml_type() == id);
      const auto want = expected.read_float(std::string(type) + "." + name);
      const auto got = f.read_tensor(name);
      REQUIRE(got.shape() == want.shape());
      CHECK(info.shape() == want.shape());  // "a": ne [64, 3] -> [3, 64]
      CHECK(info.offset % f.alignment() == 0);
      std::int64_t exact = 0;
      float worst = 0.0f;
      for (std::int64_t i = 0; i < got.numel(); ++i) {
        const float g = got.data()[i], w = want.data()[i];
        if (same_float(g, w)) {
          ++exact;
        } else {
          worst = std::fmax(worst, std::fabs(g - w) / std::fmax(1.0f, std::fabs(w)));
        }
      }
      // Bitwise, except where the compiler fuses Q4_1's q * d + m into one rounding.
      if (id == dc::GgmlType::q4_1) {
        CHECK(worst <= 1e-6f);
        if (exact != got.numel()) MESSAGE("q4_1." << name << ": " << got.numel() - exact << " values differ, max rel " << worst);
      } else {
        CHECK(exact == got.numel());
      }
    }
  }
  CHECK(dc::GgufFile(kDir + "/types_q8_0.gguf").alignment() == 64);
}

TEST_CASE("block layouts: nibble order, zero points and scales from hand-made blocks") {
  // Scales as fp16 bit patterns: 1.0 = 0x3c00, 0.5 = 0x3800, -1.0 = 0xbc00, 2.0 = 0x4000.
  SUBCASE("Q4_0: low nibbles are elements 0..15, high nibbles 16..31, value (q - 8) * d") {
    Bytes b{0x00, 0x38};  // d = 0.5
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<unsigned char>(j | ((15 - j) << 4)));
    float out[32];
    dc::dequantize(2, b.data(), out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == float(j - 8) * 0.5f);
      CHECK(out[j + 16] == float(15 - j - 8) * 0.5f);
    }
  }
  SUBCASE("Q4_1: value q * d + m") {
    Bytes b{0x00, 0x40, 0x00, 0xbc};  // d = 2, m = -1
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<unsigned char>(j | ((15 - j) << 4)));
    float out[32];
    dc::dequantize(3, b.data(), out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == float(j) * 2.0f - 1.0f);
      CHECK(out[j + 16] == float(15 - j) * 2.0f - 1.0f);
    }
  }
  SUBCASE("Q8_0: signed bytes times d, two blocks") {
    Bytes b;
    for (int blk = 0; blk < 2; ++blk) {
      b.push_back(0x00);
      b.push_back(blk == 0 ? 0x3c : 0x40);  // d = 1, then 2
      for (int j = 0; j < 32; ++j) b.push_back(static_cast<unsigned char>(static_cast<std::int8_t>(j * 8 - 128)));
    }
    float out[64];
    dc::dequantize(8, b.data(), out, 64);
    for (int j = 0; j < 32; ++j) {
      CHECK(out[j] == float(j * 8 - 128));
      CHECK(out[32 + j] == 2.0f * float(j * 8 - 128));
    }
  }
  SUBCASE("element counts that are not whole blocks and undecodable types are rejected") {
    float out[32];
    Bytes b(34, 0);
    CHECK_THROWS_WITH_AS(dc::dequantize(8, b.data(), out, 31), doctest::Contains("whole number of Q8_0 blocks"),
                         dc::Error);
    CHECK_THROWS_WITH_AS(dc::dequantize(10, b.data(), out, 256), doctest::Contains("cannot dequantize Q2_K"),
                         dc::Error);
    CHECK_THROWS_WITH_AS(dc::dequantize(999, b.data(), out, 1), doctest::Contains("unknown type 999"), dc::Error);
  }
}

// ---------------------------------------------------------------------------------------------
// The tiny Llama model: GGUF (Q/K permuted as llama.cpp does) vs the Hugging Face oracle
// ---------------------------------------------------------------------------------------------

namespace {
float max_abs_diff(const std::vector<float>& a, const dc::Tensor<float, dc::cpu>& b) {
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::fmax(worst, std::fabs(a[i] - b.data()[i]));
  return worst;
}
}  // namespace

TEST_CASE("tiny Llama GGUF: config, weights equal to the HF checkpoint's, logits match Hugging Face") {
  const std::string hf_folder = std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied";
  dc::SafetensorsFile oracle_file(hf_folder + "/oracle.safetensors");
  const auto tokens = oracle_file.read_i32("tokens");
  const auto oracle = oracle_file.read_float("logits");

  dc::HfModel m = dc::load_gguf_model(kDir + "/tiny_llama_tied.gguf");
  const dc::ModelConfig& c = m.config;
  CHECK(c.architecture == "llama");
  CHECK(c.vocab_size == 256);  // from tokenizer.ggml.tokens: the file has no llama.vocab_size
  CHECK(c.hidden_size == 64);
  CHECK(c.intermediate_size == 160);
  CHECK(c.num_layers == 2);
  CHECK(c.num_heads == 4);
  CHECK(c.num_kv_heads == 1);
  CHECK(c.head_dim == 16);
  CHECK(c.max_position == 256);
  CHECK(c.rms_eps == 1e-6f);
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.sliding_window == 0);
  CHECK(c.tie_embeddings);
  CHECK(m.weights.lm_head.empty());

  // BF16 storage is lossless for this bf16 checkpoint, so after undoing the permutation every
  // weight must equal the Hugging Face loader's bit for bit.
  dc::HfModel hf = dc::load_hf_model(hf_folder);
  std::vector<const dc::Tensor<float, dc::cpu>*> ours, theirs;
  dc::for_each_weight(c, m.weights, [&](const std::string&, dc::Tensor<float, dc::cpu>& t, dc::Shape) { ours.push_back(&t); });
  dc::for_each_weight(hf.config, hf.weights,
                      [&](const std::string&, dc::Tensor<float, dc::cpu>& t, dc::Shape) { theirs.push_back(&t); });
  REQUIRE(ours.size() == theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    REQUIRE(ours[i]->shape() == theirs[i]->shape());
    CHECK(std::memcmp(ours[i]->data(), theirs[i]->data(), ours[i]->bytes()) == 0);
  }

  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  auto cache = model.make_cache(int(tokens.size()));
  const auto logits = model.forward(tokens, cache, dc::LogitsFor::all);
  const float err = max_abs_diff(logits, oracle);
  MESSAGE("tiny_llama_tied.gguf vs Hugging Face: max abs logit error " << err);
  CHECK(err < 1e-4f);
}

TEST_CASE("without undoing the Q/K permutation the logits are wrong (the test can fail)") {
  const std::string hf_folder = std::string(DC_FIXTURE_DIR) + "/tiny_llama_tied";
  dc::SafetensorsFile oracle_file(hf_folder + "/oracle.safetensors");
  const auto tokens = oracle_file.read_i32("tokens");
  const auto oracle = oracle_file.read_float("logits");
  const dc::GgufFile f(kDir + "/tiny_llama_tied.gguf");
  dc::HfModel m = dc::load_gguf_model(f);
  for (int l = 0; l < m.config.num_layers; ++l) {
    auto& L = m.weights.layers[std::size_t(l)];
    L.wq = f.read_tensor("blk." + std::to_string(l) + ".attn_q.weight");  // interleaved order
    L.wk = f.read_tensor("blk." + std::to_string(l) + ".attn_k.weight");
  }
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  auto cache = model.make_cache(int(tokens.size()));
  const float err = max_abs_diff(model.forward(tokens, cache, dc::LogitsFor::all), oracle);
  MESSAGE("permuted Q/K left as stored: max abs logit error " << err);
  CHECK(err > 1e-2f);
}

// ---------------------------------------------------------------------------------------------
// Hand-made models: untied output, mistral architecture, and every config/tensor error
// ---------------------------------------------------------------------------------------------

namespace {
struct TinySpec {
  std::string arch = "llama";
  int d = 64, ff = 32, layers = 1, heads = 2, kv_heads = 1, vocab = 8;
};

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A complete F32 model; `skip` omits one tensor, `ne_override` changes one tensor's ne.
GgufBuilder tiny_model(const TinySpec& s, const std::string& skip = "",
                       const std::string& reshape = "", bool untied = true) {
  GgufBuilder g;
  const std::string p = s.arch + ".";
  g.str("general.architecture", s.arch);
  g.u32(p + "block_count", std::uint32_t(s.layers));
  g.u32(p + "context_length", 128);
  g.u32(p + "embedding_length", std::uint32_t(s.d));
  g.u32(p + "feed_forward_length", std::uint32_t(s.ff));
  g.u32(p + "attention.head_count", std::uint32_t(s.heads));
  g.u32(p + "attention.head_count_kv", std::uint32_t(s.kv_heads));
  g.f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  g.u32(p + "vocab_size", std::uint32_t(s.vocab));
  const std::uint64_t d = std::uint64_t(s.d), ff = std::uint64_t(s.ff), hd = d / std::uint64_t(s.heads);
  unsigned seed = 1;
  auto add = [&](const std::string& name, std::vector<std::uint64_t> ne) {
    if (name == skip) return;
    if (name == reshape) ne[0] += 32;
    std::size_t n = 1;
    for (auto x : ne) n *= std::size_t(x);
    g.f32_tensor(name, ne, random_values(n, seed++));
  };
  add("token_embd.weight", {d, std::uint64_t(s.vocab)});
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {d});
    add(b + "attn_q.weight", {d, hd * std::uint64_t(s.heads)});
    add(b + "attn_k.weight", {d, hd * std::uint64_t(s.kv_heads)});
    add(b + "attn_v.weight", {d, hd * std::uint64_t(s.kv_heads)});
    add(b + "attn_output.weight", {hd * std::uint64_t(s.heads), d});
    add(b + "ffn_norm.weight", {d});
    add(b + "ffn_gate.weight", {d, ff});
    add(b + "ffn_up.weight", {d, ff});
    add(b + "ffn_down.weight", {ff, d});
  }
  add("output_norm.weight", {d});
  if (untied) add("output.weight", {d, std::uint64_t(s.vocab)});
  return g;
}
}  // namespace

TEST_CASE("hand-made untied model: output.weight becomes lm_head, Q/K rows are unpermuted per head") {
  TempDir dir;
  TinySpec s;
  s.arch = "mistral";
  GgufBuilder g = tiny_model(s);
  g.u32("mistral.attention.sliding_window", 16);
  g.f32("mistral.rope.freq_base", 1e6f);
  const fs::path path = write_file(dir, "tiny.gguf", g.build());
  const dc::GgufFile f(path);
  const dc::HfModel m = dc::load_gguf_model(f);
  CHECK(m.config.architecture == "mistral");
  CHECK_FALSE(m.config.tie_embeddings);
  CHECK(m.config.sliding_window == 16);
  CHECK(m.config.rope_theta == 1e6f);
  CHECK(m.config.head_dim == 32);
  const auto out = f.read_tensor("output.weight");
  REQUIRE(m.weights.lm_head.shape() == out.shape());
  CHECK(std::memcmp(m.weights.lm_head.data(), out.data(), out.bytes()) == 0);

  const int hd = 32;
  const auto q = f.read_tensor("blk.0.attn_q.weight");
  const auto k = f.read_tensor("blk.0.attn_k.weight");
  const auto& L = m.weights.layers[0];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < hd; ++r) {
      const int src = dc::math::rope_unpermute_source(r, hd);
      CHECK(std::memcmp(L.wq.data() + (h * hd + r) * 64, q.data() + (h * hd + src) * 64, 64 * 4) == 0);
      if (h == 0) CHECK(std::memcmp(L.wk.data() + r * 64, k.data() + src * 64, 64 * 4) == 0);
    }
  // V and the FFN are not permuted.
  CHECK(std::memcmp(L.wv.data(), f.read_tensor("blk.0.attn_v.weight").data(), L.wv.bytes()) == 0);
}

TEST_CASE("model loader errors name the tensor or metadata key") {
  TempDir dir;
  const TinySpec s;
  auto expect = [&](const GgufBuilder& g, const std::string& needle) {
    const fs::path p = write_file(dir, "m.gguf", g.build());
    std::string msg = "<no error>";
    try {
      dc::load_gguf_model(p);
    } catch (const dc::Error& e) {
      msg = e.message();
    }
    INFO("message: " << msg);
    CHECK(msg.find(needle) != std::string::npos);
  };
  expect(tiny_model(s, "blk.0.ffn_up.weight"),
         "tensor 'blk.0.ffn_up.weight' (model.layers.0.mlp.up_proj.weight) missing");
  expect(tiny_model(s, "", "blk.0.attn_q.weight"),
         "tensor 'blk.0.attn_q.weight': shape [64, 96] (ne [96, 64]), expected [64, 64]");
  {
    // Right shape, undecodable type: ffn_down [d, ff] = ne [256, 64] as Q2_K (one block a row).
    TinySpec t = s;
    t.ff = 256;
    GgufBuilder g = tiny_model(t, "blk.0.ffn_down.weight");
    g.tensor("blk.0.ffn_down.weight", {256, 64}, 10, Bytes(64 * 84, 0));
    expect(g, "tensor 'blk.0.ffn_down.weight': type Q2_K is not supported");
  }
  {
    GgufBuilder g = tiny_model(s);
    g.u32("llama.rope.dimension_count", 16);
    expect(g, "'llama.rope.dimension_count' = 16 differs from head_dim 32");
  }
  {
    TinySpec t = s;
    t.arch = "gpt2";
    expect(tiny_model(t), "architecture 'gpt2' is not supported");
  }
  {
    GgufBuilder g = tiny_model(s);
    g.f32_tensor("blk.0.attn_q.bias", {64}, std::vector<float>(64, 0.0f));
    expect(g, "tensor 'blk.0.attn_q.bias': biases are not supported");
  }
  {
    GgufBuilder g = tiny_model(s);
    g.str("llama.rope.scaling.type", "linear");
    expect(g, "RoPE scaling is not implemented");
  }
  {
    GgufBuilder g = tiny_model(s);
    g.u32("llama.expert_count", 8);
    expect(g, "mixture-of-experts");
  }
  {
    TinySpec t = s;
    t.kv_heads = 0;
    expect(tiny_model(t), "'llama.attention.head_count_kv' = 0 is out of range");
  }
  {
    TinySpec t = s;
    t.kv_heads = 3;  // 2 query heads are not a multiple of 3 KV heads
    expect(tiny_model(t), "num_attention_heads (2) must be a multiple of num_key_value_heads (3)");
  }
  {
    GgufBuilder g = tiny_model(s);
    g.str("llama.attention.layer_norm_rms_epsilon", "1e-5");
    expect(g, "appears twice");  // already written as a float: duplicates are rejected first
  }
  {
    GgufBuilder g;  // no architecture key at all
    g.u32("x", 1);
    expect(g, "metadata key 'general.architecture' missing");
  }
}

TEST_CASE("a model with a quantized tensor of the right type and shape loads") {
  // ffn_gate stored as Q8_0 (all-zero blocks): shape [ff, d] with d a multiple of 32.
  TempDir dir;
  TinySpec s;
  GgufBuilder g = tiny_model(s, "blk.0.ffn_gate.weight");
  g.tensor("blk.0.ffn_gate.weight", {64, 32}, 8, Bytes(32 * 2 * 34, 0));
  const dc::HfModel m = dc::load_gguf_model(write_file(dir, "q.gguf", g.build()));
  CHECK(m.weights.layers[0].w_gate.shape() == dc::Shape{32, 64});
  CHECK(m.weights.layers[0].w_gate.data()[100] == 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Hostile files
// ---------------------------------------------------------------------------------------------

TEST_CASE("a valid hand-made file reads; version 2 reads the same") {
  TempDir dir;
  GgufBuilder g = small_file();
  for (std::uint32_t version : {2u, 3u}) {
    g.version = version;
    const dc::GgufFile f(write_file(dir, "ok.gguf", g.build()));
    CHECK(f.version() == version);
    CHECK(f.get_int("test.n") == 7);
    const auto w = f.read_tensor("w");
    CHECK(w.shape() == dc::Shape{2, 32});
    CHECK(w.data()[63] == 1.5f);
  }
  GgufBuilder empty;  // no keys, no tensors
  const dc::GgufFile e(write_file(dir, "empty.gguf", empty.build()));
  CHECK(e.tensors().empty());
  CHECK(e.keys().empty());
}

TEST_CASE("hostile headers raise dc::Error naming the problem") {
  TempDir dir;
  auto expect = [&](const GgufBuilder& g, const std::string& needle) {
    const std::string msg = error_of(write_file(dir, "bad.gguf", g.build()));
    INFO("message: " << msg);
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(msg.find("bad.gguf") != std::string::npos);  // names the file
  };
  SUBCASE("missing file, empty file") {
    CHECK(error_of(dir.path / "nope.gguf").find("missing") != std::string::npos);
    CHECK(error_of(write_file(dir, "zero.gguf", {})).find("too short") != std::string::npos);
  }
  SUBCASE("bad magic") {
    GgufBuilder g = small_file();
    g.magic = 0x4c4c4747;
    expect(g, "bad magic");
  }
  SUBCASE("unsupported versions") {
    GgufBuilder g = small_file();
    g.version = 1;
    expect(g, "version 1 is not supported");
    g.version = 4;
    expect(g, "unsupported GGUF version 4");
    g.version = 0x03000000;
    expect(g, "big-endian");
  }
  SUBCASE("unknown value type, unknown array element type, invalid bool") {
    GgufBuilder g;
    g.raw_kv("weird", 13, Bytes(8, 0));
    expect(g, "metadata key 'weird': unknown value type 13");
    GgufBuilder a;
    Bytes p;
    put_u32(p, 42);
    put_u64(p, 1);
    a.raw_kv("arr", 9, p);
    expect(a, "metadata key 'arr': unknown array element type 42");
    GgufBuilder b;
    b.raw_kv("flag", 7, Bytes{2});
    expect(b, "invalid bool byte 2");
  }
  SUBCASE("unknown tensor type") {
    GgufBuilder g;
    g.tensor("t", {32}, 999, Bytes(128, 0));
    expect(g, "tensor 't': unknown tensor type 999");
    GgufBuilder removed;  // ids 4 and 5 (Q4_2, Q4_3) were removed from ggml
    removed.tensor("t", {32}, 4, Bytes(128, 0));
    expect(removed, "unknown tensor type 4");
  }
  SUBCASE("string length past the end") {
    GgufBuilder g;
    Bytes p;
    put_u64(p, 1000);
    p.insert(p.end(), {'a', 'b'});
    g.raw_kv("s", 8, p);
    expect(g, "metadata key 's': string length 1000 runs past the end");
    GgufBuilder k;  // the key itself
    Bytes raw;
    put_u64(raw, std::uint64_t(1) << 62);
    raw.insert(raw.end(), 16, 'x');
    k.kv = raw;
    k.n_kv = 1;
    expect(k, "metadata entry 0 key: string length 4611686018427387904 exceeds the limit");
    GgufBuilder arr;  // an element of a string array
    Bytes a;
    put_u32(a, 8);
    put_u64(a, 2);
    put_str(a, "ok");
    put_u64(a, 77);
    arr.raw_kv("toks", 9, a);
    expect(arr, "metadata key 'toks'[1]: string length 77 runs past the end");
  }
  SUBCASE("absurd counts: no huge allocation, a clear error") {
    GgufBuilder g = small_file();
    g.kv_count = std::uint64_t(1) << 60;
    expect(g, "kv_count 1152921504606846976 is impossible");
    GgufBuilder t = small_file();
    t.tensor_count = std::uint64_t(1) << 60;
    expect(t, "tensor_count 1152921504606846976 is impossible");
    for (std::uint32_t elem : {0u, 6u, 8u, 9u, 12u}) {  // u8, f32, string, array, f64
      GgufBuilder a;
      Bytes p;
      put_u32(p, elem);
      put_u64(p, std::uint64_t(1) << 60);
      a.raw_kv("big", 9, p);
      expect(a, "metadata key 'big': array length 1152921504606846976");
    }
    GgufBuilder dims;
    dims.tensor("huge", {std::uint64_t(1) << 40, std::uint64_t(1) << 40}, 0, Bytes(4, 0));
    expect(dims, "tensor 'huge': dimensions are absurdly large");
  }
  SUBCASE("tensor offset past the end, truncated data") {
    GgufBuilder g = small_file();
    g.tensors[0].offset = std::uint64_t(1) << 40;
    g.tensors[0].data.clear();
    g.tensors[0].ne = {32, 2};
    expect(g, "tensor 'w': offset 1099511627776 points past the end of the file");
    GgufBuilder t = small_file();
    t.truncate = 40;
    expect(t, "tensor 'w': data truncated");
    GgufBuilder header = small_file();  // cut inside the tensor infos
    const Bytes full = header.build();
    const Bytes cut(full.begin(), full.begin() + 70);
    const std::string msg = error_of(write_file(dir, "cut.gguf", cut));
    CHECK(msg.find("truncated") != std::string::npos);
  }
  SUBCASE("misaligned offsets, bad alignment key") {
    GgufBuilder g = small_file();
    g.tensors[0].offset = 4;
    expect(g, "tensor 'w': offset 4 is not a multiple of the alignment 32");
    GgufBuilder a = small_file();
    a.u32("general.alignment", 48);
    expect(a, "'general.alignment' = 48 is not a power of two");
    GgufBuilder s = small_file();
    s.str("general.alignment", "32");
    expect(s, "'general.alignment' is string, not uint32");
  }
  SUBCASE("a non-default alignment moves the data section") {
    GgufBuilder g = small_file();
    g.u32("general.alignment", 128);
    g.alignment = 128;
    g.f32_tensor("v", {32}, std::vector<float>(32, -2.0f));
    const dc::GgufFile f(write_file(dir, "a128.gguf", g.build()));
    CHECK(f.alignment() == 128);
    CHECK(f.data_offset() % 128 == 0);
    CHECK(f.tensor("v").offset == 256);
    CHECK(f.read_tensor("v").data()[31] == -2.0f);
  }
  SUBCASE("duplicate tensor names, duplicate keys, overlapping tensors") {
    GgufBuilder g = small_file();
    g.f32_tensor("w", {32}, std::vector<float>(32, 0.0f));
    expect(g, "tensor 'w': duplicate tensor name");
    GgufBuilder k = small_file();
    k.u32("test.n", 8);
    expect(k, "metadata key 'test.n' appears twice");
    GgufBuilder o = small_file();
    o.f32_tensor("v", {32}, std::vector<float>(32, 0.0f));
    o.tensors[1].offset = 128;  // inside w's 256 bytes
    expect(o, "tensor 'v': data at offset 128 overlaps tensor 'w'");
  }
  SUBCASE("too many dimensions, rows that are not whole blocks") {
    GgufBuilder g;
    g.tensor("t5", {1, 1, 1, 1, 32}, 0, Bytes(128, 0));
    expect(g, "tensor 't5': 5 dimensions, more than the maximum of 4");
    GgufBuilder q;
    q.tensor("q", {48, 2}, 8, Bytes(34 * 3, 0));
    expect(q, "tensor 'q': first dimension 48 is not a multiple of the Q8_0 block size 32");
  }
  SUBCASE("arrays nested too deep") {
    GgufBuilder g;
    Bytes p;
    for (int i = 0; i < 20; ++i) {
      put_u32(p, 9);
      put_u64(p, 1);
    }
    put_u32(p, 0);
    put_u64(p, 0);
    g.raw_kv("deep", 9, p);
    expect(g, "nested deeper than");
  }
  SUBCASE("a known but undecodable tensor type opens, and read_tensor names it") {
    GgufBuilder g;
    g.tensor("k", {256}, 10, Bytes(84, 0));  // one Q2_K block
    const dc::GgufFile f(write_file(dir, "q2k.gguf", g.build()));
    CHECK(f.tensor("k").nbytes == 84);
    CHECK_THROWS_WITH_AS(f.read_tensor("k"), doctest::Contains("tensor 'k': type Q2_K cannot be dequantized"),
                         dc::Error);
    CHECK_THROWS_WITH_AS(f.read_tensor("nope"), doctest::Contains("tensor 'nope' missing"), dc::Error);
  }
}
