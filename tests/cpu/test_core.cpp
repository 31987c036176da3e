// Core pieces: errors carry their location, buffers and tensors, presets and config validation,
// KV-cache positions and byte accounting.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>

TEST_CASE("dc::Error names the failed check and its source location") {
  try {
    DC_CHECK(1 + 1 == 3, "arithmetic is broken: ", 42);
    FAIL("DC_CHECK did not throw");
  } catch (const dc::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("arithmetic is broken: 42") != std::string::npos);
    CHECK(what.find("test_core.cpp:") != std::string::npos);
    CHECK(e.message() == "arithmetic is broken: 42");
  }
}

TEST_CASE("cpu buffers are aligned, movable and zeroable; tensors carry shapes") {
  dc::Buffer<float, dc::cpu> a(37);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
  CHECK(a.bytes() == 37 * sizeof(float));
  a.fill_zero();
  a[36] = 2.0f;
  dc::Buffer<float, dc::cpu> b = std::move(a);
  CHECK(a.empty());
  CHECK(b[36] == 2.0f);
  CHECK(b[0] == 0.0f);

  dc::Tensor<float, dc::cpu> t(dc::Shape{2, 3, 4});
  CHECK(t.numel() == 24);
  CHECK(t.shape().str() == "[2, 3, 4]");
  auto v = t.view();
  CHECK(v.row(1) == t.data() + 4);
  CHECK_THROWS_AS(dc::Shape({1, 2, 3, 4, 5}), dc::Error);
  CHECK_THROWS_AS(dc::Shape({-1}), dc::Error);
}

TEST_CASE("Mistral presets have the published shapes") {
  const auto v1 = dc::ModelConfig::mistral_7b_v0_1();
  CHECK(v1.sliding_window == 4096);
  CHECK(v1.vocab_size == 32000);
  CHECK(v1.rope_theta == 10000.0f);
  CHECK(v1.num_kv_heads == 8);
  CHECK(v1.head_dim == 128);
  // 7.24B parameters, the published count for Mistral-7B.
  CHECK(v1.num_parameters() == 7241732096);
  const auto v3 = dc::ModelConfig::mistral_7b_v0_3();
  CHECK(v3.vocab_size == 32768);
  CHECK(v3.rope_theta == 1000000.0f);
  CHECK(v3.sliding_window == 0);
  v1.validate();
  v3.validate();
}

TEST_CASE("config validation names the bad field") {
  auto c = dc::ModelConfig::mistral_7b_v0_1();
  c.num_kv_heads = 5;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("num_key_value_heads"), dc::Error);
  c = dc::ModelConfig::mistral_7b_v0_1();
  c.head_dim = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("head_dim"), dc::Error);
  c = dc::ModelConfig::mistral_7b_v0_1();
  c.rms_eps = -1.0f;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("rms_norm_eps"), dc::Error);
}

TEST_CASE("KV cache hands out consecutive positions and accounts bytes exactly") {
  dc::ModelConfig c;
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 2;
  c.max_position = 64;
  dc::KVCache<dc::cpu> cache(dc::cache_shape_of(c), 10);
  dc::Context<dc::cpu> ctx;
  // Per slot, layer and KV head (2 of them): K and V rows (2 dims), a position, stat rows (6 + 2
  // query heads of the group).
  const std::size_t per_slot_layer = 2 * (2 * 2 * sizeof(float) + sizeof(std::int32_t) + 8 * sizeof(float));
  CHECK(cache.bytes_per_slot_layer() == per_slot_layer);
  CHECK(cache.bytes_used() == 0);
  CHECK(cache.bytes_reserved() == 3 * 10 * per_slot_layer);
  cache.append(ctx, 4);
  CHECK(cache.appended_at(0) == 0);
  cache.append(ctx, 2);
  CHECK(cache.appended_at(2) == 4);
  CHECK(cache.length() == 6);
  CHECK(cache.next_position() == 6);
  CHECK(cache.positions(1)[5] == 5);
  CHECK(cache.positions(1)[10 + 5] == 5);  // KV head 1's positions follow head 0's capacity
  CHECK(cache.host_positions(2, 1).size() == 6);
  CHECK(cache.bytes_used() == 3 * 6 * per_slot_layer);
  CHECK_THROWS_WITH_AS(cache.append(ctx, 5), doctest::Contains("KV cache full"), dc::Error);
  CHECK_THROWS_AS(dc::KVCache<dc::cpu>(dc::cache_shape_of(c), 0), dc::Error);
  cache.clear();
  CHECK(cache.length() == 0);
}

TEST_CASE("all_finite and check_all_finite find every kind of non-finite entry, anywhere") {
  // all_finite is the vectorised pass (x - x == 0); check it against std::isfinite at every
  // position of an array longer than a few vectors, for NaN, +-inf, and finite extremes.
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
  const float finite[] = {0.0f, -0.0f, std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                          1e-30f};
  std::vector<float> v(77);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = finite[i % std::size(finite)];
  CHECK(dc::all_finite(v));
  CHECK_NOTHROW(dc::check_all_finite(v, "values"));
  CHECK(dc::all_finite(std::span<const float>()));
  for (std::size_t at : {std::size_t(0), std::size_t(15), std::size_t(16), std::size_t(76)})
    for (float bad : specials) {
      std::vector<float> w = v;
      w[at] = bad;
      CHECK_FALSE(dc::all_finite(w));
      const std::string expected =
          "values: entry " + std::to_string(at) + " is " + dc::describe_non_finite(bad);
      CHECK_THROWS_WITH_AS(dc::check_all_finite(w, "values"), doctest::Contains(expected.c_str()),
                           dc::Error);
    }
}

TEST_CASE("contiguous_share hands each thread one run of items of about equal rows") {
  // Items of uneven sizes (empty ones too) over [0, total), as a gather's groups are.
  const std::vector<std::int64_t> sizes = {528, 528, 0, 1552, 1552, 1552, 528, 1, 528, 17, 0, 528};
  std::vector<std::int64_t> begin(sizes.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    begin[i] = total;
    total += sizes[i];
  }
  const std::int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  for (int threads = 1; threads <= 5; ++threads) {
    CAPTURE(threads);
    std::vector<std::int64_t> rows(std::size_t(threads), 0);
    int previous = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const int t = dc::cpu_detail::contiguous_share(begin[i], begin[i] + sizes[i], total, threads);
      REQUIRE(t >= 0);
      REQUIRE(t < threads);
      CHECK(t >= previous);  // in row order the shares never go back: one run per thread
      previous = t;
      rows[std::size_t(t)] += sizes[i];
    }
    // An item goes to the run holding its middle row: a thread's rows stay within its run's
    // length plus an item's on either side.
    for (std::int64_t r : rows) CHECK(r <= total / threads + largest + 1);
  }
  CHECK(dc::cpu_detail::contiguous_share(0, 0, 0, 4) == 0);  // no rows at all
  CHECK(dc::cpu_detail::contiguous_share(0, 10, 10, 2) == 1);  // one item of every row: its middle, row 5
  CHECK(dc::cpu_detail::contiguous_share(0, 6, 10, 2) == 0);
  CHECK(dc::cpu_detail::contiguous_share(4, 10, 10, 2) == 1);
}

TEST_CASE("ContiguousRuns: a thread takes its own run in order, then the back of the nearest other run") {
  // Three runs: items 0-2 (thread 0), none (thread 1), 3-6 (thread 2).
  const std::vector<int> owner = {0, 0, 0, 2, 2, 2, 2};
  {
    dc::cpu_detail::ContiguousRuns runs(owner, 3);
    std::vector<int> order;
    for (int i = runs.next(1); i >= 0; i = runs.next(1)) order.push_back(i);
    // thread 1 has no run: the nearest above (thread 2's) from its back, then thread 0's
    CHECK(order == std::vector<int>{6, 5, 4, 3, 2, 1, 0});
  }
  {
    dc::cpu_detail::ContiguousRuns runs(owner, 3);
    CHECK(runs.next(0) == 0);
    CHECK(runs.next(2) == 3);
    CHECK(runs.next(0) == 1);
    CHECK(runs.next(0) == 2);
    CHECK(runs.next(0) == 6);  // its own run done: steals the far end of thread 2's
    CHECK(runs.next(2) == 4);
    CHECK(runs.next(2) == 5);
    CHECK(runs.next(0) == -1);
    CHECK(runs.next(2) == -1);
    CHECK(runs.next(7) == -1);  // a thread number past the runs only steals
  }
  {
    dc::cpu_detail::ContiguousRuns runs(owner, 3);
    CHECK(runs.next(5) == 6);  // the nearest run to thread 5 is thread 2's
  }
  CHECK_THROWS_AS(dc::cpu_detail::ContiguousRuns(std::vector<int>{1, 0}, 2), dc::Error);  // not in order
  CHECK_THROWS_AS(dc::cpu_detail::ContiguousRuns(std::vector<int>{0, 2}, 2), dc::Error);  // no such thread
  // Every item taken exactly once by a team smaller than the runs (with OpenMP, at once): its
  // threads take their own runs and steal the others'. (Teams of at most the default size: a
  // larger one leaves libomp's extra threads' memory to LeakSanitizer.)
  const int items = 1000;
  std::vector<int> many(items);
  for (int i = 0; i < items; ++i) many[std::size_t(i)] = i * 4 / items;
  for (int team : {1, 2}) {
    CAPTURE(team);
    dc::cpu_detail::ContiguousRuns runs(many, 4);
    std::vector<int> taken(items, 0);
    DC_OMP(parallel num_threads(team))
    {
      for (int i = runs.next(dc::cpu_detail::thread_num()); i >= 0; i = runs.next(dc::cpu_detail::thread_num()))
        ++taken[std::size_t(i)];  // distinct items: no two threads write one entry
    }
    CHECK(std::all_of(taken.begin(), taken.end(), [](int n) { return n == 1; }));
  }
}
