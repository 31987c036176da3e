// dc::SafetensorsFile against files written byte by byte here (known bit patterns, so the
// expected values do not depend on our own converters) and against every malformed input the
// reader must reject with a dc::Error naming the file and the tensor or field.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "../support/temp_dir.hpp"
#include <distillcache/io/safetensors.hpp>

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

using dc_test::TempDir;

template <class T>
Bytes to_bytes(const std::vector<T>& values) {  // host is little-endian, like the format
  Bytes out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Writes a file with an arbitrary header text and data section; declared_len overrides the
// 8-byte length prefix so tests can make it lie.
void write_raw(const fs::path& path, const std::string& header, const Bytes& data,
               std::uint64_t declared_len) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((declared_len >> (8 * i)) & 0xffu));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}
void write_raw(const fs::path& path, const std::string& header, const Bytes& data = {}) {
  write_raw(path, header, data, header.size());
}

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  Bytes bytes;
};

// A well-formed file: tensors laid out back to back in the order given.
void write_safetensors(const fs::path& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  Bytes data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  write_raw(path, header.dump(), data);
}

// Runs fn, expects a dc::Error, and checks its message contains every part.
template <class Fn>
void check_error(Fn&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
  } catch (const dc::Error& e) {
    const std::string what = e.what();
    INFO("message: ", what);
    for (std::string_view p : parts) CHECK(what.find(p) != std::string::npos);
    return;
  }
  FAIL("expected dc::Error containing '", *parts.begin(), "'");
}

// One-entry header with the given JSON for tensor "w", followed by data bytes.
std::string entry(const std::string& body) { return "{\"w\": " + body + "}"; }

}  // namespace

TEST_CASE("safetensors: F32, F16 and BF16 decode to the exact fp32 values") {
  TempDir dir;
  const auto file = dir / "values.safetensors";
  // Expected values and their encodings, written as bit patterns by hand.
  const std::vector<float> expected = {1.0f, -2.5f, 0.375f, 65504.0f, 0x1p-24f, -0.0f};
  const std::vector<std::uint16_t> f16_bits = {0x3C00, 0xC100, 0x3600, 0x7BFF, 0x0001, 0x8000};
  const std::vector<std::uint16_t> bf16_bits = {0x3F80, 0xC020, 0x3EC0, 0x477F, 0x3380, 0x8000};
  // bf16 cannot hold 65504 exactly: 0x477F is 65280. 0x3380 is 2^-24.
  const std::vector<float> expected_bf16 = {1.0f, -2.5f, 0.375f, 65280.0f, 0x1p-24f, -0.0f};
  write_safetensors(file, {{"f32", "F32", {2, 3}, to_bytes(expected)},
                           {"f16", "F16", {6}, to_bytes(f16_bits)},
                           {"bf16", "BF16", {3, 1, 2}, to_bytes(bf16_bits)},
                           {"bf16_subnormal", "BF16", {}, to_bytes(std::vector<std::uint16_t>{0x0001})}});

  const dc::SafetensorsFile st(file);
  CHECK(st.names() == std::vector<std::string>{"bf16", "bf16_subnormal", "f16", "f32"});
  CHECK(st.contains("f16"));
  CHECK_FALSE(st.contains("__metadata__"));
  CHECK(st.metadata().at("format") == "pt");
  CHECK(st.info("f32").dtype == "F32");
  CHECK(st.info("f32").shape == std::vector<std::int64_t>{2, 3});
  CHECK(st.info("f32").numel == 6);
  CHECK(st.info("f16").begin == 24);
  CHECK(st.info("f16").end == 36);

  const auto f32 = st.read_float("f32");
  CHECK(f32.shape() == dc::Shape{2, 3});
  const auto f16 = st.read_float("f16");
  CHECK(f16.shape() == dc::Shape{6});
  const auto bf16 = st.read_float("bf16");
  CHECK(bf16.shape() == dc::Shape{3, 1, 2});
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(f32.data()[i] == expected[i]);
    CHECK(f16.data()[i] == expected[i]);
    CHECK(bf16.data()[i] == expected_bf16[i]);
    CHECK(std::signbit(f16.data()[i]) == std::signbit(expected[i]));
  }
  // Scalar: rank 0, one element; smallest bf16 subnormal is 2^-133.
  const auto scalar = st.read_float("bf16_subnormal");
  CHECK(scalar.shape().rank == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.data()[0] == 0x1p-133f);
}

TEST_CASE("safetensors: integer tensors, empty tensors, rank and dtype guards") {
  TempDir dir;
  const auto file = dir / "ints.safetensors";
  write_safetensors(file, {{"i32", "I32", {4}, to_bytes(std::vector<std::int32_t>{0, -1, 2147483647, -2147483647 - 1})},
                           {"i64", "I64", {2, 2}, to_bytes(std::vector<std::int64_t>{7, -8, 100000, 0})},
                           {"i64_big", "I64", {1}, to_bytes(std::vector<std::int64_t>{std::int64_t(1) << 40})},
                           {"empty", "F32", {0, 4}, {}},
                           {"rank5", "F32", {1, 1, 1, 1, 2}, to_bytes(std::vector<float>{1, 2})},
                           {"u8", "U8", {3}, Bytes{1, 2, 3}}});
  const dc::SafetensorsFile st(file);
  CHECK(st.read_i32("i32") == std::vector<std::int32_t>{0, -1, 2147483647, -2147483647 - 1});
  CHECK(st.read_i32("i64") == std::vector<std::int32_t>{7, -8, 100000, 0});
  check_error([&] { (void)st.read_i32("i64_big"); }, {"ints.safetensors", "'i64_big'", "int32"});

  const auto empty = st.read_float("empty");
  CHECK(empty.shape() == dc::Shape{0, 4});
  CHECK(empty.numel() == 0);

  check_error([&] { (void)st.read_float("rank5"); }, {"ints.safetensors", "'rank5'", "rank 5"});
  check_error([&] { (void)st.read_float("i32"); }, {"'i32'", "I32", "float"});
  check_error([&] { (void)st.read_i32("empty"); }, {"'empty'", "F32", "int32"});
  check_error([&] { (void)st.read_float("u8"); }, {"'u8'", "U8"});  // known dtype, not readable
  check_error([&] { (void)st.info("nope"); }, {"ints.safetensors", "'nope'"});
  check_error([&] { (void)st.read_float("nope"); }, {"'nope'"});
}

TEST_CASE("safetensors: committed fixtures") {
  const fs::path fixtures = DC_FIXTURE_DIR;
  const dc::SafetensorsFile ops(fixtures / "ops" / "ops.safetensors");
  CHECK(ops.contains("rmsnorm_x"));
  CHECK(ops.info("rmsnorm_x").shape == std::vector<std::int64_t>{5, 64});
  CHECK(ops.info("rope_x").shape == std::vector<std::int64_t>{6, 2, 16});
  CHECK(ops.read_i32("rope_pos") == std::vector<std::int32_t>{0, 1, 2, 7, 100, 1000});

  // Values printed by the Python safetensors package for tiny_mistral/oracle.safetensors.
  const dc::SafetensorsFile oracle(fixtures / "tiny_mistral" / "oracle.safetensors");
  CHECK(oracle.names() == std::vector<std::string>{"logits", "tokens"});
  const auto tokens = oracle.read_i32("tokens");
  REQUIRE(tokens.size() == 24);
  CHECK(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 5) ==
        std::vector<std::int32_t>{250, 250, 252, 97, 43});
  const auto logits = oracle.read_float("logits");
  CHECK(logits.shape() == dc::Shape{24, 256});
  CHECK(logits.data()[0] == -0.42139941453933716f);
}

TEST_CASE("safetensors: file-level errors name the file") {
  TempDir dir;
  check_error([&] { dc::SafetensorsFile st(dir / "absent.safetensors"); }, {"absent.safetensors", "missing"});
  check_error([&] { dc::SafetensorsFile st(dir.path); }, {"not a regular file"});

  {
    const auto file = dir / "short.safetensors";
    std::ofstream(file, std::ios::binary) << "abc";
    check_error([&] { dc::SafetensorsFile st(file); }, {"short.safetensors", "shorter than"});
  }
  {
    const auto file = dir / "huge_len.safetensors";
    write_raw(file, "{}", {}, std::uint64_t(1) << 63);
    check_error([&] { dc::SafetensorsFile st(file); }, {"huge_len.safetensors", "header length", "limit"});
    write_raw(file, "{}", {}, dc::SafetensorsFile::kMaxHeaderBytes + 1);
    check_error([&] { dc::SafetensorsFile st(file); }, {"header length", "limit"});
  }
  {
    const auto file = dir / "long_len.safetensors";
    write_raw(file, "{}", {}, 1000);
    check_error([&] { dc::SafetensorsFile st(file); }, {"long_len.safetensors", "header length 1000", "past the end"});
  }
  const auto file = dir / "bad.safetensors";
  write_raw(file, "{\"w\": ");
  check_error([&] { dc::SafetensorsFile st(file); }, {"bad.safetensors", "not valid JSON"});
  write_raw(file, "");
  check_error([&] { dc::SafetensorsFile st(file); }, {"bad.safetensors", "not valid JSON"});
  write_raw(file, "[1, 2]");
  check_error([&] { dc::SafetensorsFile st(file); }, {"bad.safetensors", "JSON object", "array"});
  write_raw(file, "{\"__metadata__\": 3}");
  check_error([&] { dc::SafetensorsFile st(file); }, {"__metadata__"});

  // An empty header object is a valid file with no tensors; trailing spaces are allowed padding.
  write_raw(file, "{}        ");
  CHECK(dc::SafetensorsFile(file).names().empty());
}

TEST_CASE("safetensors: entry errors name the file, the tensor and the field") {
  TempDir dir;
  const auto file = dir / "entry.safetensors";
  const Bytes eight_bytes(8, 0);
  struct Case {
    std::string body;
    std::vector<std::string_view> parts;
  };
  const std::vector<Case> cases = {
      {"3", {"'w'", "JSON object"}},
      {R"({"shape": [2], "data_offsets": [0, 8]})", {"'w'", "'dtype' missing"}},
      {R"({"dtype": "F32", "data_offsets": [0, 8]})", {"'w'", "'shape' missing"}},
      {R"({"dtype": "F32", "shape": [2]})", {"'w'", "'data_offsets' missing"}},
      {R"({"dtype": 4, "shape": [2], "data_offsets": [0, 8]})", {"'w'", "'dtype' must be a string"}},
      {R"({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})", {"'w'", "'shape' must be an array"}},
      {R"({"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]})", {"'w'", "'shape' must hold integers"}},
      {R"({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]})", {"'w'", "'shape' must hold integers"}},
      {R"({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})", {"'w'", "negative"}},
      {R"({"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 8]})", {"'w'", "absurdly large"}},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 8]})", {"'w'", "too many elements"}},
      {R"({"dtype": "F7", "shape": [2], "data_offsets": [0, 8]})", {"'w'", "unknown dtype 'F7'"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})", {"'w'", "'data_offsets'"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": {"a": 1}})", {"'w'", "'data_offsets'"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, -8]})", {"'w'", "'data_offsets' must hold non-negative"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]})", {"'w'", "reversed"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})", {"'w'", "needs 8"}},
      {R"({"dtype": "F16", "shape": [2], "data_offsets": [0, 8]})", {"'w'", "needs 4"}},
      {R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})", {"'w'", "past the end"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [4, 12]})", {"'w'", "past the end"}},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [18446744073709551608, 18446744073709551615]})", {"'w'", "needs 8"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body);
    write_raw(file, entry(c.body), eight_bytes);
    try {
      dc::SafetensorsFile st(file);
      FAIL("expected dc::Error");
    } catch (const dc::Error& e) {
      const std::string what = e.what();
      INFO("message: ", what);
      CHECK(what.find("entry.safetensors") != std::string::npos);
      for (auto p : c.parts) CHECK(what.find(p) != std::string::npos);
    }
  }
  // Sanity: the same data with a correct entry opens and reads.
  write_raw(file, entry(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})"), eight_bytes);
  CHECK(dc::SafetensorsFile(file).read_float("w").data()[1] == 0.0f);
}

TEST_CASE("safetensors: a file truncated after opening fails on read, naming the tensor") {
  TempDir dir;
  const auto file = dir / "trunc.safetensors";
  write_safetensors(file, {{"a", "F32", {2}, to_bytes(std::vector<float>{1, 2})},
                           {"b", "F32", {2}, to_bytes(std::vector<float>{3, 4})}});
  const dc::SafetensorsFile st(file);
  fs::resize_file(file, fs::file_size(file) - 4);
  CHECK(st.read_float("a").data()[1] == 2.0f);  // still intact
  check_error([&] { (void)st.read_float("b"); }, {"trunc.safetensors", "'b'", "truncated"});
  // Reopening the truncated file is caught by the header check instead.
  check_error([&] { dc::SafetensorsFile again(file); }, {"trunc.safetensors", "'b'", "past the end"});
}
