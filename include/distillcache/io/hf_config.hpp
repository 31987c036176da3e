#pragma once
// Hugging Face config.json -> dc::ModelConfig for "llama" and "mistral" checkpoints.
//
// Accepts both config styles in the wild: transformers <= 4.x writes a top-level "rope_theta",
// transformers 5.x writes "rope_parameters": {"rope_theta", "rope_type"}. Anything the decoder
// does not implement (RoPE scaling, biases, other activations) is rejected here rather than
// silently producing wrong logits.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../model/config.hpp"
#include "detail/json_text.hpp"

namespace dc {

namespace detail {

// Field readers: every error names the source and the field. A JSON null counts as absent,
// since transformers writes null for unset optional fields.
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& j, std::string_view source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int required_int(const char* key) const {
    DC_CHECK(has(key), source_, ": field '", key, "' missing");
    return to_int(j_.at(key), key);
  }
  int optional_int(const char* key, int fallback) const {
    return has(key) ? to_int(j_.at(key), key) : fallback;
  }
  float required_float(const char* key) const {
    DC_CHECK(has(key), source_, ": field '", key, "' missing");
    return to_float32(j_.at(key), key);
  }
  bool optional_bool(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    DC_CHECK(j_.at(key).is_boolean(), source_, ": field '", key, "' must be a boolean, got ",
             detail::json_text(j_.at(key)));
    return j_.at(key).get<bool>();
  }
  std::string optional_string(const char* key, std::string fallback) const {
    if (!has(key)) return fallback;
    DC_CHECK(j_.at(key).is_string(), source_, ": field '", key, "' must be a string, got ",
             detail::json_text(j_.at(key)));
    return j_.at(key).get<std::string>();
  }

  int to_int(const nlohmann::json& v, std::string_view key) const {
    DC_CHECK(v.is_number_integer(), source_, ": field '", key, "' must be an integer, got ",
             detail::json_text(v));
    const bool fits = v.is_number_unsigned()
                          ? v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<int>::max())
                          : v.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                                v.get<std::int64_t>() <= std::numeric_limits<int>::max();
    DC_CHECK(fits, source_, ": field '", key, "' out of int range: ", detail::json_text(v));
    return static_cast<int>(v.get<std::int64_t>());
  }
  float to_float32(const nlohmann::json& v, std::string_view key) const {
    DC_CHECK(v.is_number(), source_, ": field '", key, "' must be a number, got ",
             detail::json_text(v));
    const double x = v.get<double>();
    DC_CHECK(std::isfinite(x) && std::fabs(x) <= double(std::numeric_limits<float>::max()), source_,
             ": field '", key, "' out of float range: ", detail::json_text(v));
    return static_cast<float>(x);
  }

  const nlohmann::json& json() const { return j_; }
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& j_;
  std::string source_;
};

// The RoPE type named by a rope_scaling / rope_parameters object ("type" is the pre-4.45 key).
inline std::string hf_rope_type(const HfConfigReader& r, const char* key) {
  const auto& obj = r.json().at(key);
  DC_CHECK(obj.is_object(), r.source(), ": field '", key, "' must be an object, got ",
           detail::json_text(obj));
  for (const char* type_key : {"rope_type", "type"}) {
    if (!obj.contains(type_key) || obj.at(type_key).is_null()) continue;
    DC_CHECK(obj.at(type_key).is_string(), r.source(), ": field '", key, ".", type_key,
             "' must be a string, got ", detail::json_text(obj.at(type_key)));
    return obj.at(type_key).get<std::string>();
  }
  return "default";
}

}  // namespace detail

inline ModelConfig parse_hf_config(const nlohmann::json& j, std::string_view source) {
  DC_CHECK(j.is_object(), source, ": must be a JSON object, got ", j.type_name());
  const detail::HfConfigReader r(j, source);

  DC_CHECK(r.has("model_type"), source, ": field 'model_type' missing");
  const std::string model_type = r.optional_string("model_type", "");
  DC_CHECK(model_type == "llama" || model_type == "mistral", source, ": model_type '", model_type,
           "' is not supported (only 'llama' and 'mistral')");

  const std::string act = r.optional_string("hidden_act", "silu");
  DC_CHECK(act == "silu", source, ": field 'hidden_act' is '", act, "', only 'silu' is supported");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    DC_CHECK(!r.optional_bool(bias, false), source, ": field '", bias,
             "' is true; biased projections are not supported");

  ModelConfig c;
  c.architecture = model_type;
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.intermediate_size = r.required_int("intermediate_size");
  c.num_layers = r.required_int("num_hidden_layers");
  c.num_heads = r.required_int("num_attention_heads");
  c.num_kv_heads = r.optional_int("num_key_value_heads", c.num_heads);
  DC_CHECK(c.num_heads > 0, source, ": field 'num_attention_heads' must be positive, got ", c.num_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.required_int("head_dim");
  } else {
    DC_CHECK(c.hidden_size % c.num_heads == 0, source, ": field 'head_dim' absent and hidden_size (",
             c.hidden_size, ") is not a multiple of num_attention_heads (", c.num_heads, ")");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.max_position = r.required_int("max_position_embeddings");
  c.rms_eps = r.required_float("rms_norm_eps");
  c.sliding_window = r.optional_int("sliding_window", 0);
  c.tie_embeddings = r.optional_bool("tie_word_embeddings", false);

  // RoPE: theta may live at the top level (old style) or in rope_parameters (new style).
  c.rope_theta = 10000.0f;
  const bool top_theta = r.has("rope_theta");
  if (top_theta) c.rope_theta = r.required_float("rope_theta");
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const std::string type = detail::hf_rope_type(r, key);
    DC_CHECK(type == "default", source, ": field '", key, "' has rope type '", type,
             "'; RoPE scaling is not implemented (only 'default')");
  }
  if (r.has("rope_parameters") && j.at("rope_parameters").contains("rope_theta")) {
    const float nested = r.to_float32(j.at("rope_parameters").at("rope_theta"), "rope_parameters.rope_theta");
    DC_CHECK(!top_theta || nested == c.rope_theta, source,
             ": fields 'rope_theta' and 'rope_parameters.rope_theta' disagree (", c.rope_theta, " vs ",
             nested, ")");
    c.rope_theta = nested;
  }

  try {
    c.validate();
  } catch (const Error& e) {
    DC_FAIL(source, ": ", e.message());
  }
  return c;
}

inline ModelConfig load_hf_config(const std::filesystem::path& config_json) {
  const std::string source = config_json.string();
  std::ifstream in(config_json);
  DC_CHECK(in.is_open(), source, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    DC_FAIL(source, ": not valid JSON: ", e.what());
  }
  return parse_hf_config(j, source);
}

}  // namespace dc
