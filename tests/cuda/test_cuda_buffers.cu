// Buffers and copies on the device, in a second translation unit that includes the whole CUDA
// backend: it also proves distillcache.cuh can be included from several .cu files of one program
// (no duplicate kernel symbols at link time).
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include <distillcache/distillcache.cuh>

TEST_CASE("device buffers round-trip through host and device-to-device copies") {
  dc::Context<dc::cuda> ctx;
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 0.5f);
  dc::Buffer<float, dc::cuda> a(host.size()), b(host.size());
  dc::copy_to_backend(ctx, a.data(), host.data(), host.size());
  dc::copy_on_backend(ctx, b.data(), a.data(), host.size());
  std::vector<float> back(host.size(), -1.0f);
  dc::copy_to_host(ctx, back.data(), b.data(), back.size());
  CHECK(back == host);
  b.fill_zero();
  dc::copy_to_host(ctx, back.data(), b.data(), back.size());
  CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("device buffers, caches and models know their device, so mismatches are caught") {
  dc::Context<dc::cuda> ctx;
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  dc::Buffer<float, dc::cuda> a(16), empty;
  CHECK(a.device() == current);
  CHECK(empty.device() == dc::kHostDevice);
  dc::Buffer<float, dc::cuda> moved(std::move(a));
  CHECK(moved.device() == current);
  CHECK(a.device() == dc::kHostDevice);  // NOLINT(bugprone-use-after-move): moved-from state
  CHECK(ctx.device() == current);
  dc::ModelConfig cfg = dc::ModelConfig::mistral_7b_v0_1();
  cfg.num_layers = 1;
  dc::KVCache<dc::cuda> cache(dc::cache_shape_of(cfg), 4);
  CHECK(cache.device() == current);
  // With one GPU a real mismatch cannot be staged; the check itself is tested on the CPU
  // (tests/cpu/test_bad_input.cpp) and is what Transformer<cuda> calls.
  CHECK_THROWS_AS(dc::check_same_device(ctx.device(), current + 1, "the KV cache"), dc::Error);
}
