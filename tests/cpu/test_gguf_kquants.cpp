// The Q5_0, Q4_K and Q6_K dequantizers (io/gguf_dequant.hpp, io/gguf_kquants.hpp): against
// gguf-py's reference dequantizer on random and edge blocks (tools/make_kquant_fixtures.py:
// tests/fixtures/gguf/kquants*), against blocks packed here from the format description, and on
// hostile files. The real Gemma 3 270M file's tensors are checked in test_gguf_gemma.cpp.
//
// Tolerance: none. Every value must have the reference's bit pattern, except that a NaN only
// has to be a NaN: IEEE 754 leaves the sign and payload of inf * 0 to the hardware (x86 gives
// -NaN, Arm +NaN), and the fixtures include such blocks on purpose.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include <distillcache/io/gguf.hpp>
#include <distillcache/io/gguf_dequant.hpp>
#include <distillcache/io/safetensors.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(DC_FIXTURE_DIR) + "/gguf";

bool same_float(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.is_open());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path write_bytes(const fs::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return p;
}

// The offset of tensor `name`'s first dimension (ne[0]) in the header of a GGUF file's bytes:
// the name is stored as u64 length + bytes, then u32 n_dims, then the u64 dims.
std::size_t ne0_offset(const std::vector<std::uint8_t>& file, const std::string& name) {
  std::vector<std::uint8_t> needle(8, 0);
  needle[0] = static_cast<std::uint8_t>(name.size());
  needle.insert(needle.end(), name.begin(), name.end());
  const auto it = std::search(file.begin(), file.end(), needle.begin(), needle.end());
  REQUIRE(it != file.end());
  return std::size_t(it - file.begin()) + needle.size() + 4;
}

// fp16 bit patterns used by the hand-made blocks.
constexpr std::uint16_t kHalfOne = 0x3c00, kHalfHalf = 0x3800;

void put_u16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t v) {
  b[at] = static_cast<std::uint8_t>(v);
  b[at + 1] = static_cast<std::uint8_t>(v >> 8);
}

}  // namespace

TEST_CASE("Q5_0, Q4_K and Q6_K dequantize bit for bit as gguf.quants.dequantize") {
  const dc::GgufFile f(kDir + "/kquants.gguf");
  const dc::SafetensorsFile expected(kDir + "/kquants_expected.safetensors");
  const std::map<std::string, dc::GgmlType> types = {
      {"q4_k", dc::GgmlType::q4_k}, {"q6_k", dc::GgmlType::q6_k}, {"q5_0", dc::GgmlType::q5_0}};
  for (const auto& entry : types) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const dc::GgmlType type = entry.second;
    CAPTURE(name);
    const dc::GgufTensorInfo& info = f.tensor(name);
    REQUIRE(info.ggml_type() == type);
    const auto want = expected.read_float(name);
    const auto got = f.read_tensor(info);
    REQUIRE(got.shape() == want.shape());
    std::int64_t mismatches = 0, nans = 0, infs = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      if (!same_float(got.data()[i], want.data()[i])) ++mismatches;
      nans += std::isnan(want.data()[i]);
      infs += std::isinf(want.data()[i]);
    }
    CHECK(mismatches == 0);
    CHECK(nans > 0);  // the fixture's non-finite block is really there
    if (type != dc::GgmlType::q5_0) CHECK(infs > 0);

    // Row by row through the free function, from the raw bytes: the same values.
    const std::vector<std::uint8_t> raw = f.read_raw(info);
    const std::int64_t cols = got.dim(1);
    const std::uint64_t row_bytes = dc::ggml_row_bytes(info.type, std::uint64_t(cols));
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (std::int64_t r = 0; r < got.dim(0); ++r) {
      dc::dequantize(info.type, raw.data() + std::size_t(r) * row_bytes, row.data(), cols);
      for (std::int64_t c = 0; c < cols; ++c)
        REQUIRE(same_float(row[std::size_t(c)], got.data()[r * cols + c]));
    }
  }
}

TEST_CASE("block layouts from blocks packed here by the format description") {
  SUBCASE("Q4_K: 6-bit scales and mins (high bits of sub-blocks 4..7 in the top bits), nibble order") {
    // Distinct scales and mins per sub-block; those of 4..7 are >= 16 so their high bits matter.
    const int sc[8] = {1, 7, 33, 63, 16, 47, 62, 21};
    const int mn[8] = {0, 63, 5, 40, 17, 32, 63, 50};
    std::vector<std::uint8_t> b(144, 0);
    put_u16(b, 0, kHalfOne);   // d = 1
    put_u16(b, 2, kHalfHalf);  // dmin = 0.5
    std::uint8_t* scales = b.data() + 4;
    for (int j = 0; j < 4; ++j) {
      scales[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      scales[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
      scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    // Element l of sub-block j has quant (l + j) % 16.
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l)
        b[16 + std::size_t(32 * g + l)] =
            static_cast<std::uint8_t>(((l + 2 * g) % 16) | (((l + 2 * g + 1) % 16) << 4));
    float out[256];
    dc::dequantize(12, b.data(), out, 256);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        CAPTURE(j);
        CAPTURE(l);
        CHECK(out[32 * j + l] == float(sc[j] * ((l + j) % 16)) - 0.5f * float(mn[j]));
      }
  }
  SUBCASE("Q6_K: low nibbles in ql, two high bits in qh, signed scale per 16 elements, d last") {
    std::vector<std::uint8_t> b(210, 0);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, i = e % 128, q = (e * 7) % 64;
      b[std::size_t(64 * h + i % 64)] |= static_cast<std::uint8_t>((q & 15) << (4 * (i / 64)));
      b[std::size_t(128 + 32 * h + i % 32)] |= static_cast<std::uint8_t>((q >> 4) << (2 * (i / 32)));
    }
    for (int k = 0; k < 16; ++k) b[std::size_t(192 + k)] = static_cast<std::uint8_t>(static_cast<std::int8_t>(k - 8));
    put_u16(b, 208, kHalfHalf);  // d = 0.5
    float out[256];
    dc::dequantize(14, b.data(), out, 256);
    for (int e = 0; e < 256; ++e) {
      CAPTURE(e);
      CHECK(out[e] == 0.5f * float((e / 16 - 8) * ((e * 7) % 64 - 32)));
    }
  }
  SUBCASE("Q5_0: bit i of qh is element i's fifth bit, value (q - 16) * d") {
    std::vector<std::uint8_t> b(22, 0);
    put_u16(b, 0, kHalfHalf);  // d = 0.5
    // Element i gets q = 31 - i: qh bit i set for i < 16.
    const std::uint32_t qh = 0x0000ffffu;
    std::memcpy(b.data() + 2, &qh, 4);
    for (int j = 0; j < 16; ++j)
      b[std::size_t(6 + j)] = static_cast<std::uint8_t>(((31 - j) & 15) | (((31 - j - 16) & 15) << 4));
    float out[32];
    dc::dequantize(6, b.data(), out, 32);
    for (int i = 0; i < 32; ++i) {
      CAPTURE(i);
      CHECK(out[i] == 0.5f * float(31 - i - 16));
    }
  }
}

TEST_CASE("k-quant inputs that are not whole super-blocks, or truncated, are rejected") {
  const dc_test::TempDir dir;
  float out[512];
  const std::vector<std::uint8_t> zeros(2 * 210, 0);
  CHECK(dc::ggml_can_dequantize(12));
  CHECK(dc::ggml_can_dequantize(14));
  CHECK(dc::ggml_can_dequantize(6));
  CHECK(dc::ggml_row_bytes(12, 512) == 288);
  CHECK(dc::ggml_row_bytes(14, 256) == 210);
  CHECK_THROWS_WITH_AS(dc::dequantize(12, zeros.data(), out, 255),
                       doctest::Contains("255 elements are not a whole number of Q4_K blocks of 256"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::dequantize(14, zeros.data(), out, 288),
                       doctest::Contains("not a whole number of Q6_K blocks of 256"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::ggml_row_bytes(12, 32), doctest::Contains("not a whole number of Q4_K blocks"),
                       dc::Error);

  const std::vector<std::uint8_t> good = read_bytes(kDir + "/kquants.gguf");
  SUBCASE("a Q4_K row of 384 elements: a multiple of 128 but not of the 256-element super-block") {
    std::vector<std::uint8_t> bad = good;
    const std::uint64_t ne0 = 384;
    std::memcpy(bad.data() + ne0_offset(bad, "q4_k"), &ne0, 8);
    const fs::path p = write_bytes(dir.path / "row384.gguf", bad);
    CHECK_THROWS_WITH_AS(dc::GgufFile{p},
                         doctest::Contains("tensor 'q4_k': first dimension 384 is not a multiple of the Q4_K "
                                           "block size 256"),
                         dc::Error);
  }
  SUBCASE("a file cut inside the Q6_K tensor's data") {
    const dc::GgufFile f(kDir + "/kquants.gguf");
    const dc::GgufTensorInfo& q6 = f.tensor("q6_k");
    const std::vector<std::uint8_t> cut(good.begin(), good.begin() + std::ptrdiff_t(f.data_offset() + q6.offset + 100));
    const fs::path p = write_bytes(dir.path / "cut.gguf", cut);
    CHECK_THROWS_WITH_AS(dc::GgufFile{p}, doctest::Contains("tensor 'q6_k': data truncated: 1260 bytes"),
                         dc::Error);
  }
}
