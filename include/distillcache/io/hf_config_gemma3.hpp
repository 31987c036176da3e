#pragma once
// Hugging Face config.json of a Gemma 3 text model (model_type "gemma3_text", the
// Gemma3ForCausalLM checkpoints) -> dc::ModelConfig with the Gemma switches on.
//
// Defaults are Gemma3TextConfig's where the field is optional (transformers fills them in when it
// loads a config, so a config.json may omit them). Layer kinds come from "layer_types", else from
// the older "sliding_window_pattern" (every pattern-th layer global, default 6); RoPE bases from
// "rope_parameters" per layer kind (transformers 5), else "rope_theta" (global, default 1e6) and
// "rope_local_base_freq" (local, default 1e4). Features the decoder does not implement are
// rejected: RoPE scaling (the larger Gemma 3 models use linear scaling on global layers),
// attention soft-capping, bidirectional attention, biases.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../model/config.hpp"
#include "detail/hf_config_reader.hpp"
#include "detail/json_text.hpp"

namespace dc::detail {

// The RoPE base of one layer kind from rope_parameters[kind] ({rope_type, rope_theta}).
inline float gemma3_rope_theta(const HfConfigReader& r, const nlohmann::json& params, const char* kind,
                               float fallback) {
  const std::string where = std::string("rope_parameters.") + kind;
  if (!params.contains(kind) || params.at(kind).is_null()) return fallback;
  const nlohmann::json& p = params.at(kind);
  DC_CHECK(p.is_object(), r.source(), ": field '", where, "' must be an object, got ", json_text(p));
  const std::string type = p.contains("rope_type") && p.at("rope_type").is_string()
                               ? p.at("rope_type").get<std::string>()
                               : "default";
  DC_CHECK(type == "default", r.source(), ": field '", where, "' has rope type '", type,
           "'; RoPE scaling is not implemented (only 'default')");
  return p.contains("rope_theta") ? r.to_float32(p.at("rope_theta"), where + ".rope_theta") : fallback;
}

inline ModelConfig parse_gemma3_text_config(const HfConfigReader& r) {
  const std::string& source = r.source();
  const nlohmann::json& j = r.json();
  std::string act = r.optional_string("hidden_activation", "");
  if (act.empty()) act = r.optional_string("hidden_act", "gelu_pytorch_tanh");
  DC_CHECK(act == "gelu_pytorch_tanh", source, ": field 'hidden_activation' is '", act,
           "', only 'gelu_pytorch_tanh' is supported for gemma3_text");
  DC_CHECK(!r.optional_bool("attention_bias", false), source,
           ": field 'attention_bias' is true; biased projections are not supported");
  DC_CHECK(!r.optional_bool("use_bidirectional_attention", false), source,
           ": field 'use_bidirectional_attention' is true; only causal attention is supported");
  DC_CHECK(!r.has("attn_logit_softcapping"), source,
           ": field 'attn_logit_softcapping' is set; attention soft-capping is not implemented");

  ModelConfig c;
  c.architecture = "gemma3";
  c.activation = ModelConfig::Activation::gelu_tanh;
  c.scale_embeddings = c.sandwich_norms = c.qk_norm = true;
  read_decoder_shape(r, c);
  c.head_dim = r.optional_int("head_dim", 256);
  c.max_position = r.required_int("max_position_embeddings");
  c.rms_eps = r.has("rms_norm_eps") ? r.required_float("rms_norm_eps") : 1e-6f;
  c.tie_embeddings = r.optional_bool("tie_word_embeddings", true);
  c.sliding_window = r.optional_int("sliding_window", 4096);
  c.query_pre_attn_scalar = r.has("query_pre_attn_scalar") ? r.required_float("query_pre_attn_scalar") : 256.0f;
  DC_CHECK(c.query_pre_attn_scalar > 0.0f, source, ": field 'query_pre_attn_scalar' must be positive, got ",
           c.query_pre_attn_scalar);
  if (r.has("final_logit_softcapping")) {
    c.final_logit_softcap = r.required_float("final_logit_softcapping");
    DC_CHECK(c.final_logit_softcap > 0.0f, source, ": field 'final_logit_softcapping' must be positive, got ",
             c.final_logit_softcap);
  }
  DC_CHECK(c.num_layers > 0, source, ": field 'num_hidden_layers' must be positive, got ", c.num_layers);

  // Layer kinds.
  if (r.has("layer_types")) {
    const nlohmann::json& types = j.at("layer_types");
    DC_CHECK(types.is_array() && types.size() == std::size_t(c.num_layers), source,
             ": field 'layer_types' must be an array of ", c.num_layers, " strings, got ", json_text(types));
    for (const auto& t : types) {
      const std::string kind = t.is_string() ? t.get<std::string>() : json_text(t);
      DC_CHECK(kind == "sliding_attention" || kind == "full_attention", source, ": field 'layer_types' has '",
               kind, "' (only 'sliding_attention' and 'full_attention')");
      c.sliding_layers.push_back(kind == "sliding_attention");
    }
  } else {
    const int pattern = r.optional_int("sliding_window_pattern", 6);
    DC_CHECK(pattern > 0, source, ": field 'sliding_window_pattern' must be positive, got ", pattern);
    for (int l = 0; l < c.num_layers; ++l) c.sliding_layers.push_back((l + 1) % pattern != 0);
  }

  // RoPE bases: global (full_attention) and local (sliding_attention).
  c.rope_theta = r.has("rope_theta") ? r.required_float("rope_theta") : 1000000.0f;
  c.rope_theta_local = r.has("rope_local_base_freq") ? r.required_float("rope_local_base_freq") : 10000.0f;
  if (r.has("rope_scaling")) {
    const std::string type = hf_rope_type(r, "rope_scaling");
    DC_CHECK(type == "default", source, ": field 'rope_scaling' has rope type '", type,
             "'; RoPE scaling is not implemented (only 'default')");
  }
  if (r.has("rope_parameters")) {
    const nlohmann::json& params = j.at("rope_parameters");
    DC_CHECK(params.is_object(), source, ": field 'rope_parameters' must be an object, got ", json_text(params));
    c.rope_theta = gemma3_rope_theta(r, params, "full_attention", c.rope_theta);
    c.rope_theta_local = gemma3_rope_theta(r, params, "sliding_attention", c.rope_theta_local);
  }

  try {
    c.validate();
  } catch (const Error& e) {
    DC_FAIL(source, ": ", e.message());
  }
  return c;
}

}  // namespace dc::detail
