// Every CUDA op against its CPU oracle (cpu/*.hpp) on random inputs, by normalised error
// max|cuda - cpu| / max(1e-6, max|cpu|), in the manner of ggml's test-backend-ops; then the whole
// Transformer<cuda, W> against Transformer<cpu>. Tolerances:
//   1e-5  fp32 ops (only summation order and <= 2-ulp device libm differ),
//   2e-5  attention (online softmax rescales the running sums tile by tile),
//   bf16 weights are compared with the CPU on the same weights rounded to bf16 and back, so the
//   GEMV path (fp32 activations) keeps 1e-5; the cuBLAS path also rounds activations to bf16,
//   and its reference rounds x the same way (1e-4: tensor-core accumulation order).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <distillcache/distillcache.cuh>

#include "../support/cached_positions.hpp"
#include "../support/cuda_compare.cuh"
#include "../support/random.hpp"

namespace {

using Gpu = dc::Context<dc::cuda>;
const dc::Context<dc::cpu> kCpu{};

using dc_test::random_vector;

float round_bf16(float x) { return dc::to_float(dc::to_bf16(x)); }

std::vector<float> rounded_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

using dc_test::to_bf16_vector;

using dc_test::download;
using dc_test::normalised_error;
using dc_test::upload;

using dc_test::cached_positions;

}  // namespace

TEST_CASE("cuda embedding gathers float and bf16 rows exactly") {
  Gpu ctx;
  const int vocab = 50, d = 37, n = 7;
  const std::vector<std::int32_t> tokens{3, 0, 49, 3, 17, 25, 8};
  const auto table = random_vector(std::size_t(vocab) * d, 1);
  const auto table_bf16 = to_bf16_vector(table);
  auto tok_d = upload(ctx, tokens);
  dc::Tensor<float, dc::cuda> out_d(dc::Shape{n, d});
  std::vector<float> want(std::size_t(n) * d);

  SUBCASE("float") {
    auto table_d = upload(ctx, table);
    dc::embedding(ctx, out_d.data(), tok_d.data(), n, table_d.data(), d);
    dc::embedding(kCpu, want.data(), tokens.data(), n, table.data(), d);
    CHECK(normalised_error(download(ctx, out_d), want) == 0.0f);
  }
  SUBCASE("bf16") {
    auto table_d = upload(ctx, table_bf16);
    dc::embedding(ctx, out_d.data(), tok_d.data(), n, table_d.data(), d);
    dc::embedding(kCpu, want.data(), tokens.data(), n, table_bf16.data(), d);
    CHECK(normalised_error(download(ctx, out_d), want) == 0.0f);
  }
}

TEST_CASE("cuda rmsnorm matches the CPU, also in place") {
  Gpu ctx;
  for (const int d : {37, 64, 4096}) {
    CAPTURE(d);
    const int n = 5;
    const auto x = random_vector(std::size_t(n) * d, 2, 3.0f);
    auto w = random_vector(std::size_t(d), 3, 0.2f);
    for (auto& v : w) v += 1.0f;
    std::vector<float> want(x.size());
    dc::rmsnorm(kCpu, want.data(), x.data(), w.data(), n, d, 1e-5f);

    auto x_d = upload(ctx, x);
    auto w_d = upload(ctx, w);
    dc::Tensor<float, dc::cuda> y_d(dc::Shape{n, d});
    dc::rmsnorm(ctx, y_d.data(), x_d.data(), w_d.data(), n, d, 1e-5f);
    CHECK(normalised_error(download(ctx, y_d), want) < 1e-5f);
    dc::rmsnorm(ctx, x_d.data(), x_d.data(), w_d.data(), n, d, 1e-5f);
    CHECK(normalised_error(download(ctx, x_d), want) < 1e-5f);
    // Rows one float past 16-byte alignment: a width the 16-byte path takes (64, 4096) must fall
    // back to the scalar one here.
    std::vector<float> shifted(x.size() + 1, 0.0f);
    std::copy(x.begin(), x.end(), shifted.begin() + 1);
    auto shifted_d = upload(ctx, shifted);
    dc::Tensor<float, dc::cuda> y_shifted_d(dc::Shape{std::int64_t(n) * d + 1});
    dc::rmsnorm(ctx, y_shifted_d.data() + 1, shifted_d.data() + 1, w_d.data(), n, d, 1e-5f);
    const auto y_shifted = download(ctx, y_shifted_d);
    CHECK(normalised_error(std::vector<float>(y_shifted.begin() + 1, y_shifted.end()), want) < 1e-5f);
  }
}

TEST_CASE("cuda matmul (GEMV and cuBLAS paths, float and bf16) matches the CPU") {
  Gpu ctx;
  struct Dims {
    int in, out;
  };
  // The GEMV stages k-tiles of 2048 (n <= 4) or 1024 activations: 2600 and 2054 end in a partial
  // tile (2054 on the unaligned one-element path), and outputs 37, 41 and 9 leave the last block
  // of 8 warps part idle.
  for (const Dims dims : {Dims{100, 37}, Dims{64, 256}, Dims{256, 64}, Dims{4096, 96},
                          Dims{2600, 41}, Dims{2054, 9}}) {
    for (const int n : {1, 3, 8, 9, 17, 64}) {
      for (const bool accumulate : {false, true}) {
        const int in = dims.in, out = dims.out;
        CAPTURE(in);
        CAPTURE(out);
        CAPTURE(n);
        CAPTURE(accumulate);
        const auto x = random_vector(std::size_t(n) * in, 10 + n);
        const auto w = random_vector(std::size_t(out) * in, 20 + in, 1.0f / std::sqrt(float(in)));
        const auto y0 = random_vector(std::size_t(n) * out, 30 + out);
        auto x_d = upload(ctx, x);

        {  // float weights
          std::vector<float> want = y0;
          dc::matmul(kCpu, want.data(), x.data(), w.data(), n, in, out, accumulate);
          auto w_d = upload(ctx, w);
          auto y_d = upload(ctx, y0);
          dc::matmul(ctx, y_d.data(), x_d.data(), w_d.data(), n, in, out, accumulate);
          CHECK(normalised_error(download(ctx, y_d), want) < 1e-5f);
        }
        {  // bf16 weights. Reference: the same weights widened back to fp32; on the cuBLAS
           // path the activations are rounded to bf16 too (cuda/gemm.cuh), and so is x_ref.
          const bool tensor_core_path = n > dc::cuda_detail::gemv_max_rows<dc::bf16>();
          const auto x_ref = tensor_core_path ? rounded_bf16(x) : x;
          const auto w_ref = rounded_bf16(w);
          std::vector<float> want = y0;
          dc::matmul(kCpu, want.data(), x_ref.data(), w_ref.data(), n, in, out, accumulate);
          auto w_d = upload(ctx, to_bf16_vector(w));
          auto y_d = upload(ctx, y0);
          dc::matmul(ctx, y_d.data(), x_d.data(), w_d.data(), n, in, out, accumulate);
          CHECK(normalised_error(download(ctx, y_d), want) < (tensor_core_path ? 1e-4f : 1e-5f));
        }
      }
    }
  }
}

TEST_CASE("cuda matmul_shared_input equals one matmul per matrix, bit for bit") {
  // One GEMV launch over several matrices (n within the GEMV's rows) or one cuBLAS call each:
  // either way every output row is computed as a single matmul computes it. Odd row counts end
  // blocks part-way; an empty output is skipped. Inputs of 2600 and 2054 span several k-tiles
  // and end in a partial one (2054: the one-element path, no 16-byte loads); n = 8 is the
  // float GEMV's widest.
  Gpu ctx;
  const int outs[3] = {100, 0, 37};
  auto check = [&](auto tag) {
    using W = decltype(tag);
    for (const int in : {256, 2600, 2054})
    for (const int n : {1, 3, 8, 9}) {
      CAPTURE(in);
      CAPTURE(n);
      auto x_d = upload(ctx, random_vector(std::size_t(n) * in, 500));
      std::vector<dc::Tensor<W, dc::cuda>> w_d;
      std::vector<dc::Tensor<float, dc::cuda>> fused, single;
      for (int t = 0; t < 3; ++t) {
        const auto w = random_vector(std::size_t(outs[t]) * in + 1, 501 + t);
        if constexpr (std::is_same_v<W, dc::bf16>) w_d.push_back(upload(ctx, to_bf16_vector(w)));
        else w_d.push_back(upload(ctx, w));
        fused.push_back(upload(ctx, std::vector<float>(std::size_t(n) * outs[t] + 1, -1.0f)));
        single.push_back(upload(ctx, std::vector<float>(std::size_t(n) * outs[t] + 1, -1.0f)));
        dc::matmul(ctx, single.back().data(), x_d.data(), w_d.back().data(), n, in, outs[t]);
      }
      dc::matmul_shared_input(ctx, x_d.data(), n, in,
                              {dc::MatmulOutput<W>{fused[0].data(), w_d[0].data(), outs[0]},
                               dc::MatmulOutput<W>{fused[1].data(), w_d[1].data(), outs[1]},
                               dc::MatmulOutput<W>{fused[2].data(), w_d[2].data(), outs[2]}});
      for (int t = 0; t < 3; ++t) CHECK(download(ctx, fused[std::size_t(t)]) == download(ctx, single[std::size_t(t)]));
    }
  };
  SUBCASE("float weights") { check(float{}); }
  SUBCASE("bf16 weights") { check(dc::bf16{}); }
}

TEST_CASE("cuda rope matches the CPU up to position 30000") {
  Gpu ctx;
  const std::vector<std::int32_t> pos{0, 1, 7, 100, 4095, 30000};
  const int n = int(pos.size()), q_heads = 4, kv_heads = 2;
  for (const int hd : {16, 64, 128}) {
    for (const float theta : {1e4f, 1e6f}) {
      CAPTURE(hd);
      CAPTURE(theta);
      auto q = random_vector(std::size_t(n) * q_heads * hd, 40 + hd);
      auto k = random_vector(std::size_t(n) * kv_heads * hd, 50 + hd);
      auto q_d = upload(ctx, q);
      auto k_d = upload(ctx, k);
      auto pos_d = upload(ctx, pos);
      dc::rope(kCpu, q.data(), k.data(), pos.data(), n, q_heads, kv_heads, hd, theta);
      dc::rope(ctx, q_d.data(), k_d.data(), pos_d.data(), n, q_heads, kv_heads, hd, theta);
      CHECK(normalised_error(download(ctx, q_d), q) < 1e-5f);
      CHECK(normalised_error(download(ctx, k_d), k) < 1e-5f);
    }
  }
}

TEST_CASE("cuda kv_write places rows in the same slots as the CPU") {
  Gpu ctx;
  dc::AttentionShape s{6, 2, 16, 0, 0.25f, 40};
  const int n = 5, first = 11;
  const auto k = random_vector(std::size_t(n) * s.num_kv_heads * s.head_dim, 60);
  const auto v = random_vector(k.size(), 61);
  std::vector<float> kc = random_vector(std::size_t(s.num_kv_heads) * s.capacity * s.head_dim, 62);
  std::vector<float> vc = random_vector(kc.size(), 63);
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto k_d = upload(ctx, k);
  auto v_d = upload(ctx, v);
  dc::kv_write(kCpu, kc.data(), vc.data(), k.data(), v.data(), n, first, s);
  dc::kv_write(ctx, kc_d.data(), vc_d.data(), k_d.data(), v_d.data(), n, first, s);
  CHECK(normalised_error(download(ctx, kc_d), kc) == 0.0f);
  CHECK(normalised_error(download(ctx, vc_d), vc) == 0.0f);
}

namespace {

struct AttentionCase {
  const char* name;
  int n, len, heads, kv_heads, head_dim, window;
  bool compacted;  // key positions: per KV head its own sorted random subset of [0, 2*len)
  int offset = 0;  // K/V cache pointers start this many floats into their buffers (alignment)
};

void check_attention(const AttentionCase& c) {
  CAPTURE(c.name);
  Gpu ctx;
  const int capacity = c.len + 7;
  dc::AttentionShape s{c.heads, c.kv_heads, c.head_dim, c.window,
                       1.0f / std::sqrt(float(c.head_dim)), capacity};

  // The chunk's queries are the last n cached tokens, as in the transformer.
  const auto [key_pos, query_pos] = cached_positions(c.len, capacity, c.kv_heads, c.n, c.compacted);

  const std::size_t cache_size = std::size_t(c.kv_heads) * capacity * c.head_dim;
  auto kc = random_vector(cache_size, 80, 1.5f);
  auto vc = random_vector(cache_size, 81);
  // Slots past len hold NaN: reading them anywhere would poison the output.
  for (int h = 0; h < c.kv_heads; ++h)
    for (int j = c.len; j < capacity; ++j)
      for (int i = 0; i < c.head_dim; ++i) {
        const std::size_t idx = (std::size_t(h) * capacity + j) * c.head_dim + i;
        kc[idx] = vc[idx] = std::numeric_limits<float>::quiet_NaN();
      }
  const auto q = random_vector(std::size_t(c.n) * c.heads * c.head_dim, 82, 1.5f);

  std::vector<float> want(q.size());
  dc::attention(kCpu, want.data(), q.data(), kc.data(), vc.data(), key_pos.data(), c.len,
                query_pos.data(), c.n, s);

  auto q_d = upload(ctx, q);
  kc.insert(kc.begin(), std::size_t(c.offset), 0.0f);
  vc.insert(vc.begin(), std::size_t(c.offset), 0.0f);
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto kp_d = upload(ctx, key_pos);
  auto qp_d = upload(ctx, query_pos);
  dc::Tensor<float, dc::cuda> out_d(dc::Shape{std::int64_t(q.size())});
  dc::attention(ctx, out_d.data(), q_d.data(), kc_d.data() + c.offset, vc_d.data() + c.offset,
                kp_d.data(), c.len, qp_d.data(), c.n, s);
  CHECK(normalised_error(download(ctx, out_d), want) < 2e-5f);
}

}  // namespace

TEST_CASE("cuda attention matches the CPU: decode, chunks, windows, GQA, compacted caches") {
  const AttentionCase cases[] = {
      {"decode, MHA, hd 64", 1, 3000, 4, 4, 64, 0, false},
      {"decode, GQA 3, hd 64, window 512", 1, 3000, 6, 2, 64, 512, false},
      {"decode, GQA 3, hd 16 (padded)", 1, 3000, 6, 2, 16, 0, false},
      {"chunk 16, GQA 3, hd 64", 16, 3000, 6, 2, 64, 0, false},
      {"chunk 16, MHA, hd 16, window 100", 16, 2000, 4, 4, 16, 100, false},
      {"compacted decode, GQA 3, hd 64", 1, 1500, 6, 2, 64, 0, true},
      {"compacted chunk 16, GQA 3, hd 64, window 700", 16, 1500, 6, 2, 64, 700, true},
      {"compacted chunk 16, MHA, hd 16, window 8", 16, 1500, 4, 4, 16, 8, true},
      {"Mistral decode, GQA 4, hd 128, window 4096", 1, 4100, 32, 8, 128, 4096, false},
      {"Mistral chunk 128 (one split), hd 128", 128, 600, 32, 8, 128, 0, false},
      {"hd 80 (padded to 128), GQA 2", 3, 777, 4, 2, 80, 0, false},
      {"hd 256 (padded), chunk 2", 2, 300, 2, 1, 256, 0, false},
      {"short cache shorter than a tile", 5, 5, 3, 1, 64, 0, false},
      {"K/V pointers not 16-byte aligned: scalar loads", 4, 500, 4, 2, 64, 0, false, 1},
      // The one-query (decode) kernel: every group width it instantiates (1, up to 4, up to 8,
      // with unused heads), fp32 rows of 64 and 128 (16 and 32 lanes a key), caches shorter than
      // one step, a window that leaves whole splits empty, an unaligned cache (tiled kernel).
      {"decode, GQA 8, hd 128", 1, 5000, 16, 2, 128, 0, false},
      {"decode, GQA 2 (4 wide), hd 128", 1, 3001, 8, 4, 128, 0, false},
      {"decode, GQA 6 (8 wide), hd 64, window 300", 1, 4000, 12, 2, 64, 300, false},
      {"decode, MHA, hd 128, compacted", 1, 2500, 4, 4, 128, 0, true},
      {"decode, len 5, GQA 4, hd 128", 1, 5, 8, 2, 128, 0, false},
      {"decode, len 37, GQA 3, hd 64, window 8", 1, 37, 6, 2, 64, 8, false},
      {"decode, unaligned cache, GQA 4, hd 128", 1, 700, 8, 2, 128, 0, false, 1},
      // A head dim that is no multiple of 4: partial rows not 16-byte aligned, so the split
      // combine takes its scalar variant (every other case has a multiple of 4).
      {"decode, GQA 3, hd 18 (padded, scalar combine)", 1, 3000, 6, 2, 18, 0, false},
  };
  for (const auto& c : cases) check_attention(c);
}

TEST_CASE("cuda attention gives zeros when a query sees no key, like the CPU") {
  Gpu ctx;
  const int len = 40, hd = 64, heads = 2;
  dc::AttentionShape s{heads, 1, hd, 4, 0.125f, len};
  std::vector<std::int32_t> key_pos(len);
  for (int j = 0; j < len; ++j) key_pos[std::size_t(j)] = 100 + j;
  // Before every key; past every window: one query each (the decode kernel), then both (tiled).
  for (const std::vector<std::int32_t>& query_pos :
       {std::vector<std::int32_t>{5}, std::vector<std::int32_t>{300}, std::vector<std::int32_t>{5, 300}}) {
    const int n = int(query_pos.size());
    CAPTURE(n);
    const auto q = random_vector(std::size_t(n) * heads * hd, 90);
    const auto kc = random_vector(std::size_t(len) * hd, 91);
    const auto vc = random_vector(kc.size(), 92);
    std::vector<float> want(q.size(), 1.0f);
    dc::attention(kCpu, want.data(), q.data(), kc.data(), vc.data(), key_pos.data(), len,
                  query_pos.data(), n, s);
    auto q_d = upload(ctx, q);
    auto kc_d = upload(ctx, kc);
    auto vc_d = upload(ctx, vc);
    auto kp_d = upload(ctx, key_pos);
    auto qp_d = upload(ctx, query_pos);
    auto out_d = upload(ctx, std::vector<float>(q.size(), 1.0f));
    dc::attention(ctx, out_d.data(), q_d.data(), kc_d.data(), vc_d.data(), kp_d.data(), len,
                  qp_d.data(), n, s);
    const auto got = download(ctx, out_d);
    CHECK(std::all_of(want.begin(), want.end(), [](float v) { return v == 0.0f; }));
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("cuda swiglu and geglu match the CPU") {
  Gpu ctx;
  const std::int64_t count = 100003;  // not a multiple of any block size
  for (const bool gelu : {false, true}) {
    CAPTURE(gelu);
    auto gate = random_vector(std::size_t(count), 100, 3.0f);
    const auto up = random_vector(std::size_t(count), 101);
    auto gate_d = upload(ctx, gate);
    auto up_d = upload(ctx, up);
    if (gelu) {
      dc::geglu(kCpu, gate.data(), up.data(), count);
      dc::geglu(ctx, gate_d.data(), up_d.data(), count);
    } else {
      dc::swiglu(kCpu, gate.data(), up.data(), count);
      dc::swiglu(ctx, gate_d.data(), up_d.data(), count);
    }
    CHECK(normalised_error(download(ctx, gate_d), gate) < 1e-5f);
  }
}

// The oracle is the softmax in double, not the CPU overload: its sequential fp32 sum over 32000
// terms is off by a few 1e-5 relative (2.6e-5 on the first H200 run, where the GPU's tree sum
// was the closer of the two), so "GPU == CPU within 1e-5" tested the CPU's rounding. Both
// backends are held to the double result: the GPU within 1e-5, the CPU within its sequential
// sum's random-walk error, 4 sqrt(cols) 2^-24 relative (at least 1e-5): 4.3e-5 at 32000 columns,
// where it is 2.6e-5 on this data (the worst case, cols x 2^-24, would let any bug through).
namespace {

std::vector<float> softmax_rows_in_double(const std::vector<float>& x, int n, int cols) {
  std::vector<float> y(x.size());
  for (int r = 0; r < n; ++r) {
    const float* xr = x.data() + std::size_t(r) * cols;
    double m = -INFINITY, sum = 0.0;
    for (int i = 0; i < cols; ++i) m = std::max(m, double(xr[i]));
    for (int i = 0; i < cols; ++i) sum += std::exp(double(xr[i]) - m);
    for (int i = 0; i < cols; ++i) y[std::size_t(r) * cols + i] = float(std::exp(double(xr[i]) - m) / sum);
  }
  return y;
}

}  // namespace

TEST_CASE("cuda softmax_rows matches the softmax in double, as the CPU does") {
  Gpu ctx;
  for (const int cols : {7, 1000, 32000}) {
    CAPTURE(cols);
    const int n = 3;
    const auto x = random_vector(std::size_t(n) * cols, 110, 4.0f);
    const std::vector<float> want = softmax_rows_in_double(x, n, cols);
    std::vector<float> cpu(x.size());
    dc::softmax_rows(kCpu, cpu.data(), x.data(), n, cols);
    CHECK(normalised_error(cpu, want) < std::max(1e-5f, 4.0f * std::sqrt(float(cols)) * 0x1p-24f));
    auto x_d = upload(ctx, x);
    dc::Tensor<float, dc::cuda> y_d(dc::Shape{n, cols});
    dc::softmax_rows(ctx, y_d.data(), x_d.data(), n, cols);
    CHECK(normalised_error(download(ctx, y_d), want) < 1e-5f);
    dc::softmax_rows(ctx, x_d.data(), x_d.data(), n, cols);
    CHECK(normalised_error(download(ctx, x_d), want) < 1e-5f);
  }
}

// ---- end to end --------------------------------------------------------------------------------

namespace {

dc::ModelConfig tiny_config() {
  dc::ModelConfig c;
  c.architecture = "mistral";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position = 128;
  c.sliding_window = 8;
  return c;
}

// Fixed-seed normal weights: embeddings N(0,1), matrices N(0, 1/in), norms 1 + N(0, 0.1^2).
// round_to_bf16 widens every matrix back from bf16 (the CPU reference of a bf16 model).
dc::HostWeights random_weights(const dc::ModelConfig& cfg, unsigned seed, bool round_to_bf16) {
  dc::HostWeights w = dc::allocate_host_weights(cfg);
  std::mt19937 rng(seed);
  auto fill = [&](const std::string& name, dc::Tensor<float, dc::cpu>& t, dc::Shape s) {
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_embed = name.find("embed") != std::string::npos;
    const float stddev = is_norm ? 0.1f : is_embed ? 1.0f : 1.0f / std::sqrt(float(s[1]));
    std::normal_distribution<float> normal(0.0f, stddev);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      float v = normal(rng) + (is_norm ? 1.0f : 0.0f);
      if (round_to_bf16 && !is_norm) v = round_bf16(v);
      t.data()[i] = v;
    }
  };
  dc::for_each_weight(cfg, w, fill);
  return w;
}

// Prefill 20 tokens as calls of 13 and 7 (all logits), then 5 single-token decode steps; both
// models keep K/V as kv_type.
template <class W>
void check_transformer(int max_chunk, float tolerance, dc::DType kv_type = dc::DType::f32) {
  const dc::ModelConfig cfg = tiny_config();
  constexpr unsigned kSeed = 1234;
  dc::Transformer<dc::cpu> reference(cfg, random_weights(cfg, kSeed, std::is_same_v<W, dc::bf16>),
                                     max_chunk);
  dc::Weights<dc::cuda, W> device_weights;
  {
    Gpu upload_ctx;
    device_weights = dc::upload_weights<W>(random_weights(cfg, kSeed, false), upload_ctx);
  }
  dc::Transformer<dc::cuda, W> model(cfg, std::move(device_weights), max_chunk);
  reference.set_kv_type(kv_type);
  model.set_kv_type(kv_type);

  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int32_t> token(0, cfg.vocab_size - 1);
  std::vector<std::int32_t> tokens(25);
  for (auto& t : tokens) t = token(rng);

  auto cache_cpu = reference.make_cache(64);
  auto cache_gpu = model.make_cache(64);
  const std::span<const std::int32_t> all(tokens);
  auto step = [&](std::span<const std::int32_t> chunk, dc::LogitsFor which) {
    const auto want = reference.forward(chunk, cache_cpu, which);
    const auto got = model.forward(chunk, cache_gpu, which);
    CAPTURE(cache_gpu.length());
    CHECK(normalised_error(got, want) < tolerance);
  };
  step(all.subspan(0, 13), dc::LogitsFor::all);
  step(all.subspan(13, 7), dc::LogitsFor::all);
  for (int i = 20; i < 25; ++i) step(all.subspan(std::size_t(i), 1), dc::LogitsFor::last);
  CHECK(cache_gpu.length() == 25);
  CHECK(cache_gpu.kv_type() == kv_type);
}

}  // namespace

TEST_CASE("Transformer<cuda, float> matches Transformer<cpu>: chunked prefill then decode") {
  check_transformer<float>(16, 1e-4f);
}

// Both backends round K/V to bf16 by the same rule, but from fp32 rows that differ by rounding,
// so an element near a rounding boundary may land one bf16 step (2^-8 relative) apart: a looser
// tolerance than fp32's (the op-level tests in test_cuda_kv_bf16.cu compare exact bits).
TEST_CASE("Transformer<cuda, float> with a bf16 KV cache matches the CPU's bf16 cache") {
  check_transformer<float>(16, 1e-3f, dc::DType::bf16);
}

// Batched decoding: three sequences of 5, 9 and 13 prompt tokens (one compacted to a shared
// keep-set) step together; every row matches the CPU's batched step, which test_batched_decoding
// proves equal to single-sequence decoding. max_chunk 2 splits the batch of 3 into two chunks.
TEST_CASE("Transformer<cuda, float>::forward_batch matches the CPU's, per sequence") {
  const dc::ModelConfig cfg = tiny_config();
  dc::Transformer<dc::cpu> reference(cfg, random_weights(cfg, 99, false), 2);
  dc::Weights<dc::cuda, float> device_weights;
  {
    Gpu upload_ctx;
    device_weights = dc::upload_weights<float>(random_weights(cfg, 99, false), upload_ctx);
  }
  dc::Transformer<dc::cuda, float> model(cfg, std::move(device_weights), 2);
  std::vector<dc::KVCache<dc::cpu>> cpu_caches;
  std::vector<dc::KVCache<dc::cuda>> gpu_caches;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < 5 + 4 * s; ++i) prompt.push_back(std::int32_t((31 * i + 7 * s) % cfg.vocab_size));
    cpu_caches.push_back(reference.make_cache(32));
    gpu_caches.push_back(model.make_cache(32));
    cpu_caches.back().set_observed_from(0);
    gpu_caches.back().set_observed_from(0);
    reference.forward(prompt, cpu_caches.back());
    model.forward(prompt, gpu_caches.back());
  }
  const std::vector<std::int32_t> keep{0, 2, 3, 6, 8};
  cpu_caches[1].compact(reference.context(), keep);
  gpu_caches[1].compact(model.context(), keep);
  std::vector<dc::KVCache<dc::cpu>*> cpu_batch;
  std::vector<dc::KVCache<dc::cuda>*> gpu_batch;
  for (int s = 0; s < 3; ++s) {
    cpu_batch.push_back(&cpu_caches[std::size_t(s)]);
    gpu_batch.push_back(&gpu_caches[std::size_t(s)]);
  }
  const std::size_t vocab = std::size_t(cfg.vocab_size);
  std::vector<float> want(3 * vocab), got(3 * vocab);
  for (int t = 0; t < 4; ++t) {
    const std::vector<std::int32_t> next{std::int32_t(3 + t), std::int32_t(50 + t), std::int32_t(100 + t)};
    reference.forward_batch(next, cpu_batch, want);
    model.forward_batch(next, gpu_batch, got);
    for (std::size_t s = 0; s < 3; ++s) {
      CAPTURE(t);
      CAPTURE(s);
      CHECK(normalised_error(std::span<const float>(got).subspan(s * vocab, vocab),
                             std::span<const float>(want).subspan(s * vocab, vocab)) < 1e-4f);
      CHECK(gpu_caches[s].length() == cpu_caches[s].length());
    }
  }
}

TEST_CASE("Transformer<cuda, bf16> matches Transformer<cpu> on bf16-rounded weights") {
  SUBCASE("one token at a time: GEMV everywhere, fp32 activations") {
    check_transformer<dc::bf16>(1, 1e-4f);
  }
  SUBCASE("chunks of up to 16: cuBLAS rounds prefill activations to bf16") {
    // (bf16 weights take cuBLAS from n = 2 on, cuda/gemm.cuh: at a max_chunk of 8 too.)
    // bf16 activations (8 significant bits) through two layers: ~1e-3 relative in the logits.
    check_transformer<dc::bf16>(16, 3e-2f);
  }
}

// ---- eviction: statistics, compaction -----------------------------------------------------------
// kv_write's statistics rows, kv_compact and attention's fused statistics against the CPU; then
// Transformer<cuda, float> against Transformer<cpu> with statistics on through prefill, decode,
// compaction and more decode. Statistics are compared row by row by normalised error:
//   exact  moved/copied data (kv_compact, K/V rows) and kStatQueries (sums of 1.0f),
//   1e-5   kv_write norms,
//   2e-5   attention statistics, as attention outputs: scores differ from the CPU's by the
//          dot-product summation order (and FMA contraction), which e^(s - m) turns into a
//          relative error of p of a few 1e-6 (1e-4 at 32k keys, where the CPU's sequential
//          partition sum is itself off by ~1e-5),
//   1e-4   end to end (cuBLAS GEMM summation order feeds q, k, v).

namespace {

std::vector<float> uniform_vector(std::size_t n, unsigned seed, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(rng);
  return v;
}

template <class T>
std::vector<T> download(const Gpu& ctx, const T* device, std::size_t count) {
  std::vector<T> host(count);
  dc::copy_to_host(ctx, host.data(), device, count);
  return host;
}

const char* stat_row_name(int r) {
  switch (r) {
    case dc::kStatMass: return "mass";
    case dc::kStatEntropyMass: return "entropy mass";
    case dc::kStatQueries: return "queries";
    case dc::kStatValueNorm: return "value norm";
    case dc::kStatKeyNorm: return "key norm";
    case dc::kStatLastMass: return "last mass";
    default: return "head mass";
  }
}

// Compares two statistics blocks [kv_heads * per_head, capacity] (per_head rows of each KV head)
// row by row. With `base` (the block before the op), accumulated rows are compared by their
// increments got - base vs want - base, so a large starting value cannot hide an error;
// kStatLastMass (overwritten) and the K/V norms (set when a slot is written, never accumulated)
// are compared directly: their increments are zero on both sides but for the last-bit difference
// of the two backends' norms, which a relative comparison of increments would blow up to 1 (it
// did, on the first H200 run). kStatQueries must agree exactly.
void check_stats_block(const std::vector<float>& got, const std::vector<float>& want, int rows,
                       int per_head, int capacity, float tolerance,
                       const std::vector<float>* base = nullptr) {
  REQUIRE(got.size() == std::size_t(rows) * capacity);
  REQUIRE(want.size() == got.size());
  for (int row = 0; row < rows; ++row) {
    const int r = row % per_head;  // the kind of row within its KV head
    CAPTURE(row);
    CAPTURE(stat_row_name(r));
    const std::size_t at = std::size_t(row) * capacity;
    std::vector<float> g(got.begin() + at, got.begin() + at + capacity);
    std::vector<float> w(want.begin() + at, want.begin() + at + capacity);
    if (r == dc::kStatQueries) {
      CHECK(g == w);
      continue;
    }
    const bool set_not_accumulated = r == dc::kStatLastMass || r == dc::kStatValueNorm || r == dc::kStatKeyNorm;
    if (base && !set_not_accumulated)
      for (int j = 0; j < capacity; ++j) {
        g[std::size_t(j)] -= (*base)[at + std::size_t(j)];
        w[std::size_t(j)] -= (*base)[at + std::size_t(j)];
      }
    CHECK(normalised_error(g, w) < tolerance);
  }
}

}  // namespace

// ---- kv_write --------------------------------------------------------------------------------

TEST_CASE("cuda kv_write resets the new slots' statistics and records K/V norms like the CPU") {
  Gpu ctx;
  struct Case {
    int heads, kv_heads, head_dim, capacity, n, first;
  };
  for (const Case c : {Case{6, 2, 16, 40, 5, 11}, Case{32, 8, 128, 300, 64, 200},
                       Case{4, 4, 80, 10, 1, 9}, Case{3, 1, 64, 50, 50, 0}}) {
    CAPTURE(c.heads);
    CAPTURE(c.head_dim);
    CAPTURE(c.n);
    const dc::AttentionShape s{c.heads, c.kv_heads, c.head_dim, 0,
                               1.0f / std::sqrt(float(c.head_dim)), c.capacity};
    const int per_head = dc::stat_rows_per_kv_head(c.heads / c.kv_heads);
    const int rows = c.kv_heads * per_head;
    const auto k = random_vector(std::size_t(c.n) * c.kv_heads * c.head_dim, 60, 2.0f);
    const auto v = random_vector(k.size(), 61);
    auto kc = random_vector(std::size_t(c.kv_heads) * c.capacity * c.head_dim, 62);
    auto vc = random_vector(kc.size(), 63);
    auto stats = uniform_vector(std::size_t(rows) * c.capacity, 64, 5.0f);  // old values
    auto kc_d = upload(ctx, kc);
    auto vc_d = upload(ctx, vc);
    auto stats_d = upload(ctx, stats);
    auto k_d = upload(ctx, k);
    auto v_d = upload(ctx, v);
    dc::kv_write(kCpu, kc.data(), vc.data(), k.data(), v.data(), c.n, c.first, s, stats.data());
    dc::kv_write(ctx, kc_d.data(), vc_d.data(), k_d.data(), v_d.data(), c.n, c.first, s,
                 stats_d.data());
    CHECK(normalised_error(download(ctx, kc_d), kc) == 0.0f);
    CHECK(normalised_error(download(ctx, vc_d), vc) == 0.0f);
    const auto got = download(ctx, stats_d);
    // Rows other than the norms must be exact (zeros in the new slots, untouched elsewhere).
    for (int row = 0; row < rows; ++row) {
      CAPTURE(row);
      const int r = row % per_head;
      const std::size_t at = std::size_t(row) * c.capacity;
      const std::span<const float> g(got.data() + at, std::size_t(c.capacity));
      const std::span<const float> w(stats.data() + at, std::size_t(c.capacity));
      if (r == dc::kStatKeyNorm || r == dc::kStatValueNorm) {
        CHECK(normalised_error(g, w) < 1e-5f);
      } else {
        CHECK(std::equal(g.begin(), g.end(), w.begin()));
      }
    }
  }
}

// ---- kv_compact ------------------------------------------------------------------------------

namespace {

struct CompactCase {
  std::string name;
  int kv_heads, head_dim, heads, capacity, len;
  std::vector<std::int32_t> keep;      // one keep-set for every head
  std::vector<std::int32_t> per_head;  // or, when given, [kv_heads, count]: a set per head
};

// Fills a buffer with sign * (offset + i mod 2^22), exact in fp32 (a half-integer offset keeps
// 1 bit below the point), and fast enough for 40M floats.
std::vector<float> distinct_values(std::size_t n, float offset, float sign = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = sign * (offset + float(i % 4194304));
  return v;
}

void check_compact(const CompactCase& c) {
  CAPTURE(c.name);
  Gpu ctx;
  const int per_head = dc::stat_rows_per_kv_head(c.heads / c.kv_heads);
  const std::size_t kv = std::size_t(c.kv_heads) * c.capacity * c.head_dim;
  auto kc = distinct_values(kv, 0.0f);
  auto vc = distinct_values(kv, 0.5f, -1.0f);
  auto stats = distinct_values(std::size_t(c.kv_heads) * per_head * c.capacity, 0.5f);
  // Either per-head sets, or one set repeated for every head (a shared keep-set).
  std::vector<std::int32_t> flat = c.per_head;
  if (flat.empty())
    for (int h = 0; h < c.kv_heads; ++h) flat.insert(flat.end(), c.keep.begin(), c.keep.end());
  const int count = int(flat.size()) / c.kv_heads;
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto stats_d = upload(ctx, stats);
  dc::kv_compact(kCpu, kc.data(), vc.data(), stats.data(), c.kv_heads, c.head_dim, per_head,
                 c.capacity, flat, count);
  {
    // The keep-set lives in a temporary the GPU call must not read after it returns.
    std::vector<std::int32_t> keep = flat;
    dc::kv_compact(ctx, kc_d.data(), vc_d.data(), stats_d.data(), c.kv_heads, c.head_dim, per_head,
                   c.capacity, keep, count);
    std::fill(keep.begin(), keep.end(), -1);
  }
  CHECK(download(ctx, kc_d) == kc);
  CHECK(download(ctx, vc_d) == vc);
  CHECK(download(ctx, stats_d) == stats);
}

std::vector<std::int32_t> iota_keep(int begin, int end) {
  std::vector<std::int32_t> k;
  for (int i = begin; i < end; ++i) k.push_back(i);
  return k;
}

// kv_heads keep-sets of `count` slots of [0, len) each, every head its own random choice.
std::vector<std::int32_t> per_head_keep(int kv_heads, int len, int count, unsigned seed) {
  std::vector<std::int32_t> flat;
  for (int h = 0; h < kv_heads; ++h) {
    std::vector<std::int32_t> all = iota_keep(0, len);
    std::mt19937 rng(seed + 17u * unsigned(h));
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + count);
    flat.insert(flat.end(), all.begin(), all.begin() + count);
  }
  return flat;
}

std::vector<std::int32_t> random_keep(int len, double fraction, unsigned seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution take(fraction);
  std::vector<std::int32_t> k;
  for (int i = 0; i < len; ++i)
    if (take(rng)) k.push_back(i);
  return k;
}

}  // namespace

TEST_CASE("cuda kv_compact moves K, V and statistics rows exactly like the CPU") {
  const int len = 300, cap = 320;
  auto all_but = [&](int drop) {
    auto k = iota_keep(0, len);
    k.erase(k.begin() + drop);
    return k;
  };
  const std::vector<CompactCase> cases = {
      {"identity", 2, 16, 6, cap, len, iota_keep(0, len), {}},
      {"empty keep", 2, 16, 6, cap, len, {}, {}},
      {"keep of one (the last slot)", 2, 16, 6, cap, len, {len - 1}, {}},
      {"keep of one (slot 0)", 2, 16, 6, cap, len, {0}, {}},
      {"all but the first", 2, 16, 6, cap, len, all_but(0), {}},
      {"all but a middle slot", 2, 64, 4, cap, len, all_but(137), {}},
      {"all but the last (a truncation)", 2, 64, 4, cap, len, all_but(len - 1), {}},
      {"random half, hd 128, GQA", 8, 128, 32, cap, len, random_keep(len, 0.5, 1), {}},
      {"random tenth, hd 80", 3, 80, 6, cap, len, random_keep(len, 0.1, 2), {}},
      {"recent window", 2, 16, 6, cap, len, iota_keep(len - 50, len), {}},
      {"per head: 3 heads, their own random thirds", 3, 64, 9, cap, len, {}, per_head_keep(3, len, 100, 3)},
      {"per head: head 0 identity, head 1 random", 2, 16, 6, cap, len, {},
       [&] {
         auto k = iota_keep(0, 120);
         const auto other = per_head_keep(1, len, 120, 4);
         k.insert(k.end(), other.begin(), other.end());
         return k;
       }()},
  };
  for (const auto& c : cases) check_compact(c);
}

TEST_CASE("cuda kv_compact batches long caches without races") {
  // 8 KV heads x (K and V: 2 x 128 floats, and 10 statistics rows) = 8.3 KiB per slot: 20000 moved slots span
  // several 64 MiB scratch batches, and the keep-set's gaps are 1 (sources overlap destinations).
  const int len = 20000, cap = 20000;
  std::vector<std::int32_t> keep;
  for (int i = 0; i < len; ++i)
    if (i % 7 != 3) keep.push_back(i);
  check_compact({"20000 slots, drop every 7th", 8, 128, 32, cap, len, keep, {}});
}

// ---- attention statistics --------------------------------------------------------------------

namespace {

struct StatsCase {
  const char* name;
  int n, len, heads, kv_heads, head_dim, window;
  bool compacted;      // key positions: per KV head its own sorted random subset of [0, 2*len)
  int first_observed;  // queries t >= first_observed are observed
  int offset = 0;      // K/V cache pointers start this many elements into their buffers
  float tolerance = 2e-5f;
};

// K/V as a cache of storage type KV holds them: fp32, or rounded to bf16.
template <class KV>
std::vector<KV> as_storage(const std::vector<float>& v) {
  if constexpr (std::is_same_v<KV, float>) return v;
  else return to_bf16_vector(v);
}

// KV: the storage type of the cache on both sides (the CPU widens bf16 exactly, as the GPU).
template <class KV = float>
void check_attention_stats(const StatsCase& c) {
  CAPTURE(c.name);
  Gpu ctx;
  const int capacity = c.len + 7;
  const dc::AttentionShape s{c.heads, c.kv_heads, c.head_dim, c.window,
                             1.0f / std::sqrt(float(c.head_dim)), capacity};
  const int per_head = dc::stat_rows_per_kv_head(c.heads / c.kv_heads);
  const int rows = c.kv_heads * per_head;  // the block as [kv_heads * per_head, capacity]

  const auto [key_pos, query_pos] = cached_positions(c.len, capacity, c.kv_heads, c.n, c.compacted);

  const std::size_t cache_size = std::size_t(c.kv_heads) * capacity * c.head_dim;
  auto kc = as_storage<KV>(random_vector(cache_size, 80, 1.5f));
  auto vc = as_storage<KV>(random_vector(cache_size, 81));
  for (int h = 0; h < c.kv_heads; ++h)  // slots past len hold NaN: they must never be read
    for (int j = c.len; j < capacity; ++j)
      for (int i = 0; i < c.head_dim; ++i) {
        const std::size_t idx = (std::size_t(h) * capacity + j) * c.head_dim + i;
        kc[idx] = vc[idx] = dc::from_float<KV>(std::numeric_limits<float>::quiet_NaN());
      }
  const auto q = random_vector(std::size_t(c.n) * c.heads * c.head_dim, 82, 1.5f);
  // Earlier accumulations: attention must add to them (and overwrite kStatLastMass).
  const auto base = uniform_vector(std::size_t(rows) * capacity, 83, 2.0f);

  std::vector<float> want(q.size());
  auto want_stats = base;
  dc::attention(kCpu, want.data(), q.data(), kc.data(), vc.data(), key_pos.data(), c.len,
                query_pos.data(), c.n, s, dc::AttentionStats{want_stats.data(), c.first_observed});

  auto q_d = upload(ctx, q);
  kc.insert(kc.begin(), std::size_t(c.offset), KV{});
  vc.insert(vc.begin(), std::size_t(c.offset), KV{});
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto kp_d = upload(ctx, key_pos);
  auto qp_d = upload(ctx, query_pos);
  auto stats_d = upload(ctx, base);
  dc::Tensor<float, dc::cuda> out_d(dc::Shape{std::int64_t(q.size())});
  dc::attention(ctx, out_d.data(), q_d.data(), kc_d.data() + c.offset, vc_d.data() + c.offset,
                kp_d.data(), c.len, qp_d.data(), c.n, s,
                dc::AttentionStats{stats_d.data(), c.first_observed});
  CHECK(normalised_error(download(ctx, out_d), want) < c.tolerance);
  check_stats_block(download(ctx, stats_d), want_stats, rows, per_head, capacity, c.tolerance, &base);

  // Determinism: the same call again adds exactly the same increments.
  auto stats2_d = upload(ctx, base);
  dc::attention(ctx, out_d.data(), q_d.data(), kc_d.data() + c.offset, vc_d.data() + c.offset,
                kp_d.data(), c.len, qp_d.data(), c.n, s,
                dc::AttentionStats{stats2_d.data(), c.first_observed});
  CHECK(download(ctx, stats2_d) == download(ctx, stats_d));
}

}  // namespace

TEST_CASE("cuda attention statistics match the CPU: decode, chunks, windows, GQA, splits") {
  // Decode (few rows) takes the key-split path with a combine on any large GPU; chunks of 64+
  // rows per KV head fill the GPU without splitting.
  const StatsCase cases[] = {
      {"decode, MHA, hd 64 (split)", 1, 3000, 4, 4, 64, 0, false, 0},
      {"decode, GQA 3, hd 64, window 512", 1, 3000, 6, 2, 64, 512, false, 0},
      {"decode, GQA 3, hd 16 (padded)", 1, 3000, 6, 2, 16, 0, false, 0},
      {"decode, GQA 1, hd 128", 1, 2000, 8, 8, 128, 0, false, 0},
      {"decode not observed (first_observed = n)", 1, 1000, 6, 2, 64, 0, false, 1},
      {"chunk 16, GQA 3, hd 64, observed from 8", 16, 3000, 6, 2, 64, 0, false, 8},
      {"chunk 16, MHA, hd 16, window 100, observed from 5", 16, 2000, 4, 4, 16, 100, false, 5},
      {"chunk 16, GQA 3, hd 128, all observed", 16, 2500, 6, 2, 128, 0, false, 0},
      {"compacted decode, GQA 3, hd 64", 1, 1500, 6, 2, 64, 0, true, 0},
      {"compacted chunk 16, GQA 3, hd 64, window 700, from 10", 16, 1500, 6, 2, 64, 700, true, 10},
      {"compacted chunk 16, MHA, hd 16, window 8, from 3", 16, 1500, 4, 4, 16, 8, true, 3},
      {"Mistral decode, GQA 4, hd 128, window 4096", 1, 4100, 32, 8, 128, 4096, false, 0},
      {"Mistral chunk 128 (one split), hd 128, from 64", 128, 600, 32, 8, 128, 0, false, 64},
      {"chunk 64, GQA 4, hd 64, len 3000, from 0", 64, 3000, 32, 8, 64, 0, false, 0},
      {"hd 80 (padded to 128), GQA 2, from 1", 3, 777, 4, 2, 80, 0, false, 1},
      {"short cache shorter than a tile", 5, 5, 3, 1, 64, 0, false, 2},
      {"unaligned K/V (scalar loads), from 2", 4, 500, 4, 2, 64, 0, false, 2, 1},
      // The CPU sums 32k exponentials one by one: its partition sum alone is off by ~1e-5.
      {"decode at 32k, GQA 4, hd 64", 1, 32768, 8, 2, 64, 0, false, 0, 0, 1e-4f},
      {"decode, GQA 8, hd 128, window 1000", 1, 5000, 16, 2, 128, 1000, false, 0},
      {"decode, GQA 6 (8 wide), hd 64, compacted", 1, 3000, 12, 2, 64, 0, true, 0},
      {"decode, len 3, MHA, hd 64", 1, 3, 2, 2, 64, 0, false, 0},
      {"decode, GQA 3, hd 18 (padded, scalar combine)", 1, 3000, 6, 2, 18, 0, false, 0},
  };
  for (const auto& c : cases) check_attention_stats(c);
}

TEST_CASE("cuda attention over a bf16 cache matches the CPU's, statistics included") {
  // The 16-byte (8 x bf16) tile loads at hd 64 and 128, the scalar loads of the padded and the
  // unaligned variants, the split path with its combine, compacted positions, unobserved rows.
  const StatsCase cases[] = {
      {"Mistral decode, GQA 4, hd 128, window 4096 (split)", 1, 4100, 32, 8, 128, 4096, false, 0},
      {"decode not observed, GQA 3, hd 64", 1, 3000, 6, 2, 64, 0, false, 1},
      {"compacted chunk 16, GQA 3, hd 64, window 700, from 10", 16, 1500, 6, 2, 64, 700, true, 10},
      {"chunk 64, GQA 4, hd 64, len 3000, from 0", 64, 3000, 32, 8, 64, 0, false, 0},
      {"Mistral chunk 128 (one split), hd 128, none observed", 128, 600, 32, 8, 128, 0, false, 128},
      {"hd 80 (padded to 128), GQA 2, from 1", 3, 777, 4, 2, 80, 0, false, 1},
      {"hd 16 (padded), MHA, window 100, from 5", 16, 2000, 4, 4, 16, 100, false, 5},
      {"short cache shorter than a tile", 5, 5, 3, 1, 64, 0, false, 2},
      {"unaligned K/V by one bf16 (scalar loads), from 2", 4, 500, 4, 2, 64, 0, false, 2, 1},
      // The one-query (decode) kernel on bf16 rows (8 lanes a key at hd 64, 16 at 128).
      {"decode, GQA 8, hd 64, observed", 1, 3000, 16, 2, 64, 0, false, 0},
      {"decode, MHA, hd 128, compacted, observed", 1, 2000, 4, 4, 128, 0, true, 0},
      {"decode, GQA 3 (4 wide), hd 64, window 100, observed", 1, 2000, 6, 2, 64, 100, false, 0},
      {"decode, len 9, GQA 4, hd 128, observed", 1, 9, 8, 2, 128, 0, false, 0},
      // The widest group at the widest row (the instantiation with the most registers live) and
      // a group of one at hd 64 (8 lanes a key, one head each).
      {"decode, GQA 8, hd 128, observed", 1, 3000, 16, 2, 128, 0, false, 0},
      {"decode, MHA, hd 64, observed", 1, 2000, 2, 2, 64, 0, false, 0},
  };
  for (const auto& c : cases) check_attention_stats<dc::bf16>(c);
}

TEST_CASE("cuda attention statistics of queries that see no key are zero, like the CPU") {
  Gpu ctx;
  const int len = 40, n = 3, hd = 64, heads = 2;
  const dc::AttentionShape s{heads, 1, hd, 4, 0.125f, len};
  const int rows = dc::stat_rows_per_kv_head(heads);  // one KV head
  std::vector<std::int32_t> key_pos(len);
  for (int j = 0; j < len; ++j) key_pos[std::size_t(j)] = 100 + j;
  // Before every key; past every window; sees the last 4 keys (and is the last query).
  const std::vector<std::int32_t> query_pos{5, 300, 139};
  const auto q = random_vector(std::size_t(n) * heads * hd, 90);
  const auto kc = random_vector(std::size_t(len) * hd, 91);
  const auto vc = random_vector(kc.size(), 92);
  const auto base = uniform_vector(std::size_t(rows) * len, 93, 1.0f);
  std::vector<float> want(q.size()), want_stats = base;
  dc::attention(kCpu, want.data(), q.data(), kc.data(), vc.data(), key_pos.data(), len,
                query_pos.data(), n, s, dc::AttentionStats{want_stats.data(), 0});
  auto q_d = upload(ctx, q);
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto kp_d = upload(ctx, key_pos);
  auto qp_d = upload(ctx, query_pos);
  auto stats_d = upload(ctx, base);
  dc::Tensor<float, dc::cuda> out_d(dc::Shape{std::int64_t(q.size())});
  dc::attention(ctx, out_d.data(), q_d.data(), kc_d.data(), vc_d.data(), kp_d.data(), len,
                qp_d.data(), n, s, dc::AttentionStats{stats_d.data(), 0});
  CHECK(normalised_error(download(ctx, out_d), want) < 2e-5f);
  check_stats_block(download(ctx, stats_d), want_stats, rows, rows, len, 2e-5f, &base);
}

TEST_CASE("cuda attention statistics on a cache compacted by kv_compact") {
  // Write 400 tokens with kv_write (statistics on), accumulate a prefill chunk, compact to a
  // random keep-set on both backends, then accumulate a decode step over the compacted slots.
  Gpu ctx;
  const int heads = 8, kv_heads = 2, hd = 64, cap = 512, len = 400;
  const dc::AttentionShape s{heads, kv_heads, hd, 0, 0.125f, cap};
  const int per_head = dc::stat_rows_per_kv_head(heads / kv_heads), rows = kv_heads * per_head;
  const auto k = random_vector(std::size_t(len) * kv_heads * hd, 120, 1.5f);
  const auto v = random_vector(k.size(), 121);
  const auto q = random_vector(std::size_t(len) * heads * hd, 122, 1.5f);
  std::vector<std::int32_t> pos(std::size_t(kv_heads) * cap, 0);  // [kv_heads, cap]
  for (int h = 0; h < kv_heads; ++h)
    for (int j = 0; j < len; ++j) pos[std::size_t(h) * cap + j] = j;

  std::vector<float> kc(std::size_t(kv_heads) * cap * hd, 0.0f), vc = kc;
  std::vector<float> st(std::size_t(rows) * cap, 0.0f);
  auto kc_d = upload(ctx, kc);
  auto vc_d = upload(ctx, vc);
  auto st_d = upload(ctx, st);
  auto k_d = upload(ctx, k);
  auto v_d = upload(ctx, v);
  auto q_d = upload(ctx, q);
  auto pos_d = upload(ctx, pos);
  dc::kv_write(kCpu, kc.data(), vc.data(), k.data(), v.data(), len, 0, s, st.data());
  dc::kv_write(ctx, kc_d.data(), vc_d.data(), k_d.data(), v_d.data(), len, 0, s, st_d.data());

  // Prefill: the last 64 of 400 queries, observed from the 32nd of them.
  const int n = 64, t0 = len - n;
  std::vector<float> out(std::size_t(n) * heads * hd);
  dc::Tensor<float, dc::cuda> out_d(dc::Shape{std::int64_t(out.size())});
  dc::attention(kCpu, out.data(), q.data() + std::size_t(t0) * heads * hd, kc.data(), vc.data(),
                pos.data(), len, pos.data() + t0, n, s, dc::AttentionStats{st.data(), 32});
  dc::attention(ctx, out_d.data(), q_d.data() + std::size_t(t0) * heads * hd, kc_d.data(),
                vc_d.data(), pos_d.data(), len, pos_d.data() + t0, n, s,
                dc::AttentionStats{st_d.data(), 32});
  CHECK(normalised_error(download(ctx, out_d), out) < 2e-5f);
  check_stats_block(download(ctx, st_d), st, rows, per_head, cap, 2e-5f);

  // Compact both to per-head keep-sets of 160 slots (the GPU's statistics stay on the GPU); each
  // head keeps the decoding query's own slot (the last).
  const int m = 160;
  std::vector<std::int32_t> keep = per_head_keep(kv_heads, len - 1, m - 1, 9);
  for (int h = kv_heads - 1; h >= 0; --h) keep.insert(keep.begin() + std::ptrdiff_t(h + 1) * (m - 1), len - 1);
  dc::kv_compact(kCpu, kc.data(), vc.data(), st.data(), kv_heads, hd, per_head, cap, keep, m);
  dc::kv_compact(ctx, kc_d.data(), vc_d.data(), st_d.data(), kv_heads, hd, per_head, cap, keep, m);
  std::vector<std::int32_t> kept_pos(std::size_t(kv_heads) * cap, 0);  // [kv_heads, cap]
  for (int h = 0; h < kv_heads; ++h)
    for (int i = 0; i < m; ++i) kept_pos[std::size_t(h) * cap + i] = keep[std::size_t(h) * m + i];
  auto kept_pos_d = upload(ctx, kept_pos);
  CHECK(download(ctx, kc_d) == kc);
  CHECK(download(ctx, vc_d) == vc);
  check_stats_block(download(ctx, st_d), st, rows, per_head, cap, 2e-5f);

  // Decode over the compacted cache: query = the last token, at its original position.
  std::vector<float> out1(std::size_t(heads) * hd);
  const float* q_last = q.data() + std::size_t(len - 1) * heads * hd;
  const auto before = download(ctx, st_d);
  dc::attention(kCpu, out1.data(), q_last, kc.data(), vc.data(), kept_pos.data(), m,
                kept_pos.data() + m - 1, 1, s, dc::AttentionStats{st.data(), 0});
  dc::attention(ctx, out_d.data(), q_d.data() + std::size_t(len - 1) * heads * hd, kc_d.data(),
                vc_d.data(), kept_pos_d.data(), m, kept_pos_d.data() + m - 1, 1, s,
                dc::AttentionStats{st_d.data(), 0});
  CHECK(normalised_error(download(ctx, out_d.data(), out1.size()), out1) < 2e-5f);
  check_stats_block(download(ctx, st_d), st, rows, per_head, cap, 2e-5f, &before);
}

// ---- end to end --------------------------------------------------------------------------------

namespace {

dc::ModelConfig eviction_config(int window) {
  dc::ModelConfig c = tiny_config();
  c.sliding_window = window;
  return c;
}

void check_caches(const Gpu& ctx, const dc::KVCache<dc::cpu>& cpu, const dc::KVCache<dc::cuda>& gpu,
                  float tolerance) {
  REQUIRE(cpu.num_layers() == gpu.num_layers());
  const int per_head = cpu.stat_rows(), rows = cpu.num_kv_heads() * per_head;
  for (int l = 0; l < cpu.num_layers(); ++l) {
    CAPTURE(l);
    const int cap = cpu.capacity(l);
    REQUIRE(gpu.capacity(l) == cap);
    const int len = cpu.length(l);
    REQUIRE(gpu.length(l) == len);
    const int kv_heads = cpu.num_kv_heads();
    for (int h = 0; h < kv_heads; ++h) {
      CHECK(gpu.host_positions(l, h) == cpu.host_positions(l, h));
      const auto pos = download(ctx, gpu.positions(l) + std::size_t(h) * cap, std::size_t(len));
      CHECK(std::equal(pos.begin(), pos.end(), cpu.positions(l) + std::size_t(h) * cap));
    }
    // K/V of the used slots of every head (slots never written hold uninitialised memory).
    const std::size_t hd = std::size_t(cpu.head_dim());
    const std::size_t kv = std::size_t(cpu.num_kv_heads()) * cap * hd;
    const auto keys = download(ctx, gpu.keys(l), kv), values = download(ctx, gpu.values(l), kv);
    for (int h = 0; h < cpu.num_kv_heads(); ++h) {
      const std::size_t at = std::size_t(h) * cap * hd, used = std::size_t(len) * hd;
      CHECK(normalised_error(std::span(keys.data() + at, used), std::span(cpu.keys(l) + at, used)) <
            tolerance);
      CHECK(normalised_error(std::span(values.data() + at, used),
                             std::span(cpu.values(l) + at, used)) < tolerance);
    }
    const std::size_t block = std::size_t(rows) * cap;
    check_stats_block(download(ctx, gpu.stats(l), block),
                      std::vector<float>(cpu.stats(l), cpu.stats(l) + block), rows, per_head, cap,
                      tolerance);
  }
}

// Prefill 20 tokens (calls of 13 and 7; statistics observed from position 10, so the first chunk
// is observed from its 11th query), 5 decode steps, compaction, 5 more decode steps, per-layer
// compaction, 3 more decode steps: logits, positions, K/V and every statistics block compared
// after each call.
void check_transformer_with_eviction(int window, bool capacity_per_layer = false) {
  CAPTURE(window);
  CAPTURE(capacity_per_layer);
  const dc::ModelConfig cfg = eviction_config(window);
  constexpr unsigned kSeed = 4321;
  constexpr float kTolerance = 1e-4f;
  dc::Transformer<dc::cpu> reference(cfg, random_weights(cfg, kSeed, false), 16);
  dc::Weights<dc::cuda, float> device_weights;
  {
    Gpu upload_ctx;
    device_weights = dc::upload_weights<float>(random_weights(cfg, kSeed, false), upload_ctx);
  }
  dc::Transformer<dc::cuda, float> model(cfg, std::move(device_weights), 16);
  const Gpu& ctx = model.context();

  std::mt19937 rng(11);
  std::uniform_int_distribution<std::int32_t> token(0, cfg.vocab_size - 1);
  std::vector<std::int32_t> tokens(40);
  for (auto& t : tokens) t = token(rng);
  const std::span<const std::int32_t> all(tokens);

  // Capacities per layer: every layer's rows at its own stride (the most this test fills is 30).
  // The smaller layer first, so that a wrong stride reads wrong values, not past an allocation.
  std::vector<int> capacities(std::size_t(cfg.num_layers), 64);
  if (capacity_per_layer)
    for (std::size_t l = 0; l < capacities.size(); l += 2) capacities[l] = 41;
  auto cache_cpu = reference.make_cache(std::span<const int>(capacities));
  auto cache_gpu = model.make_cache(std::span<const int>(capacities));
  cache_cpu.set_observed_from(10);
  cache_gpu.set_observed_from(10);
  int next = 0;
  auto step = [&](int count, dc::LogitsFor which) {
    CAPTURE(next);
    const auto chunk = all.subspan(std::size_t(next), std::size_t(count));
    const auto want = reference.forward(chunk, cache_cpu, which);
    const auto got = model.forward(chunk, cache_gpu, which);
    next += count;
    CHECK(normalised_error(got, want) < kTolerance);
    check_caches(ctx, cache_cpu, cache_gpu, kTolerance);
  };
  step(13, dc::LogitsFor::all);
  step(7, dc::LogitsFor::all);
  for (int i = 0; i < 5; ++i) step(1, dc::LogitsFor::last);
  REQUIRE(cache_gpu.length() == 25);

  // Shared keep-set: drop a third of the slots, keep the newest.
  std::vector<std::int32_t> keep;
  for (int i = 0; i < 25; ++i)
    if (i % 3 != 1 || i >= 22) keep.push_back(i);
  cache_cpu.compact(kCpu, keep);
  cache_gpu.compact(ctx, keep);
  check_caches(ctx, cache_cpu, cache_gpu, kTolerance);
  for (int i = 0; i < 5; ++i) step(1, dc::LogitsFor::last);

  // Per-layer keep-sets: layers of different lengths.
  const int len = cache_gpu.length(0);
  const std::vector<std::int32_t> keep0 = iota_keep(len - 8, len);  // a recent window
  std::vector<std::int32_t> keep1;
  for (int i = 0; i < len; ++i)
    if (i % 2 == 0 || i == len - 1) keep1.push_back(i);
  cache_cpu.compact_layer(kCpu, 0, keep0);
  cache_gpu.compact_layer(ctx, 0, keep0);
  cache_cpu.compact_layer(kCpu, 1, keep1);
  cache_gpu.compact_layer(ctx, 1, keep1);
  check_caches(ctx, cache_cpu, cache_gpu, kTolerance);
  for (int i = 0; i < 3; ++i) step(1, dc::LogitsFor::last);

  // Per-head keep-sets: every KV head of layer 1 keeps its own 6 of its slots (the newest too).
  const int len1 = cache_gpu.length(1);
  std::vector<std::int32_t> heads_keep;
  for (int h = 0; h < cfg.num_kv_heads; ++h) {
    auto k = per_head_keep(1, len1 - 1, 5, 30u + unsigned(h));
    k.push_back(len1 - 1);
    heads_keep.insert(heads_keep.end(), k.begin(), k.end());
  }
  cache_cpu.compact_heads(kCpu, 1, heads_keep);
  cache_gpu.compact_heads(ctx, 1, heads_keep);
  check_caches(ctx, cache_cpu, cache_gpu, kTolerance);
  for (int i = 0; i < 2; ++i) step(1, dc::LogitsFor::last);
  // A two-token chunk, all observed, over the compacted layers.
  step(2, dc::LogitsFor::all);
}

}  // namespace

TEST_CASE("Transformer<cuda, float> matches Transformer<cpu> with statistics and compaction") {
  SUBCASE("sliding window 8") { check_transformer_with_eviction(8); }
  SUBCASE("no window") { check_transformer_with_eviction(0); }
  SUBCASE("no window, a capacity per layer") { check_transformer_with_eviction(0, true); }
}

// ---- eviction in place (decode/in_place_eviction.cuh) ---------------------------------------------------------

namespace {

// Random fp32 weights for cfg on the device (uploaded on a context of their own).
dc::Weights<dc::cuda, float> device_weights(const dc::ModelConfig& cfg, unsigned seed) {
  Gpu upload_ctx;
  return dc::upload_weights<float>(random_weights(cfg, seed, false), upload_ctx);
}

// Bit-identical caches: positions (host mirror and device), the used slots' K/V (bytes of the
// storage type) and every statistics row of them.
void check_same_cache(const Gpu& ctx, const dc::KVCache<dc::cuda>& a, const dc::KVCache<dc::cuda>& b) {
  const int hd = a.head_dim(), rows = a.stat_rows();
  REQUIRE(a.kv_type() == b.kv_type());
  for (int l = 0; l < a.num_layers(); ++l) {
    CAPTURE(l);
    const std::size_t cap_a = std::size_t(a.capacity(l)), cap_b = std::size_t(b.capacity(l));  // strides may differ
    const int len = a.length(l);
    REQUIRE(b.length(l) == len);
    for (int h = 0; h < a.num_kv_heads(); ++h) {
      CAPTURE(h);
      CHECK(a.host_positions(l, h) == b.host_positions(l, h));
      const std::size_t head_a = std::size_t(h) * cap_a, head_b = std::size_t(h) * cap_b;
      const auto positions = download(ctx, a.positions(l) + head_a, std::size_t(len));
      CHECK(positions == download(ctx, b.positions(l) + head_b, std::size_t(len)));
      CHECK(positions == a.host_positions(l, h));
      const std::size_t kv_a = head_a * hd, kv_b = head_b * hd, used = std::size_t(len) * hd;
      a.with_kv(l, [&](const auto* ka, const auto* va) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(ka)>>;
        if constexpr (std::is_same_v<T, float>) {
          CHECK(download(ctx, ka + kv_a, used) == download(ctx, b.keys(l) + kv_b, used));
          CHECK(download(ctx, va + kv_a, used) == download(ctx, b.values(l) + kv_b, used));
        } else {
          const auto bits = [&](const dc::bf16* p) {
            std::vector<std::uint16_t> out;
            for (const dc::bf16& x : download(ctx, p, used)) out.push_back(x.bits);
            return out;
          };
          CHECK(bits(ka + kv_a) == bits(b.keys_as<dc::bf16>(l) + kv_b));
          CHECK(bits(va + kv_a) == bits(b.values_as<dc::bf16>(l) + kv_b));
        }
      });
      for (int r = 0; r < rows; ++r)
        CHECK(download(ctx, a.stats(l) + (std::size_t(h) * rows + r) * cap_a, std::size_t(len)) ==
              download(ctx, b.stats(l) + (std::size_t(h) * rows + r) * cap_b, std::size_t(len)));
    }
  }
}

// Two decoders of one model and policy rule, one evicting on the device and one through the
// host features (the path every policy takes, itself tested against the CPU above): the same
// prompt compression and decode-time evictions must give the same keep-sets, so the same caches
// bit for bit and the same logits, step after step.
void check_in_place_eviction(double recent_fraction, dc::DType kv_type) {
  CAPTURE(recent_fraction);
  CAPTURE(dc::dtype_name(kv_type));
  const dc::ModelConfig cfg = eviction_config(0);
  dc::Transformer<dc::cuda, float> model(cfg, device_weights(cfg, 99), 16);
  model.set_kv_type(kv_type);
  dc::H2OPolicy device_policy(recent_fraction), host_policy(recent_fraction);
  dc::Budget budget = dc::Budget::of_tokens(12);
  budget.chunk = 8;
  constexpr int kPrompt = 40, kSteps = 30;
  dc::EvictingDecoder<dc::cuda, float> on_device(model, device_policy, budget, dc::EvictionMode::decode, kPrompt,
                                                 kSteps, dc::Granularity::head);
  dc::EvictingDecoder<dc::cuda, float> on_host(model, host_policy, budget, dc::EvictionMode::decode, kPrompt,
                                               kSteps, dc::Granularity::head);
  on_host.set_in_place_eviction(false);

  std::mt19937 rng(5);
  std::uniform_int_distribution<std::int32_t> token(0, cfg.vocab_size - 1);
  std::vector<std::int32_t> prompt(kPrompt);
  for (auto& t : prompt) t = token(rng);
  const auto device_first = on_device.prefill(prompt);
  const std::vector<float> first(device_first.begin(), device_first.end());
  const auto host_first = on_host.prefill(prompt);
  CHECK(first == std::vector<float>(host_first.begin(), host_first.end()));
  CHECK(on_device.in_place_evictions() == 1);  // the prompt's compression
  CHECK(on_host.in_place_evictions() == 0);
  REQUIRE(on_device.cache().length() == 12);
  check_same_cache(model.context(), on_device.cache(), on_host.cache());
  for (int i = 0; i < kSteps; ++i) {
    CAPTURE(i);
    const std::int32_t t = token(rng);
    const auto device_logits = on_device.step(t);
    const std::vector<float> got(device_logits.begin(), device_logits.end());
    const auto host_logits = on_host.step(t);
    CHECK(got == std::vector<float>(host_logits.begin(), host_logits.end()));
    check_same_cache(model.context(), on_device.cache(), on_host.cache());
  }
  CHECK(on_device.evictions() == 4);  // the prompt, then every 8 steps: at 8, 16 and 24
  CHECK(on_host.evictions() == 4);
  CHECK(on_device.in_place_evictions() == 4);
}

}  // namespace

TEST_CASE("EvictingDecoder<cuda> with H2O evicts on the device: the host path's caches, bit for bit") {
  SUBCASE("half the budget recent, fp32 cache") { check_in_place_eviction(0.5, dc::DType::f32); }
  SUBCASE("no recent window, fp32 cache") { check_in_place_eviction(0.0, dc::DType::f32); }
  SUBCASE("half the budget recent, bf16 cache") { check_in_place_eviction(0.5, dc::DType::bf16); }
}

TEST_CASE("evict_in_place on a cache with a capacity per layer: the uniform cache's keep-sets and logits, bit for bit") {
  const dc::ModelConfig cfg = eviction_config(0);
  dc::Transformer<dc::cuda, float> model(cfg, device_weights(cfg, 99), 16);
  const Gpu& ctx = model.context();
  std::vector<int> capacities(std::size_t(cfg.num_layers), 64);
  for (std::size_t l = 0; l < capacities.size(); l += 2) capacities[l] = 45;
  auto uniform = model.make_cache(64);
  auto uneven = model.make_cache(std::span<const int>(capacities));
  uniform.set_observed_from(0);
  uneven.set_observed_from(0);
  std::vector<std::int32_t> prompt(40);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t((11 * i + 5) % 256);
  model.forward(prompt, uniform);
  model.forward(prompt, uneven);
  dc::H2OPolicy h2o(0.5);
  const auto rule = h2o.score_rule(12);
  REQUIRE(rule.has_value());
  dc::InPlaceEvictionScratch<dc::cuda> scratch_uniform, scratch_uneven;
  REQUIRE(dc::evict_in_place(ctx, uniform, *rule, 12, scratch_uniform));
  REQUIRE(dc::evict_in_place(ctx, uneven, *rule, 12, scratch_uneven));
  check_same_cache(ctx, uniform, uneven);
  for (std::int32_t t : {7, 99, 200}) {
    const std::vector<std::int32_t> next{t};
    CHECK(model.forward(next, uniform, dc::LogitsFor::last) == model.forward(next, uneven, dc::LogitsFor::last));
  }
  check_same_cache(ctx, uniform, uneven);
}

TEST_CASE("EvictingDecoder<cuda> evicts through the host where the in-place path does not apply") {
  const dc::ModelConfig cfg = eviction_config(0);
  dc::Transformer<dc::cuda, float> model(cfg, device_weights(cfg, 99), 16);
  dc::H2OPolicy h2o;
  dc::Budget with_sinks = dc::Budget::of_tokens(12);
  with_sinks.sink = 2;  // protected slots: the rule does not cover them
  std::vector<std::int32_t> prompt(30);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t((7 * i + 3) % 256);
  dc::EvictingDecoder<dc::cuda, float> sinks(model, h2o, with_sinks, dc::EvictionMode::prefill, 30, 4,
                                             dc::Granularity::head);
  sinks.prefill(prompt);
  CHECK(sinks.evictions() == 1);
  CHECK(sinks.in_place_evictions() == 0);
  dc::EvictingDecoder<dc::cuda, float> per_layer(model, h2o, dc::Budget::of_tokens(12), dc::EvictionMode::prefill,
                                                 30, 4, dc::Granularity::layer);
  per_layer.prefill(prompt);
  CHECK(per_layer.evictions() == 1);
  CHECK(per_layer.in_place_evictions() == 0);
}
