// load_hf_config / load_hf_model on the committed Hugging Face fixtures (values cross-checked
// against numbers printed by the Python safetensors package and against raw shard bytes), and
// on broken checkpoints built in a temp directory.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "../support/temp_dir.hpp"
#include <distillcache/io/hf_checkpoint.hpp>

namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = DC_FIXTURE_DIR;

using dc_test::TempDir;

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

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// An F32 safetensors file holding the given tensors.
struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
void write_f32_safetensors(const fs::path& path, const std::vector<NamedTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<float> data;
  for (const auto& t : tensors) {
    const std::size_t begin = data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, begin + t.values.size() * sizeof(float)}}};
    data.insert(data.end(), t.values.begin(), t.values.end());
  }
  const std::string text = header.dump();
  const std::uint64_t len = text.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xffu));
  out << text;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
}

// A tiny valid Mistral config.json: d=4, 2 heads of dim 2 over 1 KV head, vocab 8.
nlohmann::json tiny_config() {
  return {{"model_type", "mistral"},    {"vocab_size", 8},          {"hidden_size", 4},
          {"intermediate_size", 6},     {"num_hidden_layers", 1},   {"num_attention_heads", 2},
          {"num_key_value_heads", 1},   {"max_position_embeddings", 32}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},      {"sliding_window", nullptr}, {"tie_word_embeddings", false},
          {"hidden_act", "silu"}};
}

// Every tensor the tiny config expects, filled with distinct exactly representable values
// (tensor k, element i -> k + i / 64).
std::vector<NamedTensor> tiny_tensors(const nlohmann::json& config) {
  const dc::ModelConfig cfg = dc::parse_hf_config(config, "tiny");
  dc::HostWeights scratch;
  std::vector<NamedTensor> out;
  dc::for_each_weight(cfg, scratch, [&](const std::string& name, dc::Tensor<float, dc::cpu>&, dc::Shape s) {
    NamedTensor t{name, {}, {}};
    for (int i = 0; i < s.rank; ++i) t.shape.push_back(s[i]);
    const float k = static_cast<float>(out.size());
    for (std::int64_t i = 0; i < s.numel(); ++i) t.values.push_back(k + static_cast<float>(i) / 64.0f);
    out.push_back(std::move(t));
  });
  return out;
}

std::vector<NamedTensor> without(std::vector<NamedTensor> tensors, const std::string& name) {
  std::erase_if(tensors, [&](const NamedTensor& t) { return t.name == name; });
  return tensors;
}

// Writes config.json and model.safetensors into dir.
void write_checkpoint(const fs::path& dir, const nlohmann::json& config, const std::vector<NamedTensor>& tensors) {
  write_text(dir / "config.json", config.dump(2));
  write_f32_safetensors(dir / "model.safetensors", tensors);
}

// Decodes an IEEE binary16 bit pattern with plain arithmetic (independent of dc::to_float).
double decode_f16(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Reads element `index` of an F16 tensor straight from a shard's bytes.
double raw_f16_element(const fs::path& shard, const std::string& name, std::size_t index) {
  std::ifstream in(shard, std::ios::binary);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  std::string header(static_cast<std::size_t>(len), '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  const auto entry = nlohmann::json::parse(header).at(name);
  REQUIRE(entry.at("dtype") == "F16");
  const std::uint64_t begin = entry.at("data_offsets")[0].get<std::uint64_t>();
  in.seekg(static_cast<std::streamoff>(8 + len + begin + 2 * index));
  unsigned char b[2];
  in.read(reinterpret_cast<char*>(b), 2);
  return decode_f16(static_cast<std::uint16_t>(b[0] | (b[1] << 8)));
}

void check_shapes(const dc::HfModel& m) {
  const auto& c = m.config;
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  CHECK(m.weights.embed.shape() == dc::Shape{c.vocab_size, d});
  REQUIRE(m.weights.layers.size() == static_cast<std::size_t>(c.num_layers));
  for (const auto& L : m.weights.layers) {
    CHECK(L.attn_norm.shape() == dc::Shape{d});
    CHECK(L.wq.shape() == dc::Shape{c.q_dim(), d});
    CHECK(L.wk.shape() == dc::Shape{c.kv_dim(), d});
    CHECK(L.wv.shape() == dc::Shape{c.kv_dim(), d});
    CHECK(L.wo.shape() == dc::Shape{d, c.q_dim()});
    CHECK(L.ffn_norm.shape() == dc::Shape{d});
    CHECK(L.w_gate.shape() == dc::Shape{ff, d});
    CHECK(L.w_up.shape() == dc::Shape{ff, d});
    CHECK(L.w_down.shape() == dc::Shape{d, ff});
  }
  CHECK(m.weights.final_norm.shape() == dc::Shape{d});
  if (c.tie_embeddings) CHECK(m.weights.lm_head.empty());
  else CHECK(m.weights.lm_head.shape() == dc::Shape{c.vocab_size, d});
}

}  // namespace

TEST_CASE("hf loader: tiny_mistral (fp32, single file)") {
  const auto folder = kFixtures / "tiny_mistral";
  const dc::HfModel m = dc::load_hf_model(folder);
  const auto& c = m.config;
  CHECK(c.architecture == "mistral");
  CHECK(c.vocab_size == 256);
  CHECK(c.hidden_size == 64);
  CHECK(c.intermediate_size == 96);
  CHECK(c.num_layers == 2);
  CHECK(c.num_heads == 4);
  CHECK(c.num_kv_heads == 2);
  CHECK(c.head_dim == 16);
  CHECK(c.max_position == 256);
  CHECK(c.rms_eps == 1e-5f);
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.sliding_window == 0);
  CHECK_FALSE(c.tie_embeddings);
  check_shapes(m);
  // Reference values printed by the Python safetensors package.
  CHECK(m.weights.embed.data()[0] == -0x1.c1c508p-1f);
  CHECK(m.weights.lm_head.data()[255 * 64 + 63] == 0x1.438e54p-3f);
  CHECK(m.weights.layers[1].w_down.data()[3 * 96 + 0] == 0x1.b706dp-4f);
  CHECK(&m.weights.output_matrix() == &m.weights.lm_head);
}

TEST_CASE("hf loader: tiny_mistral_swa (fp16, sharded)") {
  const auto folder = kFixtures / "tiny_mistral_swa";
  dc::HfModel m = dc::load_hf_model(folder);
  CHECK(m.config.sliding_window == 8);
  CHECK(m.config.rope_theta == 1e6f);
  CHECK(m.config.num_kv_heads == 2);
  CHECK_FALSE(m.config.tie_embeddings);
  check_shapes(m);
  CHECK(m.weights.embed.data()[1] == 0x1.a4p-1f);
  CHECK(m.weights.lm_head.data()[255 * 64 + 63] == -0x1.6acp-5f);
  CHECK(m.weights.layers[1].w_down.data()[3 * 96 + 0] == 0x1.8ecp-6f);
  CHECK(m.weights.final_norm.data()[5] == 0x1.0e4p+0f);

  // Every tensor of the weight map, read from its own shard, equals the loaded tensor; one
  // element per tensor is also decoded from the raw bytes.
  const auto index = read_json(folder / "model.safetensors.index.json");
  std::map<std::string, const dc::Tensor<float, dc::cpu>*> loaded;
  dc::for_each_weight(m.config, m.weights, [&](const std::string& name, dc::Tensor<float, dc::cpu>& t, dc::Shape) {
    loaded[name] = &t;
  });
  CHECK(index.at("weight_map").size() == loaded.size());
  for (const auto& item : index.at("weight_map").items()) {
    const std::string& name = item.key();
    const auto& shard = item.value();
    CAPTURE(name);
    REQUIRE(loaded.count(name));
    const auto& got = *loaded.at(name);
    const auto shard_path = folder / shard.get<std::string>();
    const auto direct = dc::SafetensorsFile(shard_path).read_float(name);
    REQUIRE(direct.shape() == got.shape());
    CHECK(std::memcmp(direct.data(), got.data(), got.bytes()) == 0);
    const auto last = static_cast<std::size_t>(got.numel() - 1);
    CHECK(static_cast<double>(got.data()[last]) == raw_f16_element(shard_path, name, last));
  }
}

TEST_CASE("hf loader: tiny_llama_tied (bf16, tied, no lm_head)") {
  const dc::HfModel m = dc::load_hf_model(kFixtures / "tiny_llama_tied");
  const auto& c = m.config;
  CHECK(c.architecture == "llama");
  CHECK(c.intermediate_size == 160);
  CHECK(c.num_heads == 4);
  CHECK(c.num_kv_heads == 1);
  CHECK(c.head_dim == 16);
  CHECK(c.rms_eps == 1e-6f);
  CHECK(c.rope_theta == 5e5f);
  CHECK(c.sliding_window == 0);
  CHECK(c.tie_embeddings);
  check_shapes(m);
  CHECK(&m.weights.output_matrix() == &m.weights.embed);
  CHECK(m.weights.embed.data()[0] == 0x1.c4p-4f);
  CHECK(m.weights.layers[1].w_down.data()[3 * 160 + 0] == -0x1.d6p-7f);
}

TEST_CASE("hf loader: oracle files hold tokens and logits") {
  for (const char* name : {"tiny_mistral", "tiny_mistral_swa", "tiny_llama_tied"}) {
    CAPTURE(name);
    const dc::SafetensorsFile oracle(kFixtures / name / "oracle.safetensors");
    const auto tokens = oracle.read_i32("tokens");
    CHECK(tokens.size() == 24);
    for (auto t : tokens) CHECK((t >= 0 && t < 256));
    CHECK(oracle.read_float("logits").shape() == dc::Shape{24, 256});
  }
}

TEST_CASE("hf config: field mapping, defaults and both rope_theta styles") {
  auto j = tiny_config();
  dc::ModelConfig c = dc::parse_hf_config(j, "config.json");
  CHECK(c.architecture == "mistral");
  CHECK(c.head_dim == 2);  // absent -> hidden_size / num_attention_heads
  CHECK(c.num_kv_heads == 1);
  CHECK(c.sliding_window == 0);
  CHECK(c.rope_theta == 10000.0f);

  j.erase("num_key_value_heads");
  j["head_dim"] = nullptr;
  j.erase("tie_word_embeddings");
  j.erase("sliding_window");
  j.erase("hidden_act");
  j.erase("rope_theta");
  j["model_type"] = "llama";
  c = dc::parse_hf_config(j, "config.json");
  CHECK(c.architecture == "llama");
  CHECK(c.num_kv_heads == 2);
  CHECK(c.head_dim == 2);
  CHECK_FALSE(c.tie_embeddings);
  CHECK(c.rope_theta == 10000.0f);

  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  j["sliding_window"] = 16;
  j["head_dim"] = 8;
  CHECK(dc::parse_hf_config(j, "config.json").rope_theta == 500000.0f);
  CHECK(dc::parse_hf_config(j, "config.json").sliding_window == 16);
  CHECK(dc::parse_hf_config(j, "config.json").head_dim == 8);
  j["rope_theta"] = 500000;  // both styles present and agreeing: fine
  CHECK(dc::parse_hf_config(j, "config.json").rope_theta == 500000.0f);
  j["rope_scaling"] = nullptr;
  CHECK_NOTHROW(dc::parse_hf_config(j, "config.json"));
}

TEST_CASE("hf config: errors name the field") {
  const auto fails_with = [](const std::function<void(nlohmann::json&)>& edit,
                             std::initializer_list<std::string_view> parts) {
    auto j = tiny_config();
    edit(j);
    check_error([&] { (void)dc::parse_hf_config(j, "config.json"); }, parts);
  };
  fails_with([](auto& j) { j.erase("hidden_size"); }, {"config.json", "'hidden_size' missing"});
  fails_with([](auto& j) { j["hidden_size"] = nullptr; }, {"'hidden_size' missing"});
  fails_with([](auto& j) { j["hidden_size"] = "64"; }, {"'hidden_size' must be an integer"});
  fails_with([](auto& j) { j["num_hidden_layers"] = 2.5; }, {"'num_hidden_layers' must be an integer"});
  fails_with([](auto& j) { j["vocab_size"] = 1ll << 40; }, {"'vocab_size' out of int range"});
  fails_with([](auto& j) { j["rms_norm_eps"] = "small"; }, {"'rms_norm_eps' must be a number"});
  fails_with([](auto& j) { j["tie_word_embeddings"] = 1; }, {"'tie_word_embeddings' must be a boolean"});
  fails_with([](auto& j) { j.erase("model_type"); }, {"'model_type' missing"});
  fails_with([](auto& j) { j["model_type"] = "gpt2"; }, {"model_type 'gpt2'", "not supported"});
  fails_with([](auto& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "gelu"});
  fails_with([](auto& j) { j["attention_bias"] = true; }, {"'attention_bias'"});
  fails_with([](auto& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, {"'rope_scaling'", "linear"});
  fails_with([](auto& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}}; },
             {"'rope_parameters'", "yarn"});
  fails_with([](auto& j) { j["rope_parameters"] = {{"rope_theta", 5e5}}; }, {"'rope_theta'", "disagree"});
  fails_with([](auto& j) { j["rope_parameters"] = {{"rope_theta", "big"}}; },
             {"'rope_parameters.rope_theta' must be a number"});
  fails_with([](auto& j) { j.erase("head_dim"); j["hidden_size"] = 5; }, {"'head_dim'"});
  fails_with([](auto& j) { j["num_attention_heads"] = 3; j["num_key_value_heads"] = 2; j["head_dim"] = 2; },
             {"num_key_value_heads"});
  fails_with([](auto& j) { j["sliding_window"] = -1; }, {"sliding_window"});
  check_error([] { (void)dc::parse_hf_config(nlohmann::json::array(), "config.json"); }, {"JSON object"});
}

TEST_CASE("hf loader: broken config.json files") {
  TempDir dir;
  const auto cfg = dir / "config.json";
  check_error([&] { (void)dc::load_hf_config(cfg); }, {"config.json", "cannot open"});
  write_text(cfg, "{\"model_type\": \"mistral\",");
  check_error([&] { (void)dc::load_hf_config(cfg); }, {"config.json", "not valid JSON"});
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"config.json", "not valid JSON"});
  auto j = tiny_config();
  j.erase("intermediate_size");
  write_text(cfg, j.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"config.json", "'intermediate_size' missing"});
  j = tiny_config();
  j["model_type"] = "qwen2";
  write_text(cfg, j.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"config.json", "qwen2"});
  j = tiny_config();
  j["num_attention_heads"] = "2";
  write_text(cfg, j.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"'num_attention_heads' must be an integer"});
}

TEST_CASE("hf loader: synthetic checkpoint round-trips and tied lm_head is ignored") {
  TempDir dir;
  auto config = tiny_config();
  const auto tensors = tiny_tensors(config);
  write_checkpoint(dir.path, config, tensors);
  dc::HfModel m = dc::load_hf_model(dir.path);
  check_shapes(m);
  // Every loaded tensor holds exactly the values written, in for_each_weight order.
  std::size_t k = 0;
  dc::for_each_weight(m.config, m.weights, [&](const std::string& name, dc::Tensor<float, dc::cpu>& t, dc::Shape) {
    CAPTURE(name);
    REQUIRE(k < tensors.size());
    CHECK(name == tensors[k].name);
    REQUIRE(static_cast<std::size_t>(t.numel()) == tensors[k].values.size());
    CHECK(std::memcmp(t.data(), tensors[k].values.data(), t.bytes()) == 0);
    ++k;
  });
  CHECK(k == tensors.size());

  config["tie_word_embeddings"] = true;  // file still has lm_head.weight: ignored
  write_text(dir / "config.json", config.dump());
  m = dc::load_hf_model(dir.path);
  CHECK(m.weights.lm_head.empty());
  CHECK(m.weights.embed.data()[1] == 1.0f / 64.0f);
}

TEST_CASE("hf loader: broken weights name the tensor and the file") {
  TempDir dir;
  const auto config = tiny_config();
  const auto tensors = tiny_tensors(config);
  const std::string wk = "model.layers.0.self_attn.k_proj.weight";

  write_text(dir / "config.json", config.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"no model.safetensors or model.safetensors.index.json"});

  write_checkpoint(dir.path, config, without(tensors, wk));
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {wk, "missing", "model.safetensors"});

  write_checkpoint(dir.path, config, without(tensors, "lm_head.weight"));
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"'lm_head.weight' missing"});

  auto misshapen = tensors;
  for (auto& t : misshapen)
    if (t.name == wk) t.shape = {4, 2};  // transposed: same numel, wrong shape
  write_checkpoint(dir.path, config, misshapen);
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {wk, "shape [4, 2]", "expected [2, 4]"});

  write_checkpoint(dir.path, config, tensors);
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 3);
  // Data is laid out in for_each_weight order, so the cut lands in the last tensor written.
  check_error([&] { (void)dc::load_hf_model(dir.path); },
              {"model.safetensors", "'" + tensors.back().name + "'", "past the end"});
}

TEST_CASE("hf loader: sharded checkpoints and bad index files") {
  TempDir dir;
  const auto config = tiny_config();
  const auto tensors = tiny_tensors(config);
  write_text(dir / "config.json", config.dump());

  // Two shards: the first half of the tensors, then the rest.
  const std::size_t half = tensors.size() / 2;
  const std::vector<NamedTensor> first(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(half));
  const std::vector<NamedTensor> second(tensors.begin() + static_cast<std::ptrdiff_t>(half), tensors.end());
  write_f32_safetensors(dir / "a.safetensors", first);
  write_f32_safetensors(dir / "b.safetensors", second);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& t : first) index["weight_map"][t.name] = "a.safetensors";
  for (const auto& t : second) index["weight_map"][t.name] = "b.safetensors";
  const auto index_path = dir / "model.safetensors.index.json";
  write_text(index_path, index.dump());

  const dc::HfModel m = dc::load_hf_model(dir.path);
  CHECK(m.weights.final_norm.data()[3] == static_cast<float>(tensors.size() - 2) + 3.0f / 64.0f);
  CHECK(m.weights.lm_head.data()[0] == static_cast<float>(tensors.size() - 1));

  const std::string norm = "model.norm.weight";
  auto bad = index;
  bad["weight_map"][norm] = "c.safetensors";
  write_text(index_path, bad.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"index.json", "'c.safetensors'", norm, "does not exist"});

  for (const char* evil : {"../b.safetensors", "sub/b.safetensors", "..", "", "..\\b.safetensors"}) {
    CAPTURE(evil);
    bad = index;
    bad["weight_map"][norm] = evil;
    write_text(index_path, bad.dump());
    check_error([&] { (void)dc::load_hf_model(dir.path); }, {"index.json", norm, "plain file name"});
  }

  bad = index;
  bad["weight_map"][norm] = "a.safetensors";  // mapped to a shard that lacks it
  write_text(index_path, bad.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {norm, "'a.safetensors'", "does not contain"});

  bad = index;
  bad["weight_map"].erase(norm);
  write_text(index_path, bad.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {norm, "missing", "weight_map"});

  bad = index;
  bad["weight_map"][norm] = 3;
  write_text(index_path, bad.dump());
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {norm, "must be a string"});

  write_text(index_path, R"({"metadata": {}})");
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"index.json", "'weight_map'"});
  write_text(index_path, "{");
  check_error([&] { (void)dc::load_hf_model(dir.path); }, {"index.json", "not valid JSON"});
}
