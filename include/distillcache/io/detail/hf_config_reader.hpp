#pragma once
// Field readers for Hugging Face config.json files (io/hf_config.hpp, io/hf_config_gemma3.hpp):
// every error names the source and the field.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../../core/error.hpp"
#include "../../model/config.hpp"
#include "json_text.hpp"

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

// The decoder shape every config.json states with the same keys (Llama, Mistral, Gemma 3).
inline void read_decoder_shape(const HfConfigReader& r, ModelConfig& c) {
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.intermediate_size = r.required_int("intermediate_size");
  c.num_layers = r.required_int("num_hidden_layers");
  c.num_heads = r.required_int("num_attention_heads");
  c.num_kv_heads = r.optional_int("num_key_value_heads", c.num_heads);
}

}  // namespace detail

}  // namespace dc
