#pragma once
// Llama/Mistral/Gemma 3 models from GGUF files (as written by llama.cpp's convert_hf_to_gguf.py,
// which stores Mistral under the "llama" architecture): metadata -> dc::ModelConfig, tensors ->
// fp32 host weights.
//
// RoPE convention: llama.cpp rotates adjacent pairs (2i, 2i+1), so its converter permutes the
// rows of every Q and K head of a Hugging Face checkpoint (LlamaModel.permute). Our forward pass
// rotates halves (i, i + head_dim/2), like Hugging Face, so the loader undoes that permutation:
// within each head, output row r takes stored row math::rope_unpermute_source(r, head_dim).
// tests/cpu/test_gguf.cpp proves the direction end to end against Hugging Face logits.
// Gemma 3 is the exception: llama.cpp runs it with rotate-half ("NEOX") RoPE, so its converter
// leaves Q and K as they are, and so does this loader.
//
// Gemma norms: the converter writes every "*norm.weight" of a Gemma checkpoint as 1 + w (the
// multiplier; llama.cpp then applies a plain RMSNorm). That is what our weights hold
// (model/weights.hpp), so this path takes the stored values as they are, whereas the safetensors
// path (io/hf_checkpoint.hpp) adds the 1 itself. Hugging Face's GGUF reader subtracts the 1
// again for its (1 + w) norms; tests/cpu/test_gemma_real.cpp checks the result against it.
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "../math/rope.hpp"
#include "../model/config.hpp"
#include "../model/weights.hpp"
#include "gguf.hpp"
#include "hf_checkpoint.hpp"

namespace dc {

namespace detail {

inline int gguf_int(const GgufFile& f, const std::string& key, int min_value) {
  const std::int64_t v = f.get_int(key);
  DC_CHECK(v >= min_value && v <= INT_MAX, f.where(), "metadata key '", key, "' = ", v,
           " is out of range [", min_value, ", ", INT_MAX, "]");
  return static_cast<int>(v);
}

inline float gguf_float32(const GgufFile& f, const std::string& key) {
  const double v = f.get_float(key);
  DC_CHECK(std::isfinite(v) && std::fabs(v) <= double(std::numeric_limits<float>::max()), f.where(),
           "metadata key '", key, "' = ", v, " is out of float range");
  return static_cast<float>(v);
}

// The llama.cpp name of a weight that for_each_weight names the Hugging Face way. With sandwich
// norms (Gemma) HF's post_attention_layernorm norms the attention output, and its pre-FFN norm is
// pre_feedforward_layernorm; llama.cpp's ffn_norm is the pre-FFN norm in both.
inline std::string gguf_tensor_name(const std::string& hf, bool sandwich_norms = false) {
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    const std::size_t dot = hf.find('.', prefix.size());
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const std::string rest = hf.substr(dot + 1);
    if (rest == "post_attention_layernorm.weight")
      return "blk." + layer + (sandwich_norms ? ".post_attention_norm.weight" : ".ffn_norm.weight");
    for (const auto& [from, to] : kLayer)
      if (rest == from) return "blk." + layer + "." + to;
  }
  DC_FAIL("no GGUF name for weight '", hf, "'");
}

// Undoes llama.cpp's per-head Q/K row permutation in place: `rows` rows of row_bytes bytes each
// (fp32 values or quantized blocks alike: whole rows move).
inline void gguf_unpermute_rope_rows(std::uint8_t* data, std::int64_t rows, std::size_t row_bytes, int heads,
                                     int head_dim) {
  DC_CHECK(rows == std::int64_t(heads) * head_dim, "unpermute: ", rows, " rows, expected ", heads, " x ",
           head_dim);
  std::vector<std::uint8_t> head(std::size_t(head_dim) * row_bytes);
  for (int h = 0; h < heads; ++h) {
    std::uint8_t* base = data + std::size_t(h) * std::size_t(head_dim) * row_bytes;
    std::memcpy(head.data(), base, head.size());
    for (int r = 0; r < head_dim; ++r)
      std::memcpy(base + std::size_t(r) * row_bytes,
                  head.data() + std::size_t(math::rope_unpermute_source(r, head_dim)) * row_bytes, row_bytes);
  }
}

inline void gguf_unpermute_rope_rows(Tensor<float, cpu>& w, int heads, int head_dim) {
  gguf_unpermute_rope_rows(reinterpret_cast<std::uint8_t*>(w.data()), w.dim(0),
                           std::size_t(w.dim(1)) * sizeof(float), heads, head_dim);
}

// Gemma 3's switches. llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3) fixes what older GGUFs
// do not store, and so do we: every 6th layer global, local RoPE base 1e4, attention scale
// 1/sqrt(head_dim) except for the 62-layer 27B model (1/sqrt(hidden / heads)); the keys a newer
// converter writes take precedence.
inline void gguf_gemma3_switches(const GgufFile& f, const std::string& p, ModelConfig& c) {
  c.activation = ModelConfig::Activation::gelu_tanh;
  c.scale_embeddings = c.sandwich_norms = c.qk_norm = true;
  const int pattern = f.has(p + "attention.sliding_window_pattern")
                          ? gguf_int(f, p + "attention.sliding_window_pattern", 1)
                          : 6;
  // The per-layer list is sized by block_count: bound it by what the file can back first, as
  // load_gguf_model does for the weights (fuzz/README.md).
  DC_CHECK(std::uint64_t(c.num_layers) <= f.tensors().size(), f.where(), "metadata key '", p,
           "block_count' = ", c.num_layers, " but the file has only ", f.tensors().size(), " tensors");
  c.sliding_layers.clear();
  for (int l = 0; l < c.num_layers; ++l) c.sliding_layers.push_back((l + 1) % pattern != 0);
  c.rope_theta_local = f.has(p + "rope.freq_base_swa") ? gguf_float32(f, p + "rope.freq_base_swa") : 10000.0f;
  c.query_pre_attn_scalar = c.num_layers == 62 ? float(c.hidden_size / c.num_heads) : float(c.head_dim);
  if (f.has(p + "final_logit_softcapping"))
    c.final_logit_softcap = gguf_float32(f, p + "final_logit_softcapping");
  if (f.has(p + "attn_logit_softcapping"))
    DC_CHECK(gguf_float32(f, p + "attn_logit_softcapping") == 0.0f, f.where(), "metadata key '", p,
             "attn_logit_softcapping' is set: attention soft-capping is not implemented");
}

}  // namespace detail

inline ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  DC_CHECK(arch == "llama" || arch == "mistral" || arch == "gemma3", f.where(), "architecture '", arch,
           "' is not supported (only 'llama', 'mistral' and 'gemma3')");
  const std::string p = arch + ".";
  using detail::gguf_int;

  // Features the decoder does not implement are rejected rather than silently ignored.
  if (f.has(p + "expert_count"))
    DC_CHECK(f.get_int(p + "expert_count") == 0, f.where(), "metadata key '", p,
             "expert_count' = ", f.get_int(p + "expert_count"),
             ": mixture-of-experts models are not supported");
  if (f.has(p + "rope.scaling.type")) {
    const std::string type = f.get_string(p + "rope.scaling.type");
    DC_CHECK(type == "none", f.where(), "metadata key '", p, "rope.scaling.type' = '", type,
             "': RoPE scaling is not implemented");
  }

  ModelConfig c;
  c.architecture = arch;
  c.num_layers = gguf_int(f, p + "block_count", 1);
  c.hidden_size = gguf_int(f, p + "embedding_length", 1);
  c.intermediate_size = gguf_int(f, p + "feed_forward_length", 1);
  c.num_heads = gguf_int(f, p + "attention.head_count", 1);
  c.num_kv_heads = f.has(p + "attention.head_count_kv") ? gguf_int(f, p + "attention.head_count_kv", 1)
                                                         : c.num_heads;
  c.max_position = gguf_int(f, p + "context_length", 1);
  c.rms_eps = detail::gguf_float32(f, p + "attention.layer_norm_rms_epsilon");
  c.rope_theta = f.has(p + "rope.freq_base") ? detail::gguf_float32(f, p + "rope.freq_base") : 10000.0f;
  c.sliding_window = f.has(p + "attention.sliding_window")
                         ? gguf_int(f, p + "attention.sliding_window", 0)
                         : 0;

  // head_dim: attention.key_length when given, else embedding_length / head_count.
  if (f.has(p + "attention.key_length")) {
    c.head_dim = gguf_int(f, p + "attention.key_length", 1);
    if (f.has(p + "attention.value_length"))
      DC_CHECK(gguf_int(f, p + "attention.value_length", 1) == c.head_dim, f.where(),
               "metadata keys '", p, "attention.key_length' and '", p,
               "attention.value_length' differ; only equal key and value head sizes are supported");
  } else {
    DC_CHECK(c.hidden_size % c.num_heads == 0, f.where(), "metadata key '", p,
             "embedding_length' (", c.hidden_size, ") is not a multiple of '", p,
             "attention.head_count' (", c.num_heads, ")");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (f.has(p + "rope.dimension_count")) {
    const int rope_dims = gguf_int(f, p + "rope.dimension_count", 1);
    DC_CHECK(rope_dims == c.head_dim, f.where(), "metadata key '", p, "rope.dimension_count' = ",
             rope_dims, " differs from head_dim ", c.head_dim,
             "; partial rotary embeddings are not supported");
  }

  // Vocabulary: explicit key, else the tokenizer's token list, else token_embd's rows.
  if (f.has(p + "vocab_size")) {
    c.vocab_size = gguf_int(f, p + "vocab_size", 1);
  } else if (f.has("tokenizer.ggml.tokens")) {
    const GgufValue& tokens = f.get("tokenizer.ggml.tokens");
    DC_CHECK(tokens.is_array(), f.where(), "metadata key 'tokenizer.ggml.tokens' is ",
             tokens.type_description(), ", not an array");
    DC_CHECK(tokens.size() <= std::size_t(INT_MAX), f.where(), "tokenizer.ggml.tokens too long");
    c.vocab_size = static_cast<int>(tokens.size());
  } else {
    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    DC_CHECK(embd != nullptr, f.where(), "no '", p,
             "vocab_size', no tokenizer.ggml.tokens and no token_embd.weight: vocabulary size unknown");
    DC_CHECK(embd->ne.size() == 2 && embd->ne[1] <= INT_MAX, f.where("token_embd.weight"),
             "expected a matrix, got ne of rank ", embd->ne.size());
    c.vocab_size = static_cast<int>(embd->ne[1]);
  }
  c.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  if (arch == "gemma3") detail::gguf_gemma3_switches(f, p, c);

  try {
    c.validate();
  } catch (const Error& e) {
    DC_FAIL(f.where(), e.message());
  }
  return c;
}

namespace detail {

// Checks every GGUF load makes before it reads a weight.
inline void check_gguf_model_tensors(const GgufFile& f, const ModelConfig& c) {
  // Tensors that change the maths and that we would otherwise silently drop.
  for (const auto& t : f.tensors()) {
    DC_CHECK(t.name != "rope_freqs.weight", f.where(t.name),
             "RoPE frequency factors (Llama 3.1 scaling) are not supported");
    DC_CHECK(t.name.size() < 5 || t.name.compare(t.name.size() - 5, 5, ".bias") != 0,
             f.where(t.name), "biases are not supported");
  }
  // for_each_weight sizes the layer list before it asks for a layer's tensors, so a block_count
  // the file cannot back would allocate without bound (see fuzz/README.md).
  const std::size_t per_layer = tensors_per_layer(c);
  DC_CHECK(std::uint64_t(c.num_layers) <= f.tensors().size() / per_layer, f.where(),
           "metadata key '", c.architecture, ".block_count' = ", c.num_layers,
           " but the file has only ", f.tensors().size(), " tensors (", per_layer, " per layer)");
}

// The file's tensor for weight hf_name, checked for presence, shape and a type we can decode.
inline const GgufTensorInfo& gguf_weight_tensor(const GgufFile& f, const ModelConfig& c, const std::string& hf_name,
                                                Shape expected) {
  const std::string name = gguf_tensor_name(hf_name, c.sandwich_norms);
  const GgufTensorInfo* t = f.find_tensor(name);
  DC_CHECK(t != nullptr, f.where(), "tensor '", name, "' (", hf_name, ") missing");
  DC_CHECK(t->shape() == expected, f.where(name), "shape ", t->shape().str(), " (ne ", shape_str(t->ne),
           "), expected ", expected.str(), " for ", hf_name);
  DC_CHECK(ggml_can_dequantize(t->type), f.where(name), "type ", t->type_name(),
           " is not supported (supported: ", kGgmlDequantizableTypes, ")");
  return *t;
}

// How many heads' rows of this tensor llama.cpp permuted for RoPE (0: none; see the header).
inline int gguf_permuted_heads(const ModelConfig& c, const std::string& gguf_name) {
  if (c.architecture == "gemma3") return 0;
  auto ends_with = [&](std::string_view tail) {
    return gguf_name.size() > tail.size() && gguf_name.compare(gguf_name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("attn_q.weight")) return c.num_heads;
  if (ends_with("attn_k.weight")) return c.num_kv_heads;
  return 0;
}

// A NaN or inf weight (a corrupt file, a bad quantization scale) would poison every logit.
inline void check_gguf_weight_finite(const GgufFile& f, const GgufTensorInfo& t, std::span<const float> values) {
  check_all_finite(values, concat("gguf '", f.path().string(), "': tensor '", t.name, "'"));
}

}  // namespace detail

// Loads an opened GGUF file's config and weights (dequantized to fp32, Q/K in rotate-half order).
inline HfModel load_gguf_model(const GgufFile& f) {
  HfModel model;
  model.config = gguf_model_config(f);
  const ModelConfig& c = model.config;
  detail::check_gguf_model_tensors(f, c);
  for_each_weight(c, model.weights, [&](const std::string& hf_name, Tensor<float, cpu>& slot, Shape expected) {
    const GgufTensorInfo& t = detail::gguf_weight_tensor(f, c, hf_name, expected);
    slot = f.read_tensor(t);
    detail::check_gguf_weight_finite(f, t, std::span<const float>(slot.data(), std::size_t(slot.numel())));
    if (const int heads = detail::gguf_permuted_heads(c, t.name)) detail::gguf_unpermute_rope_rows(slot, heads, c.head_dim);
  });
  return model;
}

// The weights of an opened GGUF file with its matrices kept in the file's own blocks where they
// are Q8_0, Q4_0 or Q4_1 (bytes as stored, Q/K rows un-permuted whole); matrices the file stores
// otherwise (F32, F16, BF16, Q5_0, the k-quants) are decoded and re-quantized to Q8_0, the format
// that loses least. Norms are fp32. config must be gguf_model_config(f).
inline Weights<cpu, quantized> load_gguf_quantized_weights(const GgufFile& f, const ModelConfig& c) {
  detail::check_gguf_model_tensors(f, c);
  // for_each_weight names every slot of a skeleton; transform_weights then asks for each slot by
  // reference, which the address identifies.
  HostWeights skeleton;
  std::vector<std::pair<const Tensor<float, cpu>*, const GgufTensorInfo*>> source;
  for_each_weight(c, skeleton, [&](const std::string& hf_name, Tensor<float, cpu>& slot, Shape expected) {
    slot = Tensor<float, cpu>(Shape{1});  // non-empty: transform_weights skips empty optional slots
    source.emplace_back(&slot, &detail::gguf_weight_tensor(f, c, hf_name, expected));
  });
  auto info_of = [&](const Tensor<float, cpu>& slot) -> const GgufTensorInfo& {
    for (const auto& [s, t] : source)
      if (s == &slot) return *t;
    DC_FAIL("load_gguf_quantized_weights: a weight slot without a tensor");  // unreachable
  };
  auto matrix = [&](const Tensor<float, cpu>& slot) {
    const GgufTensorInfo& t = info_of(slot);
    const Tensor<float, cpu> values = f.read_tensor(t);
    detail::check_gguf_weight_finite(f, t, std::span<const float>(values.data(), std::size_t(values.numel())));
    QuantizedMatrix m;
    const auto type = t.ggml_type();
    if (type == GgmlType::q8_0 || type == GgmlType::q4_0 || type == GgmlType::q4_1) {
      const QuantFormat format = type == GgmlType::q8_0   ? QuantFormat::q8_0
                                 : type == GgmlType::q4_0 ? QuantFormat::q4_0
                                                          : QuantFormat::q4_1;
      m = QuantizedMatrix(format, values.dim(0), values.dim(1));
      const std::vector<std::uint8_t> raw = f.read_raw(t);
      DC_CHECK(raw.size() == m.bytes(), f.where(t.name), raw.size(), " bytes, expected ", m.bytes());
      std::memcpy(m.row(0), raw.data(), raw.size());
    } else {
      m = QuantizedMatrix::quantize(QuantFormat::q8_0, values);
    }
    if (const int heads = detail::gguf_permuted_heads(c, t.name))
      detail::gguf_unpermute_rope_rows(m.row(0), m.rows(), m.row_bytes(), heads, c.head_dim);
    return m;
  };
  auto norm = [&](const Tensor<float, cpu>& slot) {
    const GgufTensorInfo& t = info_of(slot);
    Tensor<float, cpu> values = f.read_tensor(t);
    detail::check_gguf_weight_finite(f, t, std::span<const float>(values.data(), std::size_t(values.numel())));
    return values;
  };
  return transform_weights<cpu, quantized>(skeleton, matrix, norm);
}

inline HfModel load_gguf_model(const std::filesystem::path& path) { return load_gguf_model(GgufFile(path)); }

}  // namespace dc
