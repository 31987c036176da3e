// dc::PolicyCheckpoint: bitwise round trips, the atomic save, and every malformed file the reader
// must reject with a message naming the problem. Bad files are built here byte by byte, sealed
// with this file's own FNV-1a (checked against published test vectors), so what the reader is
// tested against does not come from the writer under test.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <distillcache/io/policy_checkpoint.hpp>

#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Bytes = std::vector<std::uint8_t>;

std::uint64_t fnv1a(const Bytes& b, std::size_t n) {
  std::uint64_t h = 14695981039346656037ull;  // the FNV-1a 64 offset basis and prime
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void put(Bytes& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(std::uint8_t(v >> (8 * i)));
}

void seal(Bytes& b) { put(b, fnv1a(b, b.size()), 8); }

// A file with arbitrary metadata text and data section, correctly sealed.
Bytes raw_file(const std::string& meta_text, const Bytes& data, std::uint32_t version = 1) {
  Bytes b = {'D', 'C', 'P', 'O', 'L', 'I', 'C', 'Y'};
  put(b, version, 4);
  put(b, meta_text.size(), 8);
  b.insert(b.end(), meta_text.begin(), meta_text.end());
  b.insert(b.end(), data.begin(), data.end());
  seal(b);
  return b;
}

Bytes float_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The small valid checkpoint the bad cases mutate: 2 inputs, hidden [2] (9 weights), adam_m.
std::vector<float> small_weights() { return {0.5f, -1.0f, 0.25f, 2.0f, -0.0f, 1e-40f, 3.0f, -4.5f, 0.125f}; }
json small_meta() {
  return {{"feature_normalisation", "scale_free_v1"},
          {"inputs", {"alpha", "position"}},
          {"hidden", {2}},
          {"activation", "tanh"},
          {"extra", {{"command", "train --budget 0.25"}}},
          {"trainer", {{"step", 3}}},
          {"tensors",
           {{{"name", "weights"}, {"shape", {9}}, {"offset", 0}},
            {{"name", "adam_m"}, {"shape", {9}}, {"offset", 36}}}}};
}
Bytes small_data() {
  Bytes d = float_bytes(small_weights());
  const Bytes m = float_bytes(std::vector<float>(9, 0.01f));
  d.insert(d.end(), m.begin(), m.end());
  return d;
}
Bytes small_file() { return raw_file(small_meta().dump(), small_data()); }

// small_file with the metadata changed by fn (and the data by data_fn).
Bytes with_meta(const std::function<void(json&)>& fn, const std::function<void(Bytes&)>& data_fn = {}) {
  json meta = small_meta();
  fn(meta);
  Bytes data = small_data();
  if (data_fn) data_fn(data);
  return raw_file(meta.dump(), data);
}

// doctest::Contains takes its own string type; std::string needs the detour through char*.
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

dc::PolicyCheckpoint parse(const Bytes& b) { return dc::parse_policy_checkpoint(b, "test.dcp"); }

// A checkpoint exercising everything: random finite bit patterns, signed zero, subnormals, the
// float extremes, several state tensors (one empty), nested extra and trainer state.
dc::PolicyCheckpoint sample_checkpoint(std::uint32_t seed = 1) {
  dc::PolicyCheckpoint c;
  c.feature_normalisation = "scale_free_v1";
  c.inputs = {"alpha", "value_norm", "head_variance", "entropy", "position"};
  c.hidden = {8, 4};
  c.activation = "silu";
  std::mt19937 rng(seed);
  auto random_finite = [&] {
    for (;;) {
      const std::uint32_t bits = std::uint32_t(rng());
      float x;
      std::memcpy(&x, &bits, 4);
      if (std::isfinite(x)) return x;
    }
  };
  c.weights.resize(89);  // (5+1)*8 + (8+1)*4 + (4+1)*1
  for (float& w : c.weights) w = random_finite();
  c.weights[0] = -0.0f;
  c.weights[1] = std::numeric_limits<float>::denorm_min();
  c.weights[2] = std::numeric_limits<float>::max();
  c.weights[3] = std::numeric_limits<float>::lowest();
  c.state["adam_m"].resize(89);
  c.state["adam_v"].resize(89);
  for (float& x : c.state["adam_m"]) x = random_finite();
  for (float& x : c.state["adam_v"]) x = std::fabs(random_finite());
  c.state["empty"] = {};
  c.extra = {{"command", "dc_train --budget 0.25 --seed 7"},
             {"corpus", {{"name", "wikitext"}, {"files", 12}}},
             {"budgets", {0.125, 0.25, 0.5}},
             {"note", "caf\xc3\xa9 \xe2\x9c\x93"}};
  c.trainer = {{"step", 1200},
               {"rng", {{"seed", 7}, {"counter", 123456789012345ull}}},
               {"best_validation", -0.0625}};
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void check_same(const dc::PolicyCheckpoint& got, const dc::PolicyCheckpoint& want) {
  CHECK(got == want);
  CHECK(same_bits(got.weights, want.weights));
  REQUIRE(got.state.size() == want.state.size());
  for (const auto& entry : want.state) {
    const auto& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const auto& values = entry.second;
    CAPTURE(name);
    REQUIRE(got.state.count(name) == 1);
    CHECK(same_bits(got.state.at(name), values));
  }
}

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("FNV-1a 64 matches the published test vectors") {
  const Bytes empty, a = {'a'}, foobar = {'f', 'o', 'o', 'b', 'a', 'r'};
  CHECK(fnv1a(empty, 0) == 0xcbf29ce484222325ull);
  CHECK(fnv1a(a, 1) == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a(foobar, 6) == 0x85944171f73967e8ull);
  CHECK(dc::detail::fnv1a64(a) == 0xaf63dc4c8601ec8cull);
  CHECK(dc::detail::fnv1a64(foobar) == 0x85944171f73967e8ull);
}

TEST_CASE("mlp_parameter_count: sum over layers of in*out + out") {
  CHECK(dc::mlp_parameter_count(5, std::vector<int>{}) == 6);
  CHECK(dc::mlp_parameter_count(5, std::vector<int>{8}) == 5 * 8 + 8 + 8 + 1);
  CHECK(dc::mlp_parameter_count(5, std::vector<int>{8, 4}) == 89);
  CHECK(dc::mlp_parameter_count(64, std::vector<int>{4096, 4096}) == 65 * 4096 + 4097 * 4096 + 4097);
  CHECK_THROWS_WITH_AS(dc::mlp_parameter_count(0, std::vector<int>{8}), doctest::Contains("0 inputs"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::mlp_parameter_count(5, std::vector<int>{8, 0}),
                       doctest::Contains("hidden layer 1 has size 0"), dc::Error);
  const std::vector<int> huge(4, std::numeric_limits<int>::max());
  CHECK_THROWS_WITH_AS(dc::mlp_parameter_count(5, huge), doctest::Contains("overflows int64"), dc::Error);
}

TEST_CASE("round trip: weights and state bit for bit, metadata equal") {
  const dc_test::TempDir dir("dc_policy_rt");
  const dc::PolicyCheckpoint c = sample_checkpoint();
  dc::save_policy_checkpoint(dir / "policy.dcp", c);
  const dc::PolicyCheckpoint back = dc::load_policy_checkpoint(dir / "policy.dcp");
  check_same(back, c);
  CHECK(back.version == 1);
  CHECK(back.extra == c.extra);
  CHECK(back.trainer == c.trainer);
  CHECK(std::signbit(back.weights[0]));

  // The file is exactly the encoding, which is deterministic and parses back to the same value.
  const Bytes encoded = dc::encode_policy_checkpoint(c);
  CHECK(read_file(dir / "policy.dcp") == encoded);
  CHECK(dc::encode_policy_checkpoint(c) == encoded);
  check_same(dc::parse_policy_checkpoint(encoded, "memory"), c);

  SUBCASE("no trainer state, null extra, no state tensors") {
    dc::PolicyCheckpoint bare = c;
    bare.trainer = nullptr;
    bare.extra = nullptr;
    bare.state.clear();
    const dc::PolicyCheckpoint b = parse(dc::encode_policy_checkpoint(bare));
    CHECK(b.trainer.is_null());
    CHECK(b.extra == json::object());  // null extra is written as {}
    CHECK(b.state.empty());
    CHECK(same_bits(b.weights, c.weights));
  }
}

TEST_CASE("the byte layout is the documented one") {
  const dc::PolicyCheckpoint c = sample_checkpoint(3);
  const Bytes b = dc::encode_policy_checkpoint(c);
  REQUIRE(b.size() > 28);
  CHECK(std::string(b.begin(), b.begin() + 8) == "DCPOLICY");
  auto le = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[at + std::size_t(i)];
    return v;
  };
  CHECK(le(8, 4) == 1);
  const std::uint64_t meta_len = le(12, 8);
  const json meta = json::parse(b.begin() + 20, b.begin() + 20 + std::ptrdiff_t(meta_len));
  CHECK(meta.at("inputs") == json(c.inputs));
  CHECK(meta.at("hidden") == json(c.hidden));
  CHECK(meta.at("activation") == "silu");
  CHECK(meta.at("feature_normalisation") == "scale_free_v1");
  CHECK(meta.at("trainer") == c.trainer);
  const std::size_t data_begin = 20 + std::size_t(meta_len);
  std::uint64_t data_size = 0;
  for (const json& t : meta.at("tensors")) {
    const std::string name = t.at("name");
    const std::vector<float>& want = name == "weights" ? c.weights : c.state.at(name);
    CHECK(t.at("shape") == json({want.size()}));
    std::vector<float> got(want.size());
    if (!got.empty())
      std::memcpy(got.data(), b.data() + data_begin + t.at("offset").get<std::size_t>(), got.size() * 4);
    CHECK(same_bits(got, want));
    data_size += want.size() * 4;
  }
  CHECK(b.size() == data_begin + data_size + 8);
  CHECK(le(b.size() - 8, 8) == fnv1a(b, b.size() - 8));
}

TEST_CASE("atomic save: no temporary file left, the old file replaced only completely") {
  const dc_test::TempDir dir("dc_policy_save");
  const fs::path target = dir / "policy.dcp";
  dc::save_policy_checkpoint(target, sample_checkpoint(1));
  CHECK(entries(dir.path) == std::vector<std::string>{"policy.dcp"});
  const dc::PolicyCheckpoint second = sample_checkpoint(2);
  dc::save_policy_checkpoint(target, second);  // over an existing file
  CHECK(entries(dir.path) == std::vector<std::string>{"policy.dcp"});
  CHECK(read_file(target) == dc::encode_policy_checkpoint(second));
  const Bytes old = read_file(target);

  auto unchanged = [&] {
    CHECK(entries(dir.path) == std::vector<std::string>{"policy.dcp"});
    CHECK(read_file(target) == old);
  };

  SUBCASE("an invalid checkpoint is rejected before anything is written") {
    dc::PolicyCheckpoint bad = second;
    bad.weights[3] = NAN;
    CHECK_THROWS_WITH_AS(dc::save_policy_checkpoint(target, bad),
                         doctest::Contains("tensor 'weights': entry 3 is NaN"), dc::Error);
    unchanged();
  }
  SUBCASE("a write that fails half way (file size limit) leaves the old file") {
    dc::PolicyCheckpoint big = second;
    big.state["adam_m"].assign(1 << 20, 0.5f);  // 4 MiB, past the limit below
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit small = saved;
    small.rlim_cur = 64 * 1024;
    auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string message;
    try {
      dc::save_policy_checkpoint(target, big);
    } catch (const dc::Error& e) {
      message = e.message();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    CHECK_MESSAGE(message.find("cannot write the temporary file in") != std::string::npos, message);
    CHECK_MESSAGE(message.find(target.string()) != std::string::npos, message);
    CHECK_MESSAGE(message.find("File too large") != std::string::npos, message);
    unchanged();
  }
  SUBCASE("a directory in the way: the rename fails, nothing is left behind") {
    const fs::path taken = dir / "taken";
    fs::create_directory(taken);
    write_file(taken / "inside", Bytes{1, 2, 3});
    CHECK_THROWS_WITH_AS(dc::save_policy_checkpoint(taken, second),
                         contains("cannot rename the temporary file over '" + taken.string()),
                         dc::Error);
    CHECK(entries(dir.path) == std::vector<std::string>{"policy.dcp", "taken"});
    CHECK(entries(taken) == std::vector<std::string>{"inside"});
    fs::remove_all(taken);
    unchanged();
  }
  SUBCASE("a missing directory") {
    CHECK_THROWS_WITH_AS(dc::save_policy_checkpoint(dir / "nowhere" / "p.dcp", second),
                         doctest::Contains("No such file or directory"), dc::Error);
    unchanged();
  }
  SUBCASE("a directory without write permission") {
    if (::geteuid() == 0) {
      MESSAGE("running as root, which permissions do not stop: case skipped (the file size limit "
              "and directory cases above fail the save as root too)");
      return;
    }
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    std::string message;
    try {
      dc::save_policy_checkpoint(target, sample_checkpoint(5));
    } catch (const dc::Error& e) {
      message = e.message();
    }
    fs::permissions(dir.path, fs::perms::owner_all);
    CHECK_MESSAGE(message.find("Permission denied") != std::string::npos, message);
    unchanged();
  }
}

TEST_CASE("save rejects checkpoints the reader would reject") {
  const dc_test::TempDir dir("dc_policy_save_bad");
  struct Case {
    const char* what;
    std::function<void(dc::PolicyCheckpoint&)> change;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"weights count", [](auto& c) { c.weights.pop_back(); },
       "'weights' holds 88 floats, but an MLP with 5 inputs, hidden [8, 4] and one output has 89 parameters"},
      {"no inputs", [](auto& c) { c.inputs.clear(); }, "the policy has 0 input features; it needs 1 to 64"},
      {"hidden 0", [](auto& c) { c.hidden = {0}; }, "hidden layer 0 has size 0"},
      {"activation", [](auto& c) { c.activation = "gelu"; }, "unknown activation \"gelu\""},
      {"version", [](auto& c) { c.version = 2; }, "format version 2 is not one this code writes"},
      {"state named weights", [](auto& c) { c.state["weights"] = {1.0f}; }, "a state tensor is named 'weights'"},
      {"state name", [](auto& c) { c.state["adam m"] = {1.0f}; }, "state tensor name \"adam m\" is not an identifier"},
      {"state inf", [](auto& c) { c.state["adam_v"][5] = INFINITY; }, "tensor 'adam_v': entry 5 is +inf"},
      {"normalisation", [](auto& c) { c.feature_normalisation = ""; }, "feature_normalisation \"\" is not an identifier"},
      {"extra array", [](auto& c) { c.extra = json::array(); }, "'extra' must be a JSON object, got array"},
      {"extra not UTF-8", [](auto& c) { c.extra["bad"] = std::string("\xff"); }, "cannot encode the metadata"},
      {"trainer NaN", [](auto& c) { c.trainer["best_validation"] = NAN; }, "holds a NaN or infinite number"},
      {"extra too deep",
       [](auto& c) {
         json deep = 1;
         for (int i = 0; i < 100; ++i) deep = json::array({deep});
         c.extra["deep"] = deep;
       },
       "nests deeper than 63 levels"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    dc::PolicyCheckpoint c = sample_checkpoint();
    k.change(c);
    CHECK_THROWS_WITH_AS(dc::save_policy_checkpoint(dir / "p.dcp", c), contains(k.expect), dc::Error);
    CHECK(entries(dir.path).empty());
  }
}

TEST_CASE("every malformed file is rejected with a message naming the problem") {
  const Bytes good = small_file();
  REQUIRE_NOTHROW(parse(good));

  auto patched = [&](std::size_t at, std::uint64_t v, int n) {
    Bytes b = good;
    for (int i = 0; i < n; ++i) b[at + std::size_t(i)] = std::uint8_t(v >> (8 * i));
    return b;
  };
  auto deep = [](int levels) {
    std::string s(std::size_t(levels), '[');
    return s + std::string(std::size_t(levels), ']');
  };
  std::vector<std::string> many_inputs;
  for (int i = 0; i < 65; ++i) many_inputs.push_back(std::string(1, 'f') += std::to_string(i));

  struct Case {
    const char* what;
    Bytes bytes;
    std::string expect;
  };
  const std::vector<Case> cases = {
      // header
      {"bad magic", patched(0, 'X', 1), "not a distillcache policy checkpoint"},
      {"a GGUF file", Bytes{'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0}, "starts with 'GGUF\\x03"},
      {"unknown version", raw_file(small_meta().dump(), small_data(), 2), "unknown format version 2"},
      {"version 0", raw_file(small_meta().dump(), small_data(), 0), "unknown format version 0"},
      {"truncated header", Bytes(good.begin(), good.begin() + 12), "truncated in the header"},
      {"metadata length 2^63", patched(12, 1ull << 63, 8), "metadata length 9223372036854775808 exceeds the limit"},
      {"metadata length past the end", patched(12, good.size(), 8), "truncated in the metadata"},
      {"bad checksum", patched(good.size() - 1, good.back() ^ 1u, 1), "bad checksum"},
      {"a data byte flipped", patched(good.size() - 20, 0x55, 1), "bad checksum"},
      // metadata JSON
      {"malformed JSON", raw_file("{\"inputs\": [", small_data()), "metadata is not valid JSON"},
      {"number out of double range", raw_file("{\"extra\": {\"x\": 1e400}}", {}), "number overflow"},
      {"JSON string not UTF-8", raw_file("{\"extra\": \"\xff\"}", {}), "metadata is not valid JSON"},
      {"metadata an array", raw_file("[]", {}), "metadata must be a JSON object, got array"},
      {"metadata nested deeply", raw_file("{\"extra\": " + deep(100000) + "}", {}), "nests deeper than 64 levels"},
      {"unknown field", with_meta([](json& m) { m["activaton"] = "silu"; }), "unknown metadata field \"activaton\""},
      // fields missing or ill-typed
      {"no feature_normalisation", with_meta([](json& m) { m.erase("feature_normalisation"); }),
       "metadata field 'feature_normalisation' missing"},
      {"no inputs", with_meta([](json& m) { m.erase("inputs"); }), "metadata field 'inputs' missing"},
      {"no hidden", with_meta([](json& m) { m.erase("hidden"); }), "metadata field 'hidden' missing"},
      {"no activation", with_meta([](json& m) { m.erase("activation"); }), "metadata field 'activation' missing"},
      {"no extra", with_meta([](json& m) { m.erase("extra"); }), "metadata field 'extra' missing"},
      {"no tensors", with_meta([](json& m) { m.erase("tensors"); }), "metadata field 'tensors' missing"},
      {"inputs a string", with_meta([](json& m) { m["inputs"] = "alpha"; }), "'inputs' must be an array of strings"},
      {"inputs of numbers", with_meta([](json& m) { m["inputs"] = {1, 2}; }), "'inputs': entry 0 must be a string, got 1"},
      {"hidden a string", with_meta([](json& m) { m["hidden"] = "2"; }), "'hidden' must be an array of integers"},
      {"hidden of floats", with_meta([](json& m) { m["hidden"] = {2.5}; }), "'hidden': entry 0 must be an integer, got 2.5"},
      {"activation a number", with_meta([](json& m) { m["activation"] = 3; }), "'activation' must be a string, got 3"},
      {"normalisation null", with_meta([](json& m) { m["feature_normalisation"] = nullptr; }),
       "'feature_normalisation' must be a string, got null"},
      {"normalisation empty", with_meta([](json& m) { m["feature_normalisation"] = ""; }), "is not an identifier"},
      {"extra an array", with_meta([](json& m) { m["extra"] = json::array(); }), "'extra' must be an object"},
      {"trainer a string", with_meta([](json& m) { m["trainer"] = "x"; }), "'trainer' must be an object or null"},
      // the tensor table
      {"tensors an object", with_meta([](json& m) { m["tensors"] = json::object(); }), "'tensors' must be an array"},
      {"tensor entry a number", with_meta([](json& m) { m["tensors"][1] = 7; }),
       "tensor entry 1 must be an object of exactly 'name', 'shape' and 'offset'"},
      {"tensor entry with a dtype", with_meta([](json& m) { m["tensors"][0]["dtype"] = "F32"; }),
       "tensor entry 0 must be an object of exactly"},
      {"tensor name a number", with_meta([](json& m) { m["tensors"][0]["name"] = 5; }), "'name' must be a string"},
      {"tensor name with a space", with_meta([](json& m) { m["tensors"][1]["name"] = "adam m"; }),
       "tensor name \"adam m\" is not an identifier"},
      {"duplicate tensor names", with_meta([](json& m) { m["tensors"][1]["name"] = "weights"; }),
       "tensor 'weights': listed twice"},
      {"no weights tensor", with_meta([](json& m) { m["tensors"][0]["name"] = "w"; }), "no tensor named 'weights'"},
      {"shape of rank 2", with_meta([](json& m) { m["tensors"][0]["shape"] = {3, 3}; }), "'shape' must be [count]"},
      {"negative count", with_meta([](json& m) { m["tensors"][0]["shape"] = {-1}; }), "negative element count -1"},
      {"count 2^60", with_meta([](json& m) { m["tensors"][0]["shape"] = {1ull << 60}; }), "absurdly large"},
      {"count 2^55 (no allocation)", with_meta([](json& m) { m["tensors"][0]["shape"] = {1ull << 55}; }),
       "run past the end of the 72-byte data section"},
      {"negative offset", with_meta([](json& m) { m["tensors"][0]["offset"] = -4; }),
       "'offset' must be a non-negative integer, got -4"},
      {"fractional offset", with_meta([](json& m) { m["tensors"][0]["offset"] = 1.5; }),
       "'offset' must be a non-negative integer"},
      {"tensor out of bounds", with_meta([](json& m) { m["tensors"][1]["offset"] = 40; }),
       "tensor 'adam_m': 36 bytes at offset 40 run past the end of the 72-byte data section"},
      {"offset 2^64-1", with_meta([](json& m) { m["tensors"][1]["offset"] = ~0ull; }), "run past the end"},
      {"overlapping tensors", with_meta([](json& m) { m["tensors"][1]["offset"] = 32; }, [](Bytes& d) { d.resize(68); }),
       "tensors 'weights' (bytes [0, 36)) and 'adam_m' (bytes [32, 68)) overlap"},
      {"bytes no tensor claims", with_meta([](json&) {}, [](Bytes& d) { d.resize(d.size() + 4); }),
       "the data section holds 76 bytes but the tensors cover only 72"},
      // values
      {"weights count", with_meta([](json& m) { m["hidden"] = {3}; }),
       "'weights' holds 9 floats, but an MLP with 2 inputs, hidden [3] and one output has 13 parameters"},
      {"no inputs listed", with_meta([](json& m) { m["inputs"] = json::array(); }),
       "the policy has 0 input features; it needs 1 to 64"},
      {"65 inputs", with_meta([&](json& m) { m["inputs"] = many_inputs; }), "the policy has 65 input features"},
      {"an input twice", with_meta([](json& m) { m["inputs"] = {"alpha", "alpha"}; }),
       "input feature 'alpha' is listed twice (inputs 0 and 1)"},
      {"no hidden layer", with_meta([](json& m) { m["hidden"] = json::array(); }), "no hidden layer"},
      {"hidden size 0", with_meta([](json& m) { m["hidden"] = {0}; }), "hidden layer 0 has size 0; sizes must be in [1, 4096]"},
      {"hidden size 4097", with_meta([](json& m) { m["hidden"] = {4097}; }), "hidden layer 0 has size 4097"},
      {"hidden size -1", with_meta([](json& m) { m["hidden"] = {-1}; }), "hidden layer 0 has size -1"},
      {"hidden size 2^40", with_meta([](json& m) { m["hidden"] = {1ull << 40}; }), "has size 1099511627776"},
      {"unknown activation", with_meta([](json& m) { m["activation"] = "gelu"; }),
       "unknown activation \"gelu\" (known: silu, tanh, relu)"},
      {"NaN weight", with_meta([](json&) {}, [](Bytes& d) {
         const float nan = NAN;
         std::memcpy(d.data() + 7 * 4, &nan, 4);
       }),
       "tensor 'weights': entry 7 is NaN"},
      {"-inf state", with_meta([](json&) {}, [](Bytes& d) {
         const float inf = -INFINITY;
         std::memcpy(d.data() + 36, &inf, 4);
       }),
       "tensor 'adam_m': entry 0 is -inf"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    CHECK_THROWS_WITH_AS(parse(k.bytes), contains(k.expect), dc::Error);
    CHECK_THROWS_WITH_AS(parse(k.bytes), doctest::Contains("policy checkpoint 'test.dcp': "), dc::Error);
  }
}

TEST_CASE("accepted: unknown feature names, null trainer, no trainer") {
  const dc::PolicyCheckpoint c = parse(with_meta([](json& m) { m["inputs"] = {"foo", "bar.baz"}; }));
  CHECK(c.inputs == std::vector<std::string>{"foo", "bar.baz"});
  CHECK(c.activation == "tanh");
  CHECK(same_bits(c.weights, small_weights()));
  CHECK(c.state.at("adam_m") == std::vector<float>(9, 0.01f));
  CHECK(c.trainer == json{{"step", 3}});
  CHECK(parse(with_meta([](json& m) { m["trainer"] = nullptr; })).trainer.is_null());
  CHECK(parse(with_meta([](json& m) { m.erase("trainer"); })).trainer.is_null());
}

TEST_CASE("truncation at every byte offset is reported as truncation") {
  const Bytes good = small_file();
  for (std::size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_WITH_AS(parse(Bytes(good.begin(), good.begin() + std::ptrdiff_t(n))),
                         doctest::Contains("truncated"), dc::Error);
  }
  // The same through the file reader, including files shorter than the magic.
  const dc_test::TempDir dir("dc_policy_cut");
  for (const std::size_t n : {std::size_t(0), std::size_t(3), std::size_t(8), std::size_t(19),
                              std::size_t(25), good.size() - 1}) {
    CAPTURE(n);
    write_file(dir / "cut.dcp", Bytes(good.begin(), good.begin() + std::ptrdiff_t(n)));
    CHECK_THROWS_WITH_AS(dc::load_policy_checkpoint(dir / "cut.dcp"), doctest::Contains("truncated"), dc::Error);
  }
}

TEST_CASE("flipping any single byte is detected") {
  const Bytes good = small_file();
  const std::size_t data_and_checksum = small_data().size() + 8;
  int by_checksum = 0, total = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (const std::uint8_t mask : {0x01, 0x80, 0xff}) {
      CAPTURE(i);
      CAPTURE(int(mask));
      Bytes b = good;
      b[i] ^= mask;
      ++total;
      try {
        (void)parse(b);
        FAIL_CHECK("accepted a file with byte ", i, " xor ", int(mask));
      } catch (const dc::Error& e) {
        const bool checksum = e.message().find("bad checksum") != std::string::npos;
        by_checksum += checksum;
        // Past the metadata nothing but the checksum can notice a change.
        if (i >= good.size() - data_and_checksum) CHECK_MESSAGE(checksum, e.message());
      }
    }
  }
  MESSAGE(total << " single-byte changes rejected, " << by_checksum << " of them by the checksum");
}

TEST_CASE("load_policy_checkpoint: missing files and other formats") {
  const dc_test::TempDir dir("dc_policy_load");
  CHECK_THROWS_WITH_AS(dc::load_policy_checkpoint(dir / "missing.dcp"), doctest::Contains("file missing"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::load_policy_checkpoint(dir.path), doctest::Contains("not a regular file"), dc::Error);
  const std::string text = "{\"model_type\": \"llama\"}";
  write_file(dir / "config.json", Bytes(text.begin(), text.end()));
  CHECK_THROWS_WITH_AS(dc::load_policy_checkpoint(dir / "config.json"),
                       contains("policy checkpoint '" + (dir / "config.json").string() +
                                "': not a distillcache policy checkpoint"),
                       dc::Error);
  write_file(dir / "small.dcp", small_file());
  CHECK(dc::load_policy_checkpoint(dir / "small.dcp") == parse(small_file()));
}
