// The CUDA policy MLP (cuda/mlp.cuh) against its CPU oracle (cpu/mlp.hpp), by normalised error.
// Tolerance 1e-5: the same float formulas; the CPU sums a layer's inputs in tile order and the
// parameter gradient chunk by chunk, the GPU row by row and in a block tree.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <distillcache/cpu/mlp.hpp>
#include <distillcache/cuda/mlp.cuh>

#include "../support/cuda_compare.cuh"
#include "../support/random.hpp"

namespace {
const dc::Context<dc::cpu> kCpu{};
}

TEST_CASE("cuda mlp_forward and mlp_backward equal the CPU's") {
  const dc::Context<dc::cuda> gpu;
  struct Case {
    int inputs;
    std::vector<int> hidden;
    dc::Activation act;
    std::int64_t rows;
  };
  const Case cases[] = {{5, {32, 32}, dc::Activation::silu, 4099},
                        {6, {16}, dc::Activation::tanh, 77},
                        {5, {64, 8, 8}, dc::Activation::relu, 1000},
                        {6, {16, 8}, dc::Activation::relu, 2053}};  // policy v3's shape
  for (const Case& c : cases) {
    const dc::MlpLayout L(c.inputs, c.hidden, c.act);
    CAPTURE(dc::activation_name(c.act));
    const auto n = c.rows;
    const auto x = dc_test::random_vector(std::size_t(n * c.inputs), 1);
    const auto p = dc_test::random_vector(std::size_t(L.parameters()), 2, 0.3f);
    const auto ds = dc_test::random_vector(std::size_t(n), 3);
    std::vector<float> scores(static_cast<std::size_t>(n)), saved(std::size_t(n * L.saved_per_row()));
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, scores.data(), saved.data());
    std::vector<float> grad(std::size_t(L.parameters()), 0.5f);
    dc::mlp_backward(kCpu, L, p.data(), x.data(), saved.data(), ds.data(), n, grad.data());

    auto dx = dc_test::upload(gpu, x), dp = dc_test::upload(gpu, p), dds = dc_test::upload(gpu, ds);
    auto dscores = dc_test::upload(gpu, std::vector<float>(std::size_t(n)));
    auto dsaved = dc_test::upload(gpu, std::vector<float>(saved.size()));
    auto dgrad = dc_test::upload(gpu, std::vector<float>(grad.size(), 0.5f));
    auto scratch = dc_test::upload(gpu, std::vector<float>(saved.size()));
    dc::mlp_forward(gpu, L, dp.data(), dx.data(), n, dscores.data(), dsaved.data());
    dc::mlp_backward(gpu, L, dp.data(), dx.data(), dsaved.data(), dds.data(), n, dgrad.data(), scratch.data());
    CHECK(dc_test::normalised_error(dc_test::download(gpu, dscores), scores) < 1e-5f);
    CHECK(dc_test::normalised_error(dc_test::download(gpu, dsaved), saved) < 1e-5f);
    CHECK(dc_test::normalised_error(dc_test::download(gpu, dgrad), grad) < 1e-5f);
  }
}

TEST_CASE("cuda mlp refuses layouts wider than its register tiles") {
  const dc::Context<dc::cuda> gpu;
  const dc::MlpLayout wide(5, {128});
  float dummy = 0.0f;
  CHECK_THROWS_WITH_AS(dc::mlp_forward(gpu, wide, &dummy, &dummy, 1, &dummy, nullptr),
                       doctest::Contains("up to 64 units wide"), dc::Error);
}
