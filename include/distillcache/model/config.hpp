#pragma once
// ModelConfig: the shape of a Llama/Mistral decoder, presets for Mistral-7B, and validation.
//
// Generic configs come from a Hugging Face config.json (io/hf_config.hpp) or GGUF metadata.
#include <cstdint>
#include <string>

#include "../core/error.hpp"

namespace dc {

struct ModelConfig {
  std::string architecture = "llama";  // "llama" or "mistral": same math, different defaults
  int vocab_size = 0;
  int hidden_size = 0;        // d
  int intermediate_size = 0;  // SwiGLU width
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads (GQA when < num_heads)
  int head_dim = 0;      // usually hidden_size / num_heads, but may differ
  int max_position = 0;  // longest context the model was trained for
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int sliding_window = 0;  // 0: full causal attention
  bool tie_embeddings = false;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }

  // Parameter count (for reports and byte accounting).
  std::int64_t num_parameters() const {
    const std::int64_t d = hidden_size, ff = intermediate_size;
    const std::int64_t per_layer = 2 * d + d * q_dim() * 2 + std::int64_t(2) * kv_dim() * d + 3 * d * ff;
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
