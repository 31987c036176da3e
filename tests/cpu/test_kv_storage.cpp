// The KV cache's storage type (KVCache kv_type: fp32 or bf16): what a bf16 cache stores, that
// compaction and copies move its rows like an fp32 cache's, what it refuses, and how far its
// logits move from the fp32 cache's (the real model's figure is in test_smollm2_logits).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/hf_checkpoint.hpp>

namespace {

const std::string kFixtures = DC_FIXTURE_DIR;
const std::vector<std::int32_t> kTokens = {1, 17, 200, 3, 45, 99, 120, 7, 8, 255, 31, 64, 5, 9, 77, 140};

dc::Transformer<dc::cpu> tiny_model() {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), 8);
}

std::size_t head_elements(const dc::KVCache<dc::cpu>& c) {
  return std::size_t(c.num_kv_heads()) * std::size_t(c.capacity(0)) * std::size_t(c.head_dim());
}

}  // namespace

TEST_CASE("a bf16 cache stores the fp32 keys and values rounded to bf16; the fp32 view is refused") {
  auto model = tiny_model();
  auto full = model.make_cache(32);
  auto half = model.make_cache(32, dc::DType::bf16);
  CHECK(half.kv_type() == dc::DType::bf16);
  std::vector<float> logits(std::size_t(model.config().vocab_size));
  model.forward(kTokens, full, logits);
  model.forward(kTokens, half, logits);
  // Layer 0's K/V come from the embeddings alone, the same in both runs: bf16 holds them rounded.
  const std::size_t n = head_elements(full);
  const float* k = full.keys(0);
  const float* v = full.values(0);
  const dc::bf16* k16 = half.keys_as<dc::bf16>(0);
  const dc::bf16* v16 = half.values_as<dc::bf16>(0);
  int differ = 0;
  for (int h = 0; h < full.num_kv_heads(); ++h)
    for (int s = 0; s < full.length(0); ++s)
      for (int i = 0; i < full.head_dim(); ++i) {
        const std::size_t e = (std::size_t(h) * full.capacity(0) + std::size_t(s)) * full.head_dim() + std::size_t(i);
        REQUIRE(e < n);
        differ += dc::to_bf16(k[e]).bits != k16[e].bits || dc::to_bf16(v[e]).bits != v16[e].bits;
      }
  CHECK(differ == 0);
  // Positions and statistics layout are the storage type's business no more than before.
  CHECK(half.host_positions(0) == full.host_positions(0));
  CHECK(half.bytes_used() < full.bytes_used());
  CHECK_THROWS_WITH_AS(half.keys(0), doctest::Contains("K/V read as f32 but stored as bf16"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::KVCache<dc::cpu>(dc::cache_shape_of(model.config()), 8, dc::DType::f16),
                       doctest::Contains("storage type f16 is not supported"), dc::Error);
  auto other = model.make_cache(32);
  CHECK_THROWS_WITH_AS(other.copy_from(model.context(), half), doctest::Contains("copy from a bf16 cache into a f32"),
                       dc::Error);
}

TEST_CASE("a bf16 cache's logits stay near the fp32 cache's, before and after per-head eviction") {
  auto model = tiny_model();
  const int vocab = model.config().vocab_size;
  auto full = model.make_cache(32);
  auto half = model.make_cache(32, dc::DType::bf16);
  std::vector<float> a(kTokens.size() * std::size_t(vocab)), b(a.size());
  model.forward(kTokens, full, a, dc::LogitsFor::all);
  model.forward(kTokens, half, b, dc::LogitsFor::all);
  std::vector<double> kl(kTokens.size());
  dc::kl_rows_reference(model.context(), a.data(), b.data(), int(kTokens.size()), vocab, kl.data());
  double mean = 0.0;
  for (double v : kl) mean += v / double(kl.size());
  MESSAGE("tiny_mistral, bf16 vs fp32 KV cache over " << kTokens.size() << " positions: mean KL " << mean);
  CHECK(mean > 0.0);
  CHECK(mean < 1e-5);  // measured 2.3e-7

  // The same per-head keep-sets applied to both caches: the kept rows move alike (the bf16 rows
  // of the fp32 cache's kept rows at layer 0), and decoding goes on from both.
  const int kv_heads = full.num_kv_heads(), keep = 6;
  std::vector<std::int32_t> sets;
  for (int h = 0; h < kv_heads; ++h)
    for (int i = 0; i < keep; ++i) sets.push_back(std::int32_t(i * 2 + (h + i) % 2));
  for (int l = 0; l < full.num_layers(); ++l) {
    full.compact_heads(model.context(), l, sets);
    half.compact_heads(model.context(), l, sets);
  }
  const float* k = full.keys(0);
  const dc::bf16* k16 = half.keys_as<dc::bf16>(0);
  int differ = 0;
  for (int h = 0; h < kv_heads; ++h)
    for (int s = 0; s < keep; ++s)
      for (int i = 0; i < full.head_dim(); ++i) {
        const std::size_t e = (std::size_t(h) * full.capacity(0) + std::size_t(s)) * full.head_dim() + std::size_t(i);
        differ += dc::to_bf16(k[e]).bits != k16[e].bits;
      }
  CHECK(differ == 0);
  for (int h = 0; h < kv_heads; ++h) CHECK(half.host_positions(0, h) == full.host_positions(0, h));
  std::vector<float> next_a(static_cast<std::size_t>(vocab)), next_b(static_cast<std::size_t>(vocab));
  const std::vector<std::int32_t> next = {42};
  model.forward(next, full, next_a);
  model.forward(next, half, next_b);
  double after = 0.0;
  dc::kl_rows_reference(model.context(), next_a.data(), next_b.data(), 1, vocab, &after);
  MESSAGE("after eviction to " << keep << " slots per head: KL " << after);
  CHECK(after < 1e-5);

  // A copy keeps the storage type and the bytes of every slot in use.
  auto copy = model.make_cache(32, dc::DType::bf16);
  copy.copy_from(model.context(), half);
  const std::size_t row = std::size_t(half.head_dim()) * sizeof(dc::bf16);
  for (int h = 0; h < kv_heads; ++h) {
    const std::size_t at = std::size_t(h) * std::size_t(half.capacity(1)) * std::size_t(half.head_dim());
    CHECK(std::memcmp(copy.keys_as<dc::bf16>(1) + at, half.keys_as<dc::bf16>(1) + at, row * std::size_t(half.length(1))) == 0);
    CHECK(std::memcmp(copy.values_as<dc::bf16>(1) + at, half.values_as<dc::bf16>(1) + at,
                      row * std::size_t(half.length(1))) == 0);
  }
}

namespace {

// Every (layer, KV head)'s backend positions equal its host mirror.
void check_positions_mirrored(const dc::KVCache<dc::cpu>& c) {
  for (int l = 0; l < c.num_layers(); ++l)
    for (int h = 0; h < c.num_kv_heads(); ++h) {
      CAPTURE(l);
      CAPTURE(h);
      const auto& host = c.host_positions(l, h);
      const std::int32_t* backend = c.positions(l) + std::size_t(h) * std::size_t(c.capacity(l));
      CHECK(std::vector<std::int32_t>(backend, backend + host.size()) == host);
    }
}

}  // namespace

TEST_CASE("KVCache positions: one strided upload per run of equally long layers, and set from the backend") {
  const dc::Context<dc::cpu> ctx;
  dc::KVCache<dc::cpu> cache(dc::CacheShape{3, 4, 2, 8, 64, {}}, 32);
  cache.append(ctx, 10);
  check_positions_mirrored(cache);
  // Layer 1 shorter than its neighbours: the next append writes runs [0], [1], [2] separately.
  cache.compact_layer(ctx, 1, std::vector<std::int32_t>{1, 3, 5});
  cache.append(ctx, 2);
  CHECK(cache.length(0) == 12);
  CHECK(cache.length(1) == 5);
  CHECK(cache.host_positions(1, 1) == std::vector<std::int32_t>{1, 3, 5, 10, 11});
  CHECK(cache.host_positions(2, 0).back() == 11);
  check_positions_mirrored(cache);
  // After a compaction done elsewhere (the CUDA in-place eviction): rows [layers * kv_heads, 4].
  std::vector<std::int32_t> rows;
  for (int r = 0; r < 3 * 2; ++r)
    for (int i = 0; i < 4; ++i) rows.push_back(std::int32_t(r + 2 * i));
  cache.set_positions_from_backend(ctx, rows.data(), 4);
  for (int l = 0; l < 3; ++l) {
    CHECK(cache.length(l) == 4);
    for (int h = 0; h < 2; ++h) {
      const int r = l * 2 + h;
      CHECK(cache.host_positions(l, h) == std::vector<std::int32_t>{r, r + 2, r + 4, r + 6});
    }
  }
  check_positions_mirrored(cache);
  CHECK_THROWS_WITH_AS(cache.set_positions_from_backend(ctx, rows.data(), 33),
                       doctest::Contains("33 positions per head (capacity 32)"), dc::Error);
}

TEST_CASE("KVCache with a capacity per layer: each layer's stride, the full layer named, bad capacities refused") {
  const dc::Context<dc::cpu> ctx;
  const dc::CacheShape shape{3, 4, 2, 8, 64, {}};
  dc::KVCache<dc::cpu> cache(shape, std::vector<int>{32, 12, 20});
  CHECK(cache.capacity(1) == 12);
  CHECK(!cache.uniform_capacity());
  CHECK(cache.smallest_capacity() == 12);
  CHECK(cache.bytes_reserved() == std::size_t(32 + 12 + 20) * cache.bytes_per_slot_layer());
  cache.append(ctx, 10);  // every layer's new slots start at 0, but the strides differ: one copy each
  CHECK(cache.free_slots() == 2);
  check_positions_mirrored(cache);
  CHECK_THROWS_WITH_AS(cache.append(ctx, 3), doctest::Contains("10 + 3 tokens exceed capacity 12 of layer 1"),
                       dc::Error);
  cache.compact_layer(ctx, 1, std::vector<std::int32_t>{1, 3, 5});
  cache.append(ctx, 2);
  CHECK(cache.host_positions(1, 1) == std::vector<std::int32_t>{1, 3, 5, 10, 11});
  check_positions_mirrored(cache);
  std::vector<std::int32_t> rows;
  for (int r = 0; r < 3 * 2; ++r)
    for (int i = 0; i < 4; ++i) rows.push_back(std::int32_t(r + 2 * i));
  cache.set_positions_from_backend(ctx, rows.data(), 4);
  CHECK(cache.host_positions(2, 1) == std::vector<std::int32_t>{5, 7, 9, 11});
  check_positions_mirrored(cache);
  CHECK_THROWS_WITH_AS(cache.set_positions_from_backend(ctx, rows.data(), 13),
                       doctest::Contains("13 positions per head (capacity 12)"), dc::Error);

  using Caps = std::vector<int>;
  CHECK_THROWS_WITH_AS(dc::KVCache<dc::cpu>(shape, Caps{32, 12}), doctest::Contains("2 layer capacities for 3 layers"),
                       dc::Error);
  CHECK_THROWS_WITH_AS(dc::KVCache<dc::cpu>(shape, Caps{32, 0, 8}),
                       doctest::Contains("capacity must be positive, got 0 in layer 1"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::KVCache<dc::cpu>(shape, Caps{32, 65, 8}),
                       doctest::Contains("capacity 65 in layer 1 exceeds the model's max_position 64"), dc::Error);
}

TEST_CASE("a cache with a capacity per layer gives the logits of a uniform one; copies between the layouts keep every byte") {
  auto model = tiny_model();
  const int layers = model.config().num_layers, vocab = model.config().vocab_size;
  std::vector<int> capacities;
  for (int l = 0; l < layers; ++l) capacities.push_back(20 + 7 * (l % 3));  // 20, 27 on the 2-layer model
  for (const dc::DType type : {dc::DType::f32, dc::DType::bf16}) {
    CAPTURE(dc::dtype_name(type));
    auto uniform = model.make_cache(40, type);
    auto uneven = model.make_cache(std::span<const int>(capacities), type);
    std::vector<float> a(static_cast<std::size_t>(vocab)), b(static_cast<std::size_t>(vocab));
    uniform.set_observed_from(8);
    uneven.set_observed_from(8);
    model.forward(kTokens, uniform, a);
    model.forward(kTokens, uneven, b);
    CHECK(a == b);  // bitwise
    // Per-head keep-sets of different lengths per layer, the same in both caches.
    dc::Context<dc::cpu> ctx;
    for (int l = 0; l < layers; ++l) {
      const int count = 5 + l % 3;  // head h keeps every other slot, from slot h % 2
      std::vector<std::int32_t> keep;
      for (int h = 0; h < uniform.num_kv_heads(); ++h)
        for (int i = 0; i < count; ++i) keep.push_back(std::int32_t(2 * i + h % 2));
      uniform.compact_heads(ctx, l, keep);
      uneven.compact_heads(ctx, l, keep);
    }
    for (std::int32_t token : {3, 250, 17, 64}) {
      model.forward(std::vector<std::int32_t>{token}, uniform, a);
      model.forward(std::vector<std::int32_t>{token}, uneven, b);
      CHECK(a == b);
    }
    // Into a third layout and back: every slot's bytes, positions and statistics come along.
    std::vector<int> tight;
    for (int l = 0; l < layers; ++l) tight.push_back(uneven.length(l));
    auto copy = model.make_cache(std::span<const int>(tight), type);
    copy.copy_from(ctx, uneven);
    CHECK(copy.free_slots() == 0);
    const std::size_t bytes = dc::dtype_size(type);
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < copy.num_kv_heads(); ++h) {
        CAPTURE(l);
        CAPTURE(h);
        CHECK(copy.host_positions(l, h) == uneven.host_positions(l, h));
        const std::size_t len = std::size_t(copy.length(l)), d = std::size_t(copy.head_dim());
        const auto* from = static_cast<const unsigned char*>(uneven.with_kv(l, [](const auto* k, const auto*) {
          return static_cast<const void*>(k);
        }));
        const auto* to = static_cast<const unsigned char*>(copy.with_kv(l, [](const auto* k, const auto*) {
          return static_cast<const void*>(k);
        }));
        CHECK(std::memcmp(to + std::size_t(h) * std::size_t(copy.capacity(l)) * d * bytes,
                          from + std::size_t(h) * std::size_t(uneven.capacity(l)) * d * bytes, len * d * bytes) == 0);
        for (int r = 0; r < copy.stat_rows(); ++r)
          CHECK(std::memcmp(copy.stats(l) + (std::size_t(h) * copy.stat_rows() + r) * copy.capacity(l),
                            uneven.stats(l) + (std::size_t(h) * uneven.stat_rows() + r) * uneven.capacity(l),
                            len * sizeof(float)) == 0);
      }
    check_positions_mirrored(copy);
    model.forward(std::vector<std::int32_t>{9}, uniform, a);
    CHECK_THROWS_WITH_AS(model.forward(std::vector<std::int32_t>{9}, copy, b), doctest::Contains("KV cache full"),
                         dc::Error);
    auto roomy = model.make_cache(40, type);
    roomy.copy_from(ctx, copy);
    model.forward(std::vector<std::int32_t>{9}, roomy, b);
    CHECK(a == b);
    CHECK_THROWS_WITH_AS(copy.copy_from(ctx, uniform), doctest::Contains("exceed capacity"), dc::Error);
  }
}
