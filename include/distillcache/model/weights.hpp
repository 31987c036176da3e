#pragma once
// Weights of a Llama/Mistral/Gemma 3 decoder on one backend, with storage type W for the
// matrices.
//
// Matrices are stored [out_features, in_features] row-major, exactly as Hugging Face stores
// nn.Linear weights, so y = x W^T reads both operands contiguously. Norm weights stay fp32 on
// every backend: they are tiny and bf16 would cost accuracy for no bandwidth gain.
// Q and K projections follow the rotate-half RoPE convention (loaders convert GGUF's).
// Norm weights are the multipliers the kernels apply: for Gemma that is 1 + w of its checkpoint
// (math/rmsnorm.hpp; the loaders say where the offset is added).
#include <string>
#include <type_traits>
#include <vector>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/tensor.hpp"
#include "../cpu/quant_matmul.hpp"
#include "config.hpp"

namespace dc {

// Weight storage tag: the matrices in ggml's block formats (QuantizedMatrix, CPU only), each in
// its own format (a GGUF file's Q4_1 layers beside its Q8_0 embedding). Norms stay fp32.
struct quantized {};

// How a matrix of storage W is held on backend B: a Tensor<W, B>, or a QuantizedMatrix.
template <class W, Backend B>
struct weight_matrix {
  using type = Tensor<W, B>;
};
template <>
struct weight_matrix<quantized, cpu> {
  using type = QuantizedMatrix;
};
template <class W, Backend B>
using WeightMatrix = typename weight_matrix<W, B>::type;

// What a matmul or embedding takes: the pointer of a Tensor, the QuantizedMatrix itself.
template <class T, Backend B>
const T* weight_operand(const Tensor<T, B>& t) {
  return t.data();
}
inline const QuantizedMatrix& weight_operand(const QuantizedMatrix& m) { return m; }

template <Backend B, class W = float>
struct LayerWeights {
  Tensor<float, B> attn_norm;  // [d]
  WeightMatrix<W, B> wq;             // [heads*head_dim, d]
  WeightMatrix<W, B> wk;             // [kv_heads*head_dim, d]
  WeightMatrix<W, B> wv;             // [kv_heads*head_dim, d]
  WeightMatrix<W, B> wo;             // [d, heads*head_dim]
  Tensor<float, B> ffn_norm;   // [d]
  WeightMatrix<W, B> w_gate;         // [ff, d]
  // Gemma 3 only (empty otherwise): per-head q/k norms and the norms of the attention and
  // feed-forward outputs (config.qk_norm, config.sandwich_norms).
  Tensor<float, B> q_norm;         // [head_dim]
  Tensor<float, B> k_norm;         // [head_dim]
  Tensor<float, B> attn_out_norm;  // [d]
  Tensor<float, B> ffn_out_norm;   // [d]
  WeightMatrix<W, B> w_up;           // [ff, d]
  WeightMatrix<W, B> w_down;         // [d, ff]
};

template <Backend B, class W = float>
struct Weights {
  WeightMatrix<W, B> embed;  // [vocab, d]
  std::vector<LayerWeights<B, W>> layers;
  Tensor<float, B> final_norm;  // [d]
  WeightMatrix<W, B> lm_head;         // [vocab, d]; empty when embeddings are tied

  const WeightMatrix<W, B>& output_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

// Host fp32 weights: what every loader produces and every backend uploads from.
using HostWeights = Weights<cpu, float>;

// The expected shape of every tensor, under its Hugging Face name. Loaders walk this list, so a
// missing or misshapen tensor is reported by the name the user sees in their checkpoint.
// fn(const std::string& hf_name, Tensor<T, cpu>& slot, Shape expected) for T = float.
// Gemma names its norms differently: its post_attention_layernorm norms the attention output,
// and pre_feedforward_layernorm is what Llama calls post_attention_layernorm. Every norm's name
// contains "norm" and no matrix's does (the HF loader relies on that to add Gemma's offset).
template <class Fn>
void for_each_weight(const ModelConfig& c, HostWeights& w, Fn&& fn) {
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  fn(std::string("model.embed_tokens.weight"), w.embed, Shape{c.vocab_size, d});
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    fn(p + "input_layernorm.weight", L.attn_norm, Shape{d});
    fn(p + "self_attn.q_proj.weight", L.wq, Shape{c.q_dim(), d});
    fn(p + "self_attn.k_proj.weight", L.wk, Shape{c.kv_dim(), d});
    fn(p + "self_attn.v_proj.weight", L.wv, Shape{c.kv_dim(), d});
    fn(p + "self_attn.o_proj.weight", L.wo, Shape{d, c.q_dim()});
    if (c.qk_norm) {
      fn(p + "self_attn.q_norm.weight", L.q_norm, Shape{c.head_dim});
      fn(p + "self_attn.k_norm.weight", L.k_norm, Shape{c.head_dim});
    }
    if (c.sandwich_norms) {
      fn(p + "post_attention_layernorm.weight", L.attn_out_norm, Shape{d});
      fn(p + "pre_feedforward_layernorm.weight", L.ffn_norm, Shape{d});
      fn(p + "post_feedforward_layernorm.weight", L.ffn_out_norm, Shape{d});
    } else {
      fn(p + "post_attention_layernorm.weight", L.ffn_norm, Shape{d});
    }
    fn(p + "mlp.gate_proj.weight", L.w_gate, Shape{ff, d});
    fn(p + "mlp.up_proj.weight", L.w_up, Shape{ff, d});
    fn(p + "mlp.down_proj.weight", L.w_down, Shape{d, ff});
  }
  fn(std::string("model.norm.weight"), w.final_norm, Shape{d});
  if (!c.tie_embeddings) fn(std::string("lm_head.weight"), w.lm_head, Shape{c.vocab_size, d});
}

// Builds Weights<B, W> from host weights, tensor by tensor: matrix(t) makes each matrix (embed,
// projections, lm_head; an empty lm_head stays empty), norm(t) each fp32 norm vector. The CPU
// conversion below and the CUDA upload (model/weights.cuh) are both this walk.
template <Backend B, class W, class Matrix, class Norm>
Weights<B, W> transform_weights(const HostWeights& host, Matrix&& matrix, Norm&& norm) {
  // Norms a model does not have (Gemma's extra ones, under Llama) stay empty.
  auto optional_norm = [&](const Tensor<float, cpu>& t) { return t.empty() ? Tensor<float, B>() : norm(t); };
  Weights<B, W> out;
  out.embed = matrix(host.embed);
  out.layers.reserve(host.layers.size());
  for (const auto& L : host.layers) {
    LayerWeights<B, W> d;
    d.attn_norm = norm(L.attn_norm);
    d.wq = matrix(L.wq);
    d.wk = matrix(L.wk);
    d.wv = matrix(L.wv);
    d.wo = matrix(L.wo);
    d.ffn_norm = norm(L.ffn_norm);
    d.w_gate = matrix(L.w_gate);
    d.w_up = matrix(L.w_up);
    d.w_down = matrix(L.w_down);
    d.q_norm = optional_norm(L.q_norm);
    d.k_norm = optional_norm(L.k_norm);
    d.attn_out_norm = optional_norm(L.attn_out_norm);
    d.ffn_out_norm = optional_norm(L.ffn_out_norm);
    out.layers.push_back(std::move(d));
  }
  out.final_norm = norm(host.final_norm);
  out.lm_head = host.lm_head.empty() ? WeightMatrix<W, B>() : matrix(host.lm_head);
  return out;
}

namespace detail {
// t with every element passed through convert (a new tensor of convert's result type).
template <class Convert>
auto convert_tensor(const Tensor<float, cpu>& t, Convert convert) {
  using T = decltype(convert(0.0f));
  Tensor<T, cpu> out(t.shape());
  const std::size_t count = static_cast<std::size_t>(t.numel());
  DC_OMP(parallel for schedule(static))
  for (std::size_t i = 0; i < count; ++i) out.data()[i] = convert(t.data()[i]);
  return out;
}
inline Tensor<float, cpu> copy_norm(const Tensor<float, cpu>& t) {
  return convert_tensor(t, [](float f) { return f; });
}
}  // namespace detail

// Host weights with the matrices stored as W: bf16 (rounded to nearest even) halves the bytes
// a CPU decode step streams; float is a plain copy. Norms stay fp32.
template <class W>
Weights<cpu, W> convert_host_weights(const HostWeights& host) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, bf16>,
                "CPU weights are stored as float or bf16 (quantized: quantize_host_weights)");
  return transform_weights<cpu, W>(
      host,
      [](const Tensor<float, cpu>& t) { return detail::convert_tensor(t, [](float f) { return from_float<W>(f); }); },
      detail::copy_norm);
}

// Host weights with every matrix quantized to one block format by ggml's reference rules (a
// GGUF file's own blocks are kept by load_gguf_quantized_weights in io/gguf_model.hpp instead).
inline Weights<cpu, quantized> quantize_host_weights(const HostWeights& host, QuantFormat format) {
  return transform_weights<cpu, quantized>(
      host, [&](const Tensor<float, cpu>& t) { return QuantizedMatrix::quantize(format, t); }, detail::copy_norm);
}

// The same from weights the caller gives up: float keeps the loader's tensors (no copy); bf16
// frees the fp32 originals once converted, so only the bf16 copy stays resident.
template <class W>
Weights<cpu, W> convert_host_weights(HostWeights&& host) {
  if constexpr (std::is_same_v<W, float>) {
    return std::move(host);
  } else {
    const HostWeights taken = std::move(host);
    return convert_host_weights<W>(taken);
  }
}

// Allocates zeroed host weights of the right shapes (for tests and random-weight benchmarks).
inline HostWeights allocate_host_weights(const ModelConfig& c) {
  c.validate();
  HostWeights w;
  for_each_weight(c, w, [](const std::string&, Tensor<float, cpu>& t, Shape s) {
    t = Tensor<float, cpu>(s);
    t.buffer().fill_zero();
  });
  return w;
}

}  // namespace dc
