#pragma once
// Transformer<B, W>: a Llama/Mistral/Gemma 3 decoder forward pass on backend B with weight
// storage W. Gemma 3 is the same body with ModelConfig's switches on (model/config.hpp): the
// extra norms, GeGLU, scales and per-layer windows are branches here, not a second forward pass.
//
// One code path serves chunked prefill and single-token decode: every call appends its tokens to
// the KV cache and attends over the whole cache, masked by positions (causal + sliding window).
// The body is written once; each op is an overload on Context<B> found by argument-dependent
// lookup, so including cuda/ops.cuh before instantiating Transformer<cuda, ...> is all the CUDA
// backend needs.
//
// Batched decoding (forward_batch): one step for S sequences, each with its own KV cache. The
// rows of one chunk may belong to different caches (segments); everything but attention, RoPE and
// the cache writes is row-wise, so it runs over all rows at once and the weights stream once per
// step for every sequence. Attention runs per segment over its own cache.
//
// RunState buffers, per chunk of C = max_chunk tokens (all on the backend):
//   x, xn    [C, d]      residual stream, its normalised copy
//   q, att   [C, heads*head_dim]
//   k, v     [C, kv_heads*head_dim]
//   gate, up [C, ff]
//   logits   [C, vocab]
//   tokens   [C] int32
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../cache/kv_cache.hpp"
#include "../core/copy.hpp"
#include "../core/finite.hpp"
#include "../core/matmul_output.hpp"
#include "../cpu/ops.hpp"
#include "../math/attention_shape.hpp"
#include "config.hpp"
#include "weights.hpp"

namespace dc {

enum class LogitsFor { last, all, none };

// What a KV cache needs to know of a model.
inline CacheShape cache_shape_of(const ModelConfig& c) {
  CacheShape s{c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_position, {}};
  bool windowed = false;
  for (int l = 0; l < c.num_layers; ++l) windowed = windowed || c.window_of(l) > 0;
  if (windowed)
    for (int l = 0; l < c.num_layers; ++l) s.layer_windows.push_back(c.window_of(l));
  return s;
}

template <Backend B, class W = float>
class Transformer {
 public:
  Transformer(ModelConfig config, Weights<B, W> weights, int max_chunk = 64)
      : cfg_(std::move(config)), w_(std::move(weights)), max_chunk_(max_chunk) {
    cfg_.validate();
    DC_CHECK(max_chunk > 0, "max_chunk must be positive, got ", max_chunk);
    DC_CHECK(static_cast<int>(w_.layers.size()) == cfg_.num_layers, "weights have ",
             w_.layers.size(), " layers, config says ", cfg_.num_layers);
    check_weights_device();
    const int c = max_chunk_;
    x_ = Tensor<float, B>(Shape{c, cfg_.hidden_size});
    xn_ = Tensor<float, B>(Shape{c, cfg_.hidden_size});
    q_ = Tensor<float, B>(Shape{c, cfg_.q_dim()});
    att_ = Tensor<float, B>(Shape{c, cfg_.q_dim()});
    k_ = Tensor<float, B>(Shape{c, cfg_.kv_dim()});
    v_ = Tensor<float, B>(Shape{c, cfg_.kv_dim()});
    gate_ = Tensor<float, B>(Shape{c, cfg_.intermediate_size});
    up_ = Tensor<float, B>(Shape{c, cfg_.intermediate_size});
    logits_ = Tensor<float, B>(Shape{c, cfg_.vocab_size});
    tokens_ = Tensor<std::int32_t, B>(Shape{c});
  }

  const ModelConfig& config() const { return cfg_; }
  const Weights<B, W>& weights() const { return w_; }
  Context<B>& context() { return ctx_; }
  int max_chunk() const { return max_chunk_; }

  // A cache for this model; kv_type f32 or bf16 is how it stores K and V. Without one, the
  // model's default (set_kv_type), so the decoder, the evaluator and the trainer, which make their
  // caches here, all follow one setting.
  KVCache<B> make_cache(int capacity) const { return make_cache(capacity, kv_type_); }
  KVCache<B> make_cache(int capacity, DType kv_type) const {
    return KVCache<B>(cache_shape_of(cfg_), capacity, kv_type);
  }
  // A cache whose layer l holds up to capacities[l] slots (e.g. budgets that differ by layer).
  KVCache<B> make_cache(std::span<const int> capacities) const { return make_cache(capacities, kv_type_); }
  KVCache<B> make_cache(std::span<const int> capacities, DType kv_type) const {
    return KVCache<B>(cache_shape_of(cfg_), capacities, kv_type);
  }
  void set_kv_type(DType kv_type) {
    KVCache<B>::check_kv_type(kv_type);  // refuses what a cache would refuse, now
    kv_type_ = kv_type;
  }
  DType kv_type() const { return kv_type_; }

  // Runs tokens through the model at the cache's next positions, appending their K/V.
  // Writes host logits into out: [tokens.size(), vocab] for LogitsFor::all, [vocab] for last.
  void forward(std::span<const std::int32_t> tokens, KVCache<B>& cache, std::span<float> out,
               LogitsFor which = LogitsFor::last) {
    const int n = check_forward(tokens, cache);
    const std::size_t need = which == LogitsFor::all    ? std::size_t(n) * cfg_.vocab_size
                             : which == LogitsFor::last ? std::size_t(cfg_.vocab_size)
                                                        : 0;
    DC_CHECK(out.size() >= need, "logits buffer holds ", out.size(), " floats, need ", need);

    for (int begin = 0; begin < n; begin += max_chunk_) {
      const int len = std::min(max_chunk_, n - begin);
      const bool last_chunk = begin + len == n;
      const LogitsFor chunk_logits = which == LogitsFor::all ? LogitsFor::all
                                     : (which == LogitsFor::last && last_chunk) ? LogitsFor::last
                                                                                : LogitsFor::none;
      float* dst = which == LogitsFor::all ? out.data() + std::size_t(begin) * cfg_.vocab_size
                                           : out.data();
      const Segment one{&cache, 0, len};
      forward_chunk(tokens.subspan(std::size_t(begin), std::size_t(len)), {&one, 1}, dst, chunk_logits);
    }
    check_finite_logits(out.first(need));
  }

  // One decode step for S = tokens.size() sequences: tokens[s] is appended to *caches[s] (each
  // cache its own length, keep-set, budget and statistics) and out receives every sequence's
  // next-token logits, [S, vocab]. The weights stream once per max_chunk sequences (a GEMM over
  // their rows); attention runs per sequence. On the CPU row s equals what
  // forward({tokens[s]}, *caches[s], ...) writes, bit for bit: the GEMM's order of additions per
  // output element does not depend on the row count, and every other op is row-wise.
  void forward_batch(std::span<const std::int32_t> tokens, std::span<KVCache<B>* const> caches,
                     std::span<float> out) {
    const std::size_t vocab = std::size_t(cfg_.vocab_size);
    DC_CHECK(!tokens.empty() && tokens.size() == caches.size(), "forward_batch: ", tokens.size(),
             " tokens for ", caches.size(), " caches (one token per sequence)");
    DC_CHECK(out.size() >= tokens.size() * vocab, "forward_batch: logits buffer holds ", out.size(),
             " floats, need ", tokens.size() * vocab);
    for (std::size_t begin = 0; begin < tokens.size(); begin += std::size_t(max_chunk_)) {
      const std::size_t len = std::min(tokens.size() - begin, std::size_t(max_chunk_));
      forward_batch_chunk(tokens.subspan(begin, len), caches.subspan(begin, len));
      copy_to_host(ctx_, out.data() + begin * vocab, logits_.data(), len * vocab);
    }
    check_finite_logits(out.first(tokens.size() * vocab));
  }

  // forward_batch for at most max_chunk sequences, the logits left on the backend: returns
  // them, [S, vocab], valid until the next forward (the batched form of
  // forward_logits_on_backend).
  const float* forward_batch_logits_on_backend(std::span<const std::int32_t> tokens,
                                               std::span<KVCache<B>* const> caches) {
    DC_CHECK(tokens.size() <= std::size_t(max_chunk_), "forward_batch_logits_on_backend: ",
             tokens.size(), " sequences exceed max_chunk ", max_chunk_);
    forward_batch_chunk(tokens, caches);
    return logits_.data();
  }

  // Like forward(tokens, cache, out, LogitsFor::last), but the last token's logits stay on the
  // backend (device memory under CUDA): returns them, [vocab], valid until the next forward. The
  // fused KL (kl_rows) reads them there, so a GPU trainer never copies a vocabulary row per step
  // and student to the host. Not checked for non-finite values (that needs the host copy).
  const float* forward_logits_on_backend(std::span<const std::int32_t> tokens, KVCache<B>& cache) {
    const int n = check_forward(tokens, cache);
    for (int begin = 0; begin < n; begin += max_chunk_) {
      const int len = std::min(max_chunk_, n - begin);
      const Segment one{&cache, 0, len};
      forward_chunk(tokens.subspan(std::size_t(begin), std::size_t(len)), {&one, 1}, nullptr,
                    begin + len == n ? LogitsFor::last : LogitsFor::none);
    }
    return logits_.data();
  }

  // Convenience: returns the host logits as a vector.
  std::vector<float> forward(std::span<const std::int32_t> tokens, KVCache<B>& cache,
                             LogitsFor which = LogitsFor::last) {
    const std::size_t rows = which == LogitsFor::all ? tokens.size() : which == LogitsFor::last;
    std::vector<float> out(rows * std::size_t(cfg_.vocab_size));
    forward(tokens, cache, std::span<float>(out), which);
    return out;
  }

 private:
  // Rows [row, row + rows) of a chunk belong to *cache.
  struct Segment {
    KVCache<B>* cache;
    int row, rows;
  };
  // Per segment of a chunk: which of its queries feed the eviction statistics (positions >=
  // observed_from()) and its attention shape (window and capacity set per layer: the capacity
  // differs per cache, and per layer in a cache made with layer capacities).
  struct SegmentRows {
    int first_observed;
    bool observed;
    AttentionShape shape;
  };

  void forward_batch_chunk(std::span<const std::int32_t> tokens, std::span<KVCache<B>* const> caches) {
    DC_CHECK(!tokens.empty() && tokens.size() == caches.size(), "forward_batch: ", tokens.size(),
             " tokens for ", caches.size(), " caches (one token per sequence)");
    segments_.clear();
    for (std::size_t s = 0; s < caches.size(); ++s) {
      DC_CHECK(caches[s] != nullptr, "forward_batch: cache ", s, " is null");
      for (std::size_t r = 0; r < s; ++r)
        DC_CHECK(caches[r] != caches[s], "forward_batch: sequences ", r, " and ", s,
                 " share one KV cache");
      check_forward(tokens.subspan(s, 1), *caches[s]);
      segments_.push_back({caches[s], int(s), 1});
    }
    forward_chunk(tokens, segments_, nullptr, LogitsFor::last);
  }

  // NaN or inf here means the weights or the activations are broken; say so at the source
  // rather than letting sampling or eviction act on garbage.
  void check_finite_logits(std::span<const float> out) const {
    const std::size_t vocab = std::size_t(cfg_.vocab_size);
    for (std::size_t row = 0; row * vocab < out.size(); ++row) {
      const auto logits = out.subspan(row * vocab, vocab);
      if (!std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }))
        check_all_finite(logits, detail::concat("forward: the model produced non-finite logits "
                                                "(broken weights or overflow), row ", row));
    }
  }

  // The checks every forward makes; returns the token count.
  int check_forward(std::span<const std::int32_t> tokens, const KVCache<B>& cache) const {
    const int n = static_cast<int>(tokens.size());
    DC_CHECK(n > 0, "forward called with no tokens");
    check_cache(cache);
    cache.check_room(n);
    DC_CHECK(std::int64_t(cache.next_position()) + n <= cfg_.max_position, "context of ",
             cache.next_position() + n, " tokens exceeds the model's max_position ",
             cfg_.max_position);
    for (int t = 0; t < n; ++t)
      DC_CHECK(tokens[std::size_t(t)] >= 0 && tokens[std::size_t(t)] < cfg_.vocab_size,
               "token id ", tokens[std::size_t(t)], " at index ", t, " outside vocabulary [0, ",
               cfg_.vocab_size, ")");
    return n;
  }

  void check_cache(const KVCache<B>& cache) const {
    DC_CHECK(cache.num_layers() == cfg_.num_layers && cache.num_kv_heads() == cfg_.num_kv_heads &&
                 cache.head_dim() == cfg_.head_dim,
             "KV cache shape (", cache.num_layers(), " layers, ", cache.num_kv_heads(),
             " kv heads, head_dim ", cache.head_dim(), ") does not match the model");
    check_same_device(ctx_.device(), cache.device(), "the KV cache");
  }

  void check_weights_device() const {
    auto check = [&](const auto& tensor, const char* name, int layer) {
      if (!tensor.empty())
        check_same_device(ctx_.device(), tensor.device(),
                          detail::concat("weight ", name, layer >= 0 ? " of layer " : "",
                                         layer >= 0 ? std::to_string(layer) : std::string()));
    };
    check(w_.embed, "embed", -1);
    check(w_.final_norm, "final_norm", -1);
    check(w_.lm_head, "lm_head", -1);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const auto& L = w_.layers[std::size_t(l)];
      check(L.attn_norm, "attn_norm", l);
      check(L.wq, "wq", l);
      check(L.wk, "wk", l);
      check(L.wv, "wv", l);
      check(L.wo, "wo", l);
      check(L.ffn_norm, "ffn_norm", l);
      check(L.w_gate, "w_gate", l);
      check(L.w_up, "w_up", l);
      check(L.w_down, "w_down", l);
      check(L.q_norm, "q_norm", l);
      check(L.k_norm, "k_norm", l);
      check(L.attn_out_norm, "attn_out_norm", l);
      check(L.ffn_out_norm, "ffn_out_norm", l);
      // Gemma's extra norms are read through raw pointers: their absence must fail here.
      DC_CHECK(!cfg_.qk_norm || (!L.q_norm.empty() && !L.k_norm.empty()), "layer ", l,
               ": the config has q/k norms (Gemma) but the weights have no q_norm/k_norm");
      DC_CHECK(!cfg_.sandwich_norms || (!L.attn_out_norm.empty() && !L.ffn_out_norm.empty()), "layer ",
               l, ": the config has output norms (Gemma) but the weights have no attn_out_norm/ffn_out_norm");
    }
  }

  // Runs one chunk of rows: the segments tile [0, tokens.size()) in order, each appending its
  // rows to its own cache. LogitsFor::last gives the last row of every segment, [segments, vocab].
  void forward_chunk(std::span<const std::int32_t> tokens, std::span<const Segment> segments,
                     float* out, LogitsFor which) {
    const int n = static_cast<int>(tokens.size());
    const int d = cfg_.hidden_size, ff = cfg_.intermediate_size, qd = cfg_.q_dim(),
              kvd = cfg_.kv_dim();
    copy_to_backend(ctx_, tokens_.data(), tokens.data(), tokens.size());
    rows_.clear();
    for (const Segment& seg : segments) {
      KVCache<B>& cache = *seg.cache;
      const int chunk_position = cache.next_position();
      cache.append(ctx_, seg.rows);
      rows_.push_back({std::clamp(cache.observed_from() - chunk_position, 0, seg.rows),
                       cache.observing(chunk_position + seg.rows - 1),
                       AttentionShape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim,
                                      cfg_.sliding_window, cfg_.attention_scale(), 0}});
    }

    float *x = x_.data(), *xn = xn_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data(),
          *att = att_.data(), *gate = gate_.data(), *up = up_.data();
    const std::int64_t nd = std::int64_t(n) * d;
    embedding(ctx_, x, tokens_.data(), n, weight_operand(w_.embed), d);
    if (cfg_.scale_embeddings) scale_values(ctx_, x, cfg_.embedding_scale(), nd);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights<B, W>& L = w_.layers[std::size_t(l)];
      // Attention block: x += Wo * attention(rope(Wq xn), rope(Wk xn), Wv xn) (Gemma: q and k
      // normed per head first, the block's output normed before the add).
      rmsnorm(ctx_, xn, x, L.attn_norm.data(), n, d, cfg_.rms_eps);
      if constexpr (std::is_same_v<B, cuda>) {  // one GEMV launch for the three in decode
        matmul_shared_input(ctx_, xn, n, d,
                            {MatmulOutput<W>{q, weight_operand(L.wq), qd}, MatmulOutput<W>{k, weight_operand(L.wk), kvd},
                             MatmulOutput<W>{v, weight_operand(L.wv), kvd}});
      } else {
        matmul(ctx_, q, xn, weight_operand(L.wq), n, d, qd);
        matmul(ctx_, k, xn, weight_operand(L.wk), n, d, kvd);
        matmul(ctx_, v, xn, weight_operand(L.wv), n, d, kvd);
      }
      if (cfg_.qk_norm) {  // rows [n, heads*head_dim] are n*heads contiguous head vectors
        rmsnorm(ctx_, q, q, L.q_norm.data(), n * cfg_.num_heads, cfg_.head_dim, cfg_.rms_eps);
        rmsnorm(ctx_, k, k, L.k_norm.data(), n * cfg_.num_kv_heads, cfg_.head_dim, cfg_.rms_eps);
      }
      const int window = cfg_.window_of(l);
      const float theta = cfg_.rope_theta_of(l);
      for (std::size_t s = 0; s < segments.size(); ++s) {
        KVCache<B>& cache = *segments[s].cache;
        SegmentRows r = rows_[s];
        r.shape.window = window;  // Gemma: local layers windowed, global ones not
        r.shape.capacity = cache.capacity(l);
        const int rows = segments[s].rows;
        const std::int64_t row = segments[s].row;
        float *qs = q + row * qd, *ks = k + row * kvd, *vs = v + row * kvd;
        const int first = cache.appended_at(l);
        const std::int32_t* query_pos = cache.positions(l) + first;
        if (cache.collecting_queries()) cache.add_queries(ctx_, l, qs, first, rows);  // before RoPE
        rope(ctx_, qs, ks, query_pos, rows, cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, theta);
        const AttentionStats stats{r.observed ? cache.stats(l) : nullptr, r.first_observed};
        cache.with_kv(l, [&](auto* k_cache, auto* v_cache) {  // fp32 or bf16 storage
          kv_write(ctx_, k_cache, v_cache, ks, vs, rows, first, r.shape, cache.stats(l));
          if constexpr (std::is_same_v<B, cpu>)  // every sequence's attention in one call, below
            jobs_.push_back(AttentionJob::make(att + row * qd, qs, k_cache, v_cache, cache.positions(l),
                                               cache.length(l), query_pos, rows, r.shape, stats));
          else
            attention(ctx_, att + row * qd, qs, k_cache, v_cache, cache.positions(l), cache.length(l),
                      query_pos, rows, r.shape, stats);
        });
      }
      if constexpr (std::is_same_v<B, cpu>) {
        attention(ctx_, std::span<const AttentionJob>(jobs_));
        jobs_.clear();
      }
      residual_add(x, xn, att, L.wo, qd, L.attn_out_norm, n);
      // Feed-forward block: x += W_down (act(W_gate xn) * W_up xn), act silu or gelu_tanh.
      rmsnorm(ctx_, xn, x, L.ffn_norm.data(), n, d, cfg_.rms_eps);
      if constexpr (std::is_same_v<B, cuda>) {
        matmul_shared_input(ctx_, xn, n, d,
                            {MatmulOutput<W>{gate, weight_operand(L.w_gate), ff}, MatmulOutput<W>{up, weight_operand(L.w_up), ff}});
      } else {
        matmul(ctx_, gate, xn, weight_operand(L.w_gate), n, d, ff);
        matmul(ctx_, up, xn, weight_operand(L.w_up), n, d, ff);
      }
      if (cfg_.activation == ModelConfig::Activation::gelu_tanh)
        geglu(ctx_, gate, up, std::int64_t(n) * ff);
      else
        swiglu(ctx_, gate, up, std::int64_t(n) * ff);
      residual_add(x, xn, gate, L.w_down, ff, L.ffn_out_norm, n);
    }
    if (which == LogitsFor::none) return;
    int rows = n;  // LogitsFor::all, or one-row segments: every row, normalised in one call
    if (which == LogitsFor::last && std::int64_t(segments.size()) < n) {
      rows = int(segments.size());
      for (std::size_t s = 0; s < segments.size(); ++s) {
        const std::int64_t last = segments[s].row + segments[s].rows - 1;
        rmsnorm(ctx_, xn + std::int64_t(s) * d, x + last * d, w_.final_norm.data(), 1, d, cfg_.rms_eps);
      }
    } else {
      rmsnorm(ctx_, xn, x, w_.final_norm.data(), rows, d, cfg_.rms_eps);
    }
    matmul(ctx_, logits_.data(), xn, weight_operand(w_.output_matrix()), rows, d, cfg_.vocab_size);
    if (cfg_.final_logit_softcap > 0.0f)
      softcap(ctx_, logits_.data(), cfg_.final_logit_softcap, std::int64_t(rows) * cfg_.vocab_size);
    if (out) copy_to_host(ctx_, out, logits_.data(), std::size_t(rows) * cfg_.vocab_size);
  }

  // x[n, d] += block output y[n, in] W^T: accumulated by the GEMM (Llama), or, with sandwich
  // norms (Gemma), formed in scratch [n, d], normed by out_norm, then added.
  void residual_add(float* x, float* scratch, const float* y, const WeightMatrix<W, B>& w, int in,
                    const Tensor<float, B>& out_norm, int n) {
    const int d = cfg_.hidden_size;
    if (!cfg_.sandwich_norms) {
      matmul(ctx_, x, y, weight_operand(w), n, in, d, /*accumulate=*/true);
      return;
    }
    matmul(ctx_, scratch, y, weight_operand(w), n, in, d);
    rmsnorm(ctx_, scratch, scratch, out_norm.data(), n, d, cfg_.rms_eps);
    add_residual(ctx_, x, scratch, std::int64_t(n) * d);
  }

  ModelConfig cfg_;
  Weights<B, W> w_;
  DType kv_type_ = DType::f32;  // make_cache's default storage of K and V
  int max_chunk_;
  Context<B> ctx_;
  Tensor<float, B> x_, xn_, q_, att_, k_, v_, gate_, up_, logits_;
  Tensor<std::int32_t, B> tokens_;
  std::vector<Segment> segments_;  // forward_batch's one-row segments
  std::vector<SegmentRows> rows_;
  std::vector<AttentionJob> jobs_;  // CPU: a layer's attention of every segment, run as one call
};

}  // namespace dc
