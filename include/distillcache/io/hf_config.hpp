#pragma once
// Hugging Face config.json -> dc::ModelConfig for "llama", "mistral" and "gemma3_text"
// checkpoints (the last in io/hf_config_gemma3.hpp).
//
// Accepts both config styles in the wild: transformers <= 4.x writes a top-level "rope_theta",
// transformers 5.x writes "rope_parameters": {"rope_theta", "rope_type"}. Anything the decoder
// does not implement (RoPE scaling, biases, other activations) is rejected here rather than
// silently producing wrong logits.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../model/config.hpp"
#include "detail/hf_config_reader.hpp"
#include "detail/json_file.hpp"
#include "detail/json_text.hpp"
#include "hf_config_gemma3.hpp"

namespace dc {

inline ModelConfig parse_hf_config(const nlohmann::json& j, std::string_view source) {
  DC_CHECK(j.is_object(), source, ": must be a JSON object, got ", j.type_name());
  const detail::HfConfigReader r(j, source);

  DC_CHECK(r.has("model_type"), source, ": field 'model_type' missing");
  const std::string model_type = r.optional_string("model_type", "");
  if (model_type == "gemma3_text") return detail::parse_gemma3_text_config(r);
  DC_CHECK(model_type == "llama" || model_type == "mistral", source, ": model_type '", model_type,
           "' is not supported (only 'llama', 'mistral' and 'gemma3_text')");

  const std::string act = r.optional_string("hidden_act", "silu");
  DC_CHECK(act == "silu", source, ": field 'hidden_act' is '", act, "', only 'silu' is supported");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    DC_CHECK(!r.optional_bool(bias, false), source, ": field '", bias,
             "' is true; biased projections are not supported");

  ModelConfig c;
  c.architecture = model_type;
  detail::read_decoder_shape(r, c);
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
  return parse_hf_config(detail::read_json_file(config_json), config_json.string());
}

}  // namespace dc
