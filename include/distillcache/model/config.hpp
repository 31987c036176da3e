#pragma once
// ModelConfig: the shape of a Llama/Mistral/Gemma 3 decoder, presets for Mistral-7B, and
// validation.
//
// Generic configs come from a Hugging Face config.json (io/hf_config.hpp) or GGUF metadata.
// Gemma 3 is the same decoder with more switches on (docs/design.md, "Gemma 3"): scaled
// embeddings, norms after attention and feed-forward as well as before, per-head q/k norms,
// GeGLU, its own attention scale, local sliding-window layers interleaved with global ones (each
// kind with its own RoPE base) and optional final-logit soft-capping. Every switch defaults to
// the Llama behaviour, so Llama/Mistral configs are unchanged.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../core/error.hpp"

namespace dc {

struct ModelConfig {
  std::string architecture = "llama";  // "llama", "mistral" or "gemma3"
  int vocab_size = 0;
  int hidden_size = 0;        // d
  int intermediate_size = 0;  // SwiGLU / GeGLU width
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads (GQA when < num_heads)
  int head_dim = 0;      // usually hidden_size / num_heads, but may differ
  int max_position = 0;  // longest context the model was trained for
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int sliding_window = 0;  // 0: full causal attention
  bool tie_embeddings = false;

  // Gemma 3 switches (off: Llama/Mistral).
  enum class Activation { silu, gelu_tanh };  // SwiGLU or GeGLU feed-forward
  Activation activation = Activation::silu;
  bool scale_embeddings = false;  // embeddings times float(sqrt(hidden_size))
  bool sandwich_norms = false;    // attention and FFN outputs normed before the residual add
  bool qk_norm = false;           // RMSNorm of every query and key head before RoPE
  float query_pre_attn_scalar = 0.0f;  // attention scale scalar^-0.5; 0: head_dim
  // Per layer: true = local (sliding_window, rope_theta_local), false = global (full attention,
  // rope_theta). Empty: every layer uses sliding_window and rope_theta (Mistral).
  std::vector<bool> sliding_layers;
  float rope_theta_local = 0.0f;     // RoPE base of sliding layers; 0: rope_theta
  float final_logit_softcap = 0.0f;  // logits = cap * tanh(logits / cap); 0: none

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }

  bool is_sliding(int layer) const {
    return sliding_layers.empty() ? sliding_window > 0 : bool(sliding_layers[std::size_t(layer)]);
  }
  // The window of a layer's attention, 0 for full attention.
  int window_of(int layer) const { return is_sliding(layer) ? sliding_window : 0; }
  float rope_theta_of(int layer) const {
    return !sliding_layers.empty() && is_sliding(layer) && rope_theta_local > 0.0f ? rope_theta_local
                                                                                  : rope_theta;
  }
  // Scores are q.k times this. Llama's 1/sqrt(head_dim) keeps its fp32 form bit for bit; the
  // Gemma scale is rounded from double once, as Hugging Face's Python float is.
  float attention_scale() const {
    return query_pre_attn_scalar > 0.0f
               ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(query_pre_attn_scalar)))
               : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // Embeddings are multiplied by this (Gemma: sqrt(hidden_size) rounded to fp32, as HF casts it
  // to the weights' dtype).
  float embedding_scale() const {
    return scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(hidden_size))) : 1.0f;
  }

  // Parameter count (for reports and byte accounting).
  std::int64_t num_parameters() const {
    const std::int64_t d = hidden_size, ff = intermediate_size;
    const std::int64_t norms = (sandwich_norms ? 4 : 2) * d + (qk_norm ? 2 * head_dim : 0);
    const std::int64_t per_layer = norms + d * q_dim() * 2 + std::int64_t(2) * kv_dim() * d + 3 * d * ff;
    return std::int64_t(vocab_size) * d * (tie_embeddings ? 1 : 2) + d + num_layers * per_layer;
  }

  void validate() const {
    auto positive = [](int v, const char* name) {
      DC_CHECK(v > 0, "model config: ", name, " must be positive, got ", v);
    };
    positive(vocab_size, "vocab_size");
    positive(hidden_size, "hidden_size");
    positive(intermediate_size, "intermediate_size");
    positive(num_layers, "num_hidden_layers");
    positive(num_heads, "num_attention_heads");
    positive(num_kv_heads, "num_key_value_heads");
    positive(head_dim, "head_dim");
    positive(max_position, "max_position_embeddings");
    DC_CHECK(num_heads % num_kv_heads == 0, "model config: num_attention_heads (", num_heads,
             ") must be a multiple of num_key_value_heads (", num_kv_heads, ")");
    DC_CHECK(head_dim % 2 == 0, "model config: head_dim must be even for RoPE, got ", head_dim);
    DC_CHECK(rms_eps > 0.0f && rms_eps < 1.0f, "model config: rms_norm_eps out of range: ", rms_eps);
    DC_CHECK(rope_theta > 1.0f, "model config: rope_theta must be > 1, got ", rope_theta);
    DC_CHECK(sliding_window >= 0, "model config: sliding_window must be >= 0, got ", sliding_window);
    DC_CHECK(sliding_layers.empty() || int(sliding_layers.size()) == num_layers, "model config: ",
             sliding_layers.size(), " layer types for ", num_layers, " layers");
    DC_CHECK(query_pre_attn_scalar >= 0.0f, "model config: query_pre_attn_scalar must be >= 0, got ",
             query_pre_attn_scalar);
    DC_CHECK(rope_theta_local == 0.0f || rope_theta_local > 1.0f,
             "model config: the local RoPE base must be > 1, got ", rope_theta_local);
    DC_CHECK(final_logit_softcap >= 0.0f, "model config: final_logit_softcapping must be >= 0, got ",
             final_logit_softcap);
    // Guards against absurd files: every matrix and activation index must fit in int32, so
    // q_dim()/kv_dim() and the kernels' index arithmetic cannot overflow.
    constexpr std::int64_t kLimit = std::int64_t(1) << 31;
    const std::int64_t q = std::int64_t(num_heads) * head_dim, kv = std::int64_t(num_kv_heads) * head_dim;
    DC_CHECK(std::int64_t(vocab_size) * hidden_size < kLimit &&
                 std::int64_t(intermediate_size) * hidden_size < kLimit,
             "model config: dimensions too large (vocab_size*hidden_size or "
             "intermediate_size*hidden_size exceeds 2^31)");
    DC_CHECK(q * hidden_size < kLimit && kv * hidden_size < kLimit,
             "model config: dimensions too large (num_attention_heads*head_dim (", q,
             ") or num_key_value_heads*head_dim (", kv, ") times hidden_size exceeds 2^31)");
  }

  // Mistral-7B v0.1: 4096-token sliding window, 32k vocab, theta 1e4.
  static ModelConfig mistral_7b_v0_1() {
    ModelConfig c;
    c.architecture = "mistral";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position = 32768;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.sliding_window = 4096;
    c.tie_embeddings = false;
    return c;
  }

  // Mistral-7B v0.3: vocab extended to 32768, theta 1e6, no sliding window.
  static ModelConfig mistral_7b_v0_3() {
    ModelConfig c = mistral_7b_v0_1();
    c.vocab_size = 32768;
    c.rope_theta = 1000000.0f;
    c.sliding_window = 0;
    return c;
  }
};

}  // namespace dc
