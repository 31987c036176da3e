// The real Gemma 3 270M GGUF (Q4_K_M: token_embd and some attn_v Q8_0, most matrices Q5_0,
// attn_output and ffn_down Q4_K or Q6_K, norms F32) through dc::GgufFile: its header, metadata and
// tensor table, and every Q4_K, Q6_K and Q5_0 tensor dequantized against gguf-py's reference
// (tests/fixtures/gguf/gemma_kquants.json, from tools/make_kquant_fixtures.py --gemma). The file is
// not committed: scripts/fetch_gemma.sh caches it, or point DC_GEMMA3_GGUF at it; without it the
// cases are skipped with a note.
//
// Tolerance: none for values (CRC-32 of every tensor's float32 bytes, exact first values); the
// row sums are compared within the rounding bound stated where they are.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/gemma_path.hpp"
#include <distillcache/io/gguf.hpp>
#include <distillcache/io/gguf_dequant.hpp>
#include <distillcache/io/gguf_model.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(DC_FIXTURE_DIR) + "/gguf";

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

// CRC-32 as zlib.crc32 computes it (reflected polynomial 0xEDB88320), which the fixture script
// applies to the little-endian float32 bytes of each dequantized tensor.
std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc = 0) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const std::uint8_t*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

bool have_gemma(fs::path& path) {
  path = dc_test::gemma3_gguf_path();
  if (fs::is_regular_file(path)) return true;
  MESSAGE("Gemma 3 GGUF not found at " << path.string()
                                       << " (scripts/fetch_gemma.sh, or set DC_GEMMA3_GGUF): skipped");
  return false;
}

nlohmann::json gemma_fixture() {
  std::ifstream in(kDir + "/gemma_kquants.json");
  REQUIRE(in.is_open());
  return nlohmann::json::parse(in);
}
}  // namespace

TEST_CASE("CRC-32 helper matches zlib's check value") {
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
}

TEST_CASE("Gemma 3 GGUF: header, metadata and tensor table read; its config is Gemma 3's") {
  fs::path path;
  if (!have_gemma(path)) return;
  const dc::GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "gemma3");
  CHECK(f.get_int("gemma3.block_count") == 18);
  CHECK(f.get_int("gemma3.embedding_length") == 640);
  CHECK(f.get_int("gemma3.attention.key_length") == 256);
  CHECK(f.get_int("gemma3.attention.sliding_window") == 512);
  CHECK(f.get_string("tokenizer.ggml.model") == "llama");
  CHECK(f.get("tokenizer.ggml.tokens").size() == 262144);
  CHECK(f.get("tokenizer.ggml.scores").size() == 262144);
  CHECK(f.tensors().size() == 236);

  std::map<std::string, int> counts;
  for (const auto& t : f.tensors()) {
    ++counts[t.type_name()];
    CHECK(dc::ggml_can_dequantize(t.type));  // every tensor type of the file is decodable
  }
  const nlohmann::json doc = gemma_fixture();
  std::map<std::string, int> want;
  for (const auto& [type, n] : doc.at("tensor_types").items()) want[type] = n.get<int>();
  CHECK(counts == want);
  CHECK(f.tensor("token_embd.weight").shape() == dc::Shape{262144, 640});

  // The metadata becomes a Gemma 3 config: what the file stores, plus what llama.cpp fixes for
  // gemma3 (every 6th layer global, local RoPE base 1e4, scale 1/sqrt(head_dim)). The full load
  // and its logits are tests/cpu/test_gemma_real.cpp.
  const dc::ModelConfig c = dc::gguf_model_config(f);
  CHECK(c.architecture == "gemma3");
  CHECK(c.num_layers == 18);
  CHECK(c.num_heads == 4);
  CHECK(c.num_kv_heads == 1);
  CHECK(c.head_dim == 256);
  CHECK(c.vocab_size == 262144);
  CHECK(c.tie_embeddings);
  CHECK(c.qk_norm);
  CHECK(c.sandwich_norms);
  CHECK(c.activation == dc::ModelConfig::Activation::gelu_tanh);
  for (int l = 0; l < 18; ++l) {
    CAPTURE(l);
    const bool global = (l + 1) % 6 == 0;
    CHECK(c.window_of(l) == (global ? 0 : 512));
    CHECK(c.rope_theta_of(l) == (global ? 1e6f : 1e4f));
  }
  CHECK(c.attention_scale() == 1.0f / 16.0f);
  CHECK(c.embedding_scale() == static_cast<float>(std::sqrt(640.0)));
  CHECK(c.final_logit_softcap == 0.0f);
}

TEST_CASE("Gemma 3 GGUF: every Q4_K, Q6_K and Q5_0 tensor dequantizes as gguf.quants does") {
  fs::path path;
  if (!have_gemma(path)) return;
  const dc::GgufFile f(path);
  const nlohmann::json doc = gemma_fixture();
  std::map<std::string, int> checked;
  for (const auto& e : doc.at("tensors")) {
    const std::string name = e.at("name").get<std::string>();
    CAPTURE(name);
    const dc::GgufTensorInfo& info = f.tensor(name);
    REQUIRE(info.type_name() == e.at("type").get<std::string>());
    const auto values = f.read_tensor(info);
    const auto shape = e.at("shape").get<std::vector<std::int64_t>>();
    REQUIRE(values.shape() == dc::Shape{shape.at(0), shape.at(1)});
    CHECK(crc32(values.data(), std::size_t(values.numel()) * sizeof(float)) == e.at("crc32").get<std::uint32_t>());
    if (e.contains("first16")) {
      const auto first = e.at("first16").get<std::vector<float>>();  // exact: doubles of floats
      for (std::size_t i = 0; i < first.size(); ++i) CHECK(same_bits(values.data()[i], first[i]));
      // The reference sum is exactly rounded (math.fsum); a sequential double sum of n floats is
      // within n * 2^-53 * sum |x| of it.
      double sum = 0.0, sum_abs = 0.0;
      for (std::int64_t c = 0; c < shape[1]; ++c) {
        sum += values.data()[c];
        sum_abs += std::fabs(values.data()[c]);
      }
      CHECK(std::fabs(sum - e.at("row0_sum").get<double>()) <= double(shape[1]) * 0x1p-53 * sum_abs);
    }
    ++checked[info.type_name()];
  }
  CHECK(checked["Q4_K"] == 27);
  CHECK(checked["Q6_K"] == 9);
  CHECK(checked["Q5_0"] == 81);
}
