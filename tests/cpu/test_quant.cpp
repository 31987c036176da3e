// Block-quantized weights on the CPU (math/quant_blocks.hpp, cpu/quant_dot.hpp,
// cpu/quant_matmul.hpp, load_gguf_quantized_weights): the quantizers against the reference
// `gguf` package's blocks, the integer kernels against each other and against the dequantizer,
// the matmul against a double-precision product, and whole models against fp32 and each other.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../support/random.hpp"
#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf.hpp>
#include <distillcache/io/gguf_dequant.hpp>
#include <distillcache/io/gguf_model.hpp>
#include <distillcache/io/hf_checkpoint.hpp>

namespace {

const std::string kFixtures = DC_FIXTURE_DIR;
constexpr dc::QuantFormat kFormats[] = {dc::QuantFormat::q8_0, dc::QuantFormat::q4_0, dc::QuantFormat::q4_1};
constexpr dc::QuantKernel kKernels[] = {dc::QuantKernel::portable, dc::QuantKernel::avx2,
                                        dc::QuantKernel::avx512_vnni};

dc::Tensor<float, dc::cpu> matrix(int rows, int cols, const std::vector<float>& values) {
  dc::Tensor<float, dc::cpu> t(dc::Shape{rows, cols});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

// Random blocks of format f: every byte random, scales finite fp16 (a Q8_0 block may hold -128).
std::vector<std::uint8_t> random_blocks(dc::QuantFormat f, int blocks, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> out(std::size_t(blocks) * dc::quant_block_bytes(f));
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int b = 0; b < blocks; ++b) {
    std::uint8_t* block = out.data() + std::size_t(b) * dc::quant_block_bytes(f);
    dc::math::store_half(block, normal(rng));
    if (f == dc::QuantFormat::q4_1) dc::math::store_half(block + 2, normal(rng));
  }
  return out;
}

std::vector<dc::ActivationBlock> random_activations(int blocks, unsigned seed) {
  std::vector<float> x = dc_test::random_vector(std::size_t(blocks) * dc::kQuantBlock, seed, 2.0f);
  std::vector<dc::ActivationBlock> a(static_cast<std::size_t>(blocks));
  dc::quantize_activations(x.data(), 1, blocks * dc::kQuantBlock, a.data());
  return a;
}

}  // namespace

TEST_CASE("requantizing the reference package's Q8_0/Q4_0/Q4_1 blocks gives the same bytes") {
  // tools/make_gguf_fixtures.py quantized random data with gguf.quants (ggml's reference rules),
  // including an all-zero block and a constant one; our quantizer on the decoded values must
  // reproduce every stored byte.
  for (dc::QuantFormat f : kFormats) {
    const std::string name(dc::quant_format_name(f));
    CAPTURE(name);
    const dc::GgufFile file(kFixtures + "/gguf/types_" + name + ".gguf");
    for (const auto& info : file.tensors()) {
      CAPTURE(info.name);
      REQUIRE(info.type == dc::quant_format_ggml_id(f));
      const dc::Tensor<float, dc::cpu> values = file.read_tensor(info);
      const std::int64_t cols = values.shape()[values.shape().rank - 1];
      const std::int64_t rows = values.numel() / cols;
      const auto q = dc::QuantizedMatrix::quantize(
          f, matrix(int(rows), int(cols), std::vector<float>(values.data(), values.data() + values.numel())));
      const std::vector<std::uint8_t> raw = file.read_raw(info);
      REQUIRE(q.bytes() == raw.size());
      CHECK(std::memcmp(q.row(0), raw.data(), raw.size()) == 0);
      // And decoding our matrix gives the reference's values back.
      std::vector<float> row(static_cast<std::size_t>(cols));
      for (std::int64_t r = 0; r < rows; ++r) {
        q.dequantize_row(r, row.data());
        CHECK(std::memcmp(row.data(), values.data() + r * cols, row.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("activation blocks: half a step of error, exact integer sums, zero blocks") {
  const std::vector<float> x = dc_test::random_vector(4 * dc::kQuantBlock, 7, 3.0f);
  for (int b = 0; b < 4; ++b) {
    const dc::ActivationBlock a = dc::math::quantize_activation_block(x.data() + b * dc::kQuantBlock);
    float amax = 0.0f;
    std::int32_t sum = 0;
    for (int i = 0; i < dc::kQuantBlock; ++i) {
      amax = std::max(amax, std::fabs(x[std::size_t(b * dc::kQuantBlock + i)]));
      sum += a.q[i];
      CHECK(std::fabs(x[std::size_t(b * dc::kQuantBlock + i)] - a.d * float(a.q[i])) <= a.d * 0.5001f);
      CHECK(std::abs(int(a.q[i])) <= 127);
    }
    CHECK(a.d == amax / 127.0f);
    CHECK(a.sum == sum);
  }
  const float zeros[dc::kQuantBlock] = {};
  const dc::ActivationBlock z = dc::math::quantize_activation_block(zeros);
  CHECK(z.d == 0.0f);
  CHECK(z.sum == 0);
  // A non-finite activation poisons its block's products (NaN, as fp32 would), not silently.
  float bad[dc::kQuantBlock] = {};
  bad[5] = NAN;
  CHECK(std::isnan(dc::math::quantize_activation_block(bad).d));
  bad[5] = INFINITY;
  CHECK(std::isnan(dc::math::quantize_activation_block(bad).d));
}

TEST_CASE("every integer kernel gives the portable sums, which match the dequantized blocks") {
  constexpr int kBlocks = 150;  // more than one pass of quant_rows_dot's 64-block chunks
  constexpr int kRows = 3;      // activation rows sharing each unpacked weight block
  for (dc::QuantFormat f : kFormats) {
    CAPTURE(dc::quant_format_name(f));
    const auto w = random_blocks(f, kBlocks, 11 + unsigned(f));
    const auto a = random_activations(kRows * kBlocks, 23 + unsigned(f));  // row r: a[r * kBlocks...]
    std::vector<std::int32_t> expected(kRows * kBlocks);
    dc::quant_block_sums(dc::QuantKernel::portable, f, w.data(), a.data(), kBlocks, kRows, kBlocks,
                         expected.data());
    for (dc::QuantKernel k : kKernels) {
      CAPTURE(dc::quant_kernel_name(k));
      if (!dc::quant_kernel_available(k)) {
        MESSAGE("kernel ", dc::quant_kernel_name(k), " not available on this CPU/build: skipped");
        continue;
      }
      for (int rows = 1; rows <= kRows; ++rows) {
        CAPTURE(rows);
        std::vector<std::int32_t> sums(std::size_t(rows) * kBlocks, -1);
        dc::quant_block_sums(k, f, w.data(), a.data(), kBlocks, rows, kBlocks, sums.data());
        CHECK(std::equal(sums.begin(), sums.end(), expected.begin()));
      }
    }
    // Each block's combined float against the dequantizer of io/ (a different decoding of the
    // same bytes) times the activations' decoded values, in double.
    for (int b = 0; b < kBlocks; ++b) {
      const std::uint8_t* block = w.data() + std::size_t(b) * dc::quant_block_bytes(f);
      float wv[dc::kQuantBlock];
      dc::dequantize(dc::quant_format_ggml_id(f), block, wv, dc::kQuantBlock);
      double ref = 0.0, scale = 0.0;
      for (int i = 0; i < dc::kQuantBlock; ++i) {
        const double term = double(wv[i]) * double(a[std::size_t(b)].d) * double(a[std::size_t(b)].q[i]);
        ref += term;
        scale += std::fabs(term);
      }
      const float got = dc::math::combine_block(f, block, a[std::size_t(b)], expected[std::size_t(b)]);
      CHECK(std::fabs(double(got) - ref) <= 1e-5 * scale + 1e-12);
    }
  }
}

TEST_CASE("quantized matmul: the double product of the decoded operands; rows independent") {
  constexpr int kIn = 96, kOut = 37, kRows = 5;
  const auto w = dc_test::random_vector(kOut * kIn, 3, 0.1f);
  const auto x = dc_test::random_vector(kRows * kIn, 4, 1.0f);
  dc::Context<dc::cpu> ctx;
  for (dc::QuantFormat f : kFormats) {
    CAPTURE(dc::quant_format_name(f));
    const auto q = dc::QuantizedMatrix::quantize(f, matrix(kOut, kIn, w));
    std::vector<float> y(kRows * kOut);
    dc::matmul(ctx, y.data(), x.data(), q, kRows, kIn, kOut);

    std::vector<dc::ActivationBlock> a(kRows * kIn / dc::kQuantBlock);
    dc::quantize_activations(x.data(), kRows, kIn, a.data());
    std::vector<float> wrow(kIn);
    for (int o = 0; o < kOut; ++o) {
      q.dequantize_row(o, wrow.data());
      for (int r = 0; r < kRows; ++r) {
        double ref = 0.0, scale = 0.0, exact = 0.0, bound = 0.0;
        for (int i = 0; i < kIn; ++i) {
          const dc::ActivationBlock& blk = a[std::size_t(r * kIn / dc::kQuantBlock + i / dc::kQuantBlock)];
          const double xq = double(blk.d) * blk.q[i % dc::kQuantBlock];
          ref += double(wrow[std::size_t(i)]) * xq;
          scale += std::fabs(double(wrow[std::size_t(i)]) * xq);
          exact += double(wrow[std::size_t(i)]) * x[std::size_t(r * kIn + i)];
          bound += std::fabs(double(wrow[std::size_t(i)])) * blk.d * 0.5;  // activation rounding
        }
        const float got = y[std::size_t(r * kOut + o)];
        CHECK(std::fabs(double(got) - ref) <= 1e-5 * scale + 1e-9);
        // Against the unquantized activations: within the activations' rounding error.
        CHECK(std::fabs(double(got) - exact) <= bound * 1.001 + 1e-5 * scale);
      }
    }
    // A row multiplied alone is bitwise the same row of the batch, and accumulate adds.
    for (int r = 0; r < kRows; ++r) {
      std::vector<float> alone(kOut);
      dc::matmul(ctx, alone.data(), x.data() + r * kIn, q, 1, kIn, kOut);
      CHECK(std::memcmp(alone.data(), y.data() + r * kOut, kOut * sizeof(float)) == 0);
    }
    std::vector<float> acc(kRows * kOut, 1.0f);
    dc::matmul(ctx, acc.data(), x.data(), q, kRows, kIn, kOut, /*accumulate=*/true);
    for (std::size_t i = 0; i < acc.size(); ++i) CHECK(acc[i] == 1.0f + y[i]);
  }
}

TEST_CASE("quantized matrices refuse shapes that are not whole blocks, and mismatched products") {
  CHECK_THROWS_WITH_AS(dc::QuantizedMatrix(dc::QuantFormat::q4_1, 4, 40),
                       doctest::Contains("40 columns are not a whole number of blocks of 32"), dc::Error);
  std::vector<float> with_nan(64, 0.5f);
  with_nan[40] = NAN;
  CHECK_THROWS_WITH_AS(dc::QuantizedMatrix::quantize(dc::QuantFormat::q4_0, matrix(1, 64, with_nan)),
                       doctest::Contains("quantize: the matrix: entry 40 is NaN"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_quant_format("q5_1"), doctest::Contains("unknown quantized format 'q5_1'"),
                       dc::Error);
  const dc::QuantizedMatrix q(dc::QuantFormat::q8_0, 4, 64);
  std::vector<float> x(64), y(8);
  dc::Context<dc::cpu> ctx;
  CHECK_THROWS_WITH_AS(dc::matmul(ctx, y.data(), x.data(), q, 1, 32, 4),
                       doctest::Contains("weight [4, 64], expected [4, 32]"), dc::Error);
}

TEST_CASE("a quantized model's logits stay near fp32's; Q8_0 nearer than the 4-bit formats") {
  const dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  const std::vector<std::int32_t> tokens = {1, 17, 200, 3, 45, 99, 120, 7, 8, 255, 31, 64};
  const int vocab = m.config.vocab_size;
  auto run = [&](auto transformer) {
    auto cache = transformer.make_cache(32);
    std::vector<float> logits(tokens.size() * std::size_t(vocab));
    transformer.forward(tokens, cache, logits, dc::LogitsFor::all);
    return logits;
  };
  const auto reference = run(dc::Transformer<dc::cpu>(m.config, dc::convert_host_weights<float>(m.weights)));
  double previous_kl = 0.0;
  for (dc::QuantFormat f : kFormats) {
    CAPTURE(dc::quant_format_name(f));
    const auto got = run(dc::Transformer<dc::cpu, dc::quantized>(m.config, dc::quantize_host_weights(m.weights, f)));
    // Mean KL(fp32 || quantized) over the positions, by the library's KL formula.
    std::vector<double> per_position(tokens.size());
    dc::kl_rows_reference(dc::Context<dc::cpu>{}, reference.data(), got.data(), int(tokens.size()), vocab,
                          per_position.data());
    double kl = 0.0;
    for (double v : per_position) kl += v / double(tokens.size());
    MESSAGE(dc::quant_format_name(f), ": mean KL to fp32 ", kl);
    CHECK(kl > 0.0);  // quantization does change something
    CHECK(kl < (f == dc::QuantFormat::q8_0 ? 1e-3 : 2e-2));
    if (f == dc::QuantFormat::q8_0) previous_kl = kl;
    else CHECK(kl > previous_kl);  // 4 bits lose more than 8
  }
}

TEST_CASE("the GGUF loader's kept blocks: a BF16 file re-quantized to Q8_0 equals quantizing its fp32 weights") {
  // tiny_llama_tied.gguf stores BF16, so the loader re-quantizes every matrix to Q8_0 after
  // un-permuting Q/K rows; quantize_host_weights un-permutes first (the fp32 loader) and then
  // quantizes. Rows are quantized independently, so the two orders must give the same bits.
  const dc::GgufFile file(kFixtures + "/gguf/tiny_llama_tied.gguf");
  const dc::HfModel fp32 = dc::load_gguf_model(file);
  auto kept = dc::load_gguf_quantized_weights(file, fp32.config);
  auto requantized = dc::quantize_host_weights(fp32.weights, dc::QuantFormat::q8_0);
  auto same = [](const dc::QuantizedMatrix& a, const dc::QuantizedMatrix& b) {
    return a.format() == b.format() && a.shape() == b.shape() && a.bytes() == b.bytes() &&
           std::memcmp(a.row(0), b.row(0), a.bytes()) == 0;
  };
  CHECK(same(kept.embed, requantized.embed));
  CHECK(kept.lm_head.empty());  // tied
  for (std::size_t l = 0; l < kept.layers.size(); ++l) {
    CAPTURE(l);
    const auto& a = kept.layers[l];
    const auto& b = requantized.layers[l];
    CHECK(same(a.wq, b.wq));
    CHECK(same(a.wk, b.wk));
    CHECK(same(a.wv, b.wv));
    CHECK(same(a.wo, b.wo));
    CHECK(same(a.w_gate, b.w_gate));
    CHECK(same(a.w_up, b.w_up));
    CHECK(same(a.w_down, b.w_down));
    CHECK(std::memcmp(a.attn_norm.data(), b.attn_norm.data(), a.attn_norm.bytes()) == 0);
  }
}
