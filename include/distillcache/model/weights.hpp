#pragma once
// Weights of a Llama/Mistral decoder on one backend, with storage type W for the matrices.
//
// Matrices are stored [out_features, in_features] row-major, exactly as Hugging Face stores
// nn.Linear weights, so y = x W^T reads both operands contiguously. Norm weights stay fp32 on
// every backend: they are tiny and bf16 would cost accuracy for no bandwidth gain.
// Q and K projections follow the rotate-half RoPE convention (loaders convert GGUF's).
#include <string>
#include <vector>

#include "../core/tensor.hpp"
#include "config.hpp"

namespace dc {

template <Backend B, class W = float>
struct LayerWeights {
  Tensor<float, B> attn_norm;  // [d]
  Tensor<W, B> wq;             // [heads*head_dim, d]
  Tensor<W, B> wk;             // [kv_heads*head_dim, d]
  Tensor<W, B> wv;             // [kv_heads*head_dim, d]
  Tensor<W, B> wo;             // [d, heads*head_dim]
  Tensor<float, B> ffn_norm;   // [d]
  Tensor<W, B> w_gate;         // [ff, d]
  Tensor<W, B> w_up;           // [ff, d]
  Tensor<W, B> w_down;         // [d, ff]
};

template <Backend B, class W = float>
struct Weights {
  Tensor<W, B> embed;  // [vocab, d]
  std::vector<LayerWeights<B, W>> layers;
  Tensor<float, B> final_norm;  // [d]
  Tensor<W, B> lm_head;         // [vocab, d]; empty when embeddings are tied

  const Tensor<W, B>& output_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

// Host fp32 weights: what every loader produces and every backend uploads from.
using HostWeights = Weights<cpu, float>;

// The expected shape of every tensor, under its Hugging Face name. Loaders walk this list, so a
// missing or misshapen tensor is reported by the name the user sees in their checkpoint.
// fn(const std::string& hf_name, Tensor<T, cpu>& slot, Shape expected) for T = float.
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
    fn(p + "post_attention_layernorm.weight", L.ffn_norm, Shape{d});
    fn(p + "mlp.gate_proj.weight", L.w_gate, Shape{ff, d});
    fn(p + "mlp.up_proj.weight", L.w_up, Shape{ff, d});
    fn(p + "mlp.down_proj.weight", L.w_down, Shape{d, ff});
  }
  fn(std::string("model.norm.weight"), w.final_norm, Shape{d});
  if (!c.tie_embeddings) fn(std::string("lm_head.weight"), w.lm_head, Shape{c.vocab_size, d});
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
