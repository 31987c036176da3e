// Gemma 3's CUDA ops (geglu, scale_values, add_residual, softcap; cuda/elementwise.cuh) against
// their CPU oracles, then Transformer<cuda> against Transformer<cpu> on the tiny Gemma 3 fixture
// (tests/fixtures/tiny_gemma3: sliding and global layers, window 8 < sequence, q/k norms, sandwich
// norms) and on its soft-capped variant. Tolerances as in test_cuda_ops.cu: 1e-5 normalised for
// fp32 pointwise ops (device tanhf/expf within 2 ulp of the host's), 1e-4 for the whole model.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <distillcache/distillcache.cuh>
#include <distillcache/io/hf_checkpoint.hpp>

#include "../support/cuda_compare.cuh"
#include "../support/random.hpp"

namespace {

using Gpu = dc::Context<dc::cuda>;
const dc::Context<dc::cpu> kCpu{};
using dc_test::download;
using dc_test::normalised_error;
using dc_test::random_vector;
using dc_test::upload;

constexpr std::int64_t kCount = 100003;  // not a multiple of any block size

}  // namespace

TEST_CASE("cuda scale_values and add_residual match the CPU exactly") {
  Gpu ctx;
  auto x = random_vector(std::size_t(kCount), 210);
  const auto y = random_vector(std::size_t(kCount), 211);
  auto x_d = upload(ctx, x);
  auto y_d = upload(ctx, y);
  dc::scale_values(kCpu, x.data(), 25.298221f, kCount);
  dc::scale_values(ctx, x_d.data(), 25.298221f, kCount);
  CHECK(download(ctx, x_d) == x);  // one rounded product per element on both sides
  dc::add_residual(kCpu, x.data(), y.data(), kCount);
  dc::add_residual(ctx, x_d.data(), y_d.data(), kCount);
  CHECK(download(ctx, x_d) == x);
}

TEST_CASE("cuda softcap matches the CPU") {
  Gpu ctx;
  auto x = random_vector(std::size_t(kCount), 220, 40.0f);
  auto x_d = upload(ctx, x);
  dc::softcap(kCpu, x.data(), 30.0f, kCount);
  dc::softcap(ctx, x_d.data(), 30.0f, kCount);
  CHECK(normalised_error(download(ctx, x_d), x) < 1e-5f);
}

// Prefill 13 + 7 tokens (all logits), then single-token decode to 24 (past the window of 8).
static void check_gemma(const std::string& name) {
  const std::string folder = std::string(DC_FIXTURE_DIR) + "/" + name;
  dc::HfModel cpu_model = dc::load_hf_model(folder);
  const dc::HfModel gpu_model = dc::load_hf_model(folder);
  dc::Transformer<dc::cpu> reference(cpu_model.config, std::move(cpu_model.weights), 16);
  dc::Weights<dc::cuda, float> device_weights;
  {
    Gpu upload_ctx;
    device_weights = dc::upload_weights<float>(gpu_model.weights, upload_ctx);
  }
  dc::Transformer<dc::cuda> model(gpu_model.config, std::move(device_weights), 16);

  std::mt19937 rng(11);
  std::uniform_int_distribution<std::int32_t> token(0, gpu_model.config.vocab_size - 1);
  std::vector<std::int32_t> tokens(24);
  for (auto& t : tokens) t = token(rng);
  auto cache_cpu = reference.make_cache(32);
  auto cache_gpu = model.make_cache(32);
  const std::span<const std::int32_t> all(tokens);
  auto step = [&](std::span<const std::int32_t> chunk, dc::LogitsFor which) {
    const auto want = reference.forward(chunk, cache_cpu, which);
    const auto got = model.forward(chunk, cache_gpu, which);
    CAPTURE(cache_gpu.length());
    CHECK(normalised_error(got, want) < 1e-4f);
  };
  step(all.subspan(0, 13), dc::LogitsFor::all);
  step(all.subspan(13, 7), dc::LogitsFor::all);
  for (std::size_t i = 20; i < tokens.size(); ++i) step(all.subspan(i, 1), dc::LogitsFor::last);
}

TEST_CASE("Transformer<cuda> matches Transformer<cpu> on tiny Gemma 3") { check_gemma("tiny_gemma3"); }

TEST_CASE("Transformer<cuda> matches Transformer<cpu> on tiny Gemma 3 with soft-capping") {
  check_gemma("tiny_gemma3_softcap");
}
