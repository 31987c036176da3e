// The learned policy's MLP against a double-precision reference and finite differences, its
// inputs' scale-freedom, and the leave-one-out advantages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <distillcache/cpu/mlp.hpp>
#include <distillcache/policy/baselines.hpp>
#include <distillcache/policy/linear_correction.hpp>
#include <distillcache/policy/mlp_policy.hpp>
#include <distillcache/policy/select.hpp>
#include <distillcache/policy/policy_inputs.hpp>
#include <distillcache/rl/reinforce.hpp>
#include <distillcache/rl/warm_start_target.hpp>

#include "../support/random.hpp"
#include "../support/threads.hpp"

namespace {

const dc::Context<dc::cpu> kCpu{};

double act(dc::Activation a, double x) {
  switch (a) {
    case dc::Activation::silu: return x / (1.0 + std::exp(-x));
    case dc::Activation::tanh: return std::tanh(x);
    case dc::Activation::relu: return x > 0 ? x : 0.0;
  }
  return x;
}

// Naive forward in double: one row at a time, the layout read directly.
std::vector<double> reference_scores(const dc::MlpLayout& L, const std::vector<double>& p,
                                     const std::vector<float>& x, int n) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    std::vector<double> a(x.begin() + std::ptrdiff_t(r) * L.inputs, x.begin() + std::ptrdiff_t(r + 1) * L.inputs);
    for (int l = 0; l < L.layers(); ++l) {
      std::vector<double> z(static_cast<std::size_t>(L.out(l)));
      for (int o = 0; o < L.out(l); ++o) {
        double s = p[std::size_t(L.bias_offset(l) + o)];
        for (int i = 0; i < L.in(l); ++i)
          s += p[std::size_t(L.weight_offset(l) + std::int64_t(o) * L.in(l) + i)] * a[std::size_t(i)];
        z[std::size_t(o)] = l + 1 == L.layers() ? s : act(L.activation, s);
      }
      a = z;
    }
    out[std::size_t(r)] = a[0];
  }
  return out;
}

std::vector<float> random_params(const dc::MlpLayout& L, unsigned seed) {
  return dc_test::random_vector(std::size_t(L.parameters()), seed, 0.4f);
}

}  // namespace

TEST_CASE("MlpLayout: offsets tile the flat block layer by layer") {
  const dc::MlpLayout L(5, {32, 32});
  CHECK(L.parameters() == 5 * 32 + 32 + 32 * 32 + 32 + 32 + 1);
  CHECK(L.weight_offset(0) == 0);
  CHECK(L.bias_offset(0) == 160);
  CHECK(L.weight_offset(1) == 192);
  CHECK(L.weight_offset(2) == 192 + 1024 + 32);
  CHECK(L.saved_per_row() == 64);
  CHECK_THROWS_WITH_AS(dc::MlpLayout(0, {8}), doctest::Contains("0 inputs"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::MlpLayout(5, {8, 0}), doctest::Contains("hidden layer of 0"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_activation("gelu"), doctest::Contains("unknown activation 'gelu'"), dc::Error);
}

TEST_CASE("mlp_forward equals a double-precision reference for every activation") {
  for (auto a : {dc::Activation::silu, dc::Activation::tanh, dc::Activation::relu}) {
    CAPTURE(dc::activation_name(a));
    const dc::MlpLayout L(5, {7, 3}, a);
    const int n = 37;  // not a multiple of the tile
    const auto x = dc_test::random_vector(std::size_t(n) * 5, 3);
    const auto p = random_params(L, 4);
    std::vector<float> scores(static_cast<std::size_t>(n)), saved(std::size_t(n * L.saved_per_row()));
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, scores.data(), saved.data());
    const auto want = reference_scores(L, std::vector<double>(p.begin(), p.end()), x, n);
    for (int r = 0; r < n; ++r) CHECK(scores[std::size_t(r)] == doctest::Approx(want[std::size_t(r)]).epsilon(1e-5));
  }
}

TEST_CASE("the MLP's register-blocked units give the plain loop's bits") {
  // Every layer shape the policies use (5-10 inputs, hidden 8/16/32, odd counts for the
  // remainder blocks, the single output unit), on one tile of random activations.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  constexpr int T = dc::cpu_detail::kMlpTile;
  for (const int in : {1, 5, 6, 7, 10, 32})
    for (const int out : {1, 3, 5, 8, 16, 32}) {
      std::vector<float> W(std::size_t(out) * std::size_t(in)), b(std::size_t(out), 0.0f), a(std::size_t(in) * T);
      for (auto* v : {&W, &b, &a})
        for (float& x : *v) x = u(rng);
      std::vector<float> fast(std::size_t(out) * T), plain(std::size_t(out) * T);
      dc::cpu_detail::mlp_tile_units(W.data(), b.data(), in, out, a.data(), fast.data());
      dc::cpu_detail::mlp_tile_units_portable(W.data(), b.data(), in, out, a.data(), plain.data());
      CAPTURE(in);
      CAPTURE(out);
      CHECK(std::memcmp(fast.data(), plain.data(), fast.size() * sizeof(float)) == 0);
      // Written through ReLU (inference's fused form): the activation of those bits, both paths.
      std::vector<float> fast_relu(fast.size()), plain_relu(fast.size()), relu_of(fast.size());
      dc::cpu_detail::mlp_tile_units(W.data(), b.data(), in, out, a.data(), fast_relu.data(), true);
      dc::cpu_detail::mlp_tile_units_portable(W.data(), b.data(), in, out, a.data(), plain_relu.data(), true);
      dc::math::activate_all(dc::Activation::relu, plain.data(), relu_of.data(), int(plain.size()));
      CHECK(std::count(relu_of.begin(), relu_of.end(), 0.0f) > 0);
      CHECK(std::memcmp(fast_relu.data(), relu_of.data(), fast.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(plain_relu.data(), relu_of.data(), fast.size() * sizeof(float)) == 0);
    }
  // A whole forward: the fused ReLU path (nothing saved) gives the saving path's scores.
  for (const auto& hidden : {std::vector<int>{16}, std::vector<int>{16, 8}, std::vector<int>{32, 32}}) {
    const dc::MlpLayout L(6, hidden, dc::Activation::relu);
    const auto p = random_params(L, 5);
    const int n = 77;
    std::vector<float> x(std::size_t(n) * 6);
    for (float& v : x) v = u(rng);
    std::vector<float> fused(n), unfused(n), saved(std::size_t(n) * std::size_t(L.saved_per_row()));
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, fused.data(), nullptr);
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, unfused.data(), saved.data());
    CAPTURE(hidden.size());
    CHECK(std::memcmp(fused.data(), unfused.data(), fused.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("mlp_backward matches central finite differences of the double reference") {
  for (auto a : {dc::Activation::silu, dc::Activation::tanh}) {
    CAPTURE(dc::activation_name(a));
    const dc::MlpLayout L(5, {6, 4}, a);
    const int n = 19;
    const auto x = dc_test::random_vector(std::size_t(n) * 5, 11);
    const auto p = random_params(L, 12);
    const auto c = dc_test::random_vector(std::size_t(n), 13);  // loss = sum_r c_r s_r
    std::vector<float> scores(static_cast<std::size_t>(n)), saved(std::size_t(n * L.saved_per_row()));
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, scores.data(), saved.data());
    std::vector<float> grad(std::size_t(L.parameters()), 0.0f);
    dc::mlp_backward(kCpu, L, p.data(), x.data(), saved.data(), c.data(), n, grad.data());
    const std::vector<double> pd(p.begin(), p.end());
    auto loss = [&](const std::vector<double>& q) {
      const auto s = reference_scores(L, q, x, n);
      double sum = 0.0;
      for (int r = 0; r < n; ++r) sum += double(c[std::size_t(r)]) * s[std::size_t(r)];
      return sum;
    };
    double worst = 0.0;
    for (std::size_t i = 0; i < pd.size(); ++i) {
      auto plus = pd, minus = pd;
      const double h = 1e-5;
      plus[i] += h;
      minus[i] -= h;
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      const double rel = std::abs(double(grad[i]) - fd) / std::max(1e-3, std::abs(fd));
      worst = std::max(worst, rel);
    }
    CHECK(worst < 1e-3);
  }
}

TEST_CASE("mlp_backward accumulates and gives the same bits for 1, 2 and 3 threads") {
  const dc::MlpLayout L(5, {32, 32});
  const int n = 5000;  // several gradient chunks
  const auto x = dc_test::random_vector(std::size_t(n) * 5, 21);
  const auto p = random_params(L, 22);
  const auto c = dc_test::random_vector(std::size_t(n), 23);
  auto run = [&]() {
    std::vector<float> scores(static_cast<std::size_t>(n)), saved(std::size_t(n * L.saved_per_row()));
    dc::mlp_forward(kCpu, L, p.data(), x.data(), n, scores.data(), saved.data());
    std::vector<float> grad(std::size_t(L.parameters()), 1.0f);  // accumulates onto 1
    dc::mlp_backward(kCpu, L, p.data(), x.data(), saved.data(), c.data(), n, grad.data());
    grad.insert(grad.end(), scores.begin(), scores.end());
    return grad;
  };
  const auto one = dc_test::with_threads(1, run);
  CHECK(dc_test::with_threads(2, run) == one);
  CHECK(dc_test::with_threads(3, run) == one);
  // Accumulation: a second backward onto the result doubles the gradient part.
  std::vector<float> scores(static_cast<std::size_t>(n)), saved(std::size_t(n * L.saved_per_row()));
  dc::mlp_forward(kCpu, L, p.data(), x.data(), n, scores.data(), saved.data());
  std::vector<float> g1(std::size_t(L.parameters()), 0.0f);
  dc::mlp_backward(kCpu, L, p.data(), x.data(), saved.data(), c.data(), n, g1.data());
  CHECK(one[0] == doctest::Approx(1.0f + g1[0]));
}

TEST_CASE("scale-free inputs: a uniform attention reads the same at n and 2n tokens") {
  // One group of n rows receiving the uniform share 1/n, value norms around 3 (or 30).
  auto features = [](int n, float norm_scale) {
    dc::TokenFeatures f;
    f.granularity = dc::Granularity::shared;
    f.size = n;
    f.latest_position = n - 1;
    f.groups.push_back({0, 1, 0, 1, 0, n});
    for (int i = 0; i < n; ++i) {
      const float row[dc::kNumFeatures] = {1.0f / float(n), norm_scale * (1.0f + 0.1f * float(i % 3)),
                                           0.25f / float(n * n), std::log(float(n)),
                                           float(i) / float(n - 1)};
      f.append_features(row);
      f.group.push_back(0);
      f.slot.push_back(i);
      f.position.push_back(i);
      f.accumulated_mass.push_back(1.0f);
      f.last_query_mass.push_back(1.0f / float(n));
      f.key_norm.push_back(1.0f);
      f.expected_attention.push_back(0.0f);
    }
    f.validate();
    return f;
  };
  const std::vector<dc::PolicyInput> all = {dc::PolicyInput::alpha, dc::PolicyInput::value_norm,
                                            dc::PolicyInput::head_variance, dc::PolicyInput::entropy,
                                            dc::PolicyInput::position, dc::PolicyInput::last_alpha,
                                            dc::PolicyInput::budget_age};
  const auto small = dc::policy_inputs(features(300, 3.0f), all, 60);
  const auto large = dc::policy_inputs(features(600, 30.0f), all, 120);
  // Row i of the short context and row 2i of the long one: same relative place, same inputs.
  for (int i = 0; i < 300; i += 3)
    for (std::size_t j = 0; j < all.size(); ++j) {
      CAPTURE(dc::policy_input_name(all[j]));
      const float a = small[std::size_t(i) * all.size() + j], b = large[std::size_t(2 * i) * all.size() + j];
      CHECK(a == doctest::Approx(b).epsilon(0.02).scale(1.0));
    }
  // Uniform mass reads as 0 (log of 1 + eps), the raw alpha does not.
  CHECK(std::abs(small[0]) < 2e-3f);
}

TEST_CASE("budget_age: the token's age in budgets; H2O's recent half is the same rows at every budget") {
  for (int n : {200, 1000}) {
    dc::TokenFeatures f;
    f.size = n;
    f.latest_position = n + 6;  // positions need not start at 0 (an already evicted cache)
    f.groups.push_back({0, 1, 0, 1, 0, n});
    for (int i = 0; i < n; ++i) {
      f.append_features(0.5f);
      f.group.push_back(0);
      f.slot.push_back(i);
      f.position.push_back(i + 7);
      f.accumulated_mass.push_back(1.0f);
      f.last_query_mass.push_back(1.0f);
      f.key_norm.push_back(1.0f);
      f.expected_attention.push_back(0.0f);
    }
    f.validate();
    const std::vector<dc::PolicyInput> age = {dc::PolicyInput::budget_age};
    for (int budget : {2, 64, 100, n}) {
      CAPTURE(n);
      CAPTURE(budget);
      const auto x = dc::policy_inputs(f, age, budget);
      // The newest row (age 0) reads log(1 / B); the row B - 1 older reads log(1) = 0.
      CHECK(x[std::size_t(n - 1)] == doctest::Approx(std::log(1.0 / budget)));
      CHECK(std::abs(x[std::size_t(n - budget)]) < 1e-6f);
      int recent = 0;
      for (float v : x) recent += dc::math::h2o_recent_from_input(v);
      CHECK(recent == budget / 2);
      // Older rows read larger ages.
      for (int i = 1; i < n; ++i) CHECK(x[std::size_t(i - 1)] > x[std::size_t(i)]);
    }
    CHECK_THROWS_WITH_AS(dc::policy_inputs(f, age, 0), doctest::Contains("budget_age needs a budget"), dc::Error);
    // log_age counts tokens: the same ages read the same at every length and budget.
    const std::vector<dc::PolicyInput> log_age = {dc::PolicyInput::log_age};
    const auto y = dc::policy_inputs(f, log_age, 0);
    for (int a : {0, 1, 31, 199}) CHECK(y[std::size_t(n - 1 - a)] == doctest::Approx(std::log(double(a) + 1.0)));
  }
}

TEST_CASE("depth: the group's layer as a fraction of the model, the same at every length") {
  for (const int n : {40, 80}) {
    dc::TokenFeatures f;
    f.granularity = dc::Granularity::head;
    f.size = 3 * n;
    f.latest_position = n - 1;
    for (int layer = 0; layer < 3; ++layer) {  // three layers of one KV head, n rows each
      f.groups.push_back({layer, layer + 1, 0, 1, layer * n, (layer + 1) * n});
      for (int i = 0; i < n; ++i) {
        f.group.push_back(layer);
        f.slot.push_back(i);
        f.position.push_back(i);
        const float row[dc::kNumFeatures] = {1.0f / float(n), 1.0f, 0.0f, 0.5f, float(i) / float(n - 1)};
        f.append_features(row);
        f.accumulated_mass.push_back(1.0f);
        f.last_query_mass.push_back(1.0f / float(n));
        f.key_norm.push_back(1.0f);
        f.expected_attention.push_back(0.0f);
      }
    }
    f.validate();
    const std::vector<dc::PolicyInput> depth = {dc::PolicyInput::depth};
    const auto x = dc::policy_inputs(f, depth, 1);
    for (int i = 0; i < n; ++i) {
      CHECK(x[std::size_t(i)] == 0.0f);
      CHECK(x[std::size_t(n + i)] == 0.5f);
      CHECK(x[std::size_t(2 * n + i)] == 1.0f);
    }
  }
  CHECK(dc::math::input_depth(0, 30, 30) == 0.5f);  // a shared set covers every layer
  CHECK(dc::math::input_depth(0, 1, 1) == 0.5f);
  CHECK(dc::parse_policy_input("depth") == dc::PolicyInput::depth);
}

TEST_CASE("layer_range_groups: a layer's groups wherever they stand, with its KV heads, inside the layers asked for") {
  // Groups of two layers interleaved (layer 0 head 0, layer 1 head 0, layer 0 head 1, ...) and one
  // group covering layers 2-3 with two heads; no rows (the ranges read only layers and heads).
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.groups = {{0, 1, 0, 1, 0, 0}, {1, 2, 0, 1, 0, 0}, {0, 1, 1, 2, 0, 0}, {1, 2, 1, 2, 0, 0}, {2, 4, 0, 2, 0, 0},
              {0, 1, 2, 3, 0, 0}};
  const dc::LayerRanges all = dc::layer_range_groups(f, {});
  REQUIRE(all.size() == 3);
  auto groups_of = [](const dc::LayerRangeGroups& r) { return std::vector<int>(r.groups.begin(), r.groups.end()); };
  CHECK((all[0].layer_begin == 0 && all[0].layer_end == 1 && all[0].heads == 3));
  CHECK(groups_of(all[0]) == std::vector<int>{0, 2, 5});
  CHECK((all[1].layer_begin == 1 && all[1].heads == 2 && groups_of(all[1]) == std::vector<int>{1, 3}));
  CHECK((all[2].layer_begin == 2 && all[2].layer_end == 4 && all[2].heads == 2 && groups_of(all[2]) == std::vector<int>{4}));
  const std::vector<int> one = {1};
  const dc::LayerRanges some = dc::layer_range_groups(f, one);
  REQUIRE(some.size() == 1);
  CHECK(groups_of(some[0]) == std::vector<int>{1, 3});
  const std::vector<int> partial = {2};  // the group over layers 2-3 is not inside layer 2 alone
  CHECK(dc::layer_range_groups(f, partial).empty());
  dc::LayerRanges moved = dc::layer_range_groups(f, {});  // a move keeps the views valid
  const dc::LayerRanges kept = std::move(moved);
  CHECK(groups_of(kept[0]) == std::vector<int>{0, 2, 5});
}

TEST_CASE("layer_last_alpha: the newest query's mass averaged over a layer's KV heads, matched by position") {
  // Head granularity, 2 layers x 3 KV heads; the heads of a layer hold different positions (per-
  // head keep-sets): head h of layer l keeps the positions p < 10 with p % 3 != h, and its newest-
  // query mass at p is (l + 1) * (p + 1) * (h + 1) / 1000.
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.latest_position = 9;
  auto mass = [](int l, int h, int p) { return float((l + 1) * (p + 1) * (h + 1)) / 1000.0f; };
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 3; ++h) {
      const int begin = f.size;
      for (int p = 0; p < 10; ++p) {
        if (p % 3 == h) continue;
        const float row[dc::kNumFeatures] = {0.1f, 1.0f, 0.0f, 0.5f, float(p) / 9.0f};
        f.append_features(row);
        f.group.push_back(f.num_groups());
        f.slot.push_back(f.size - begin);
        f.position.push_back(p);
        f.accumulated_mass.push_back(1.0f);
        f.last_query_mass.push_back(mass(l, h, p));
        f.key_norm.push_back(1.0f);
        f.expected_attention.push_back(0.0f);
        ++f.size;
      }
      f.groups.push_back({l, l + 1, h, h + 1, begin, f.size});
    }
  f.validate();
  const auto layer_mean = dc::layer_last_query_mass(f);
  const std::vector<dc::PolicyInput> in = {dc::PolicyInput::last_alpha, dc::PolicyInput::layer_last_alpha};
  const auto x = dc::policy_inputs(f, in, 4);
  for (int r = 0; r < f.size; ++r) {
    const dc::FeatureGroup& g = f.groups[std::size_t(f.group[std::size_t(r)])];
    const int p = f.position[std::size_t(r)];
    double expected = 0.0;  // the two heads that hold p, the third counts 0
    for (int h = 0; h < 3; ++h)
      if (p % 3 != h) expected += mass(g.layer_begin, h, p);
    expected /= 3.0;
    CAPTURE(r);
    CHECK(layer_mean[std::size_t(r)] == doctest::Approx(expected).epsilon(1e-6));
    CHECK(x[std::size_t(r) * 2 + 1] == doctest::Approx(std::log(expected * g.rows() + dc::math::kPolicyInputEps)).epsilon(1e-5));
    CHECK(x[std::size_t(r) * 2] == doctest::Approx(std::log(double(f.last_query_mass[std::size_t(r)]) * g.rows() + dc::math::kPolicyInputEps)).epsilon(1e-5));
  }
  // Limited to layer 1: its rows as before, layer 0's left at 0 (not computed).
  const std::vector<int> layer_one = {1};
  const auto limited = dc::layer_last_query_mass(f, layer_one);
  for (int r = 0; r < f.size; ++r) {
    const bool in_layer_one = f.groups[std::size_t(f.group[std::size_t(r)])].layer_begin == 1;
    CAPTURE(r);
    CHECK(limited[std::size_t(r)] == (in_layer_one ? layer_mean[std::size_t(r)] : 0.0f));
  }
  // A group that covers its whole layer (layer granularity) reads its own last_alpha.
  dc::TokenFeatures one;
  one.granularity = dc::Granularity::layer;
  one.latest_position = 4;
  one.size = 5;
  one.groups.push_back({0, 1, 0, 3, 0, 5});
  for (int p = 0; p < 5; ++p) {
    one.append_features(0.5f);
    one.group.push_back(0);
    one.slot.push_back(p);
    one.position.push_back(p);
    one.accumulated_mass.push_back(1.0f);
    one.last_query_mass.push_back(0.1f * float(p + 1));
    one.key_norm.push_back(1.0f);
    one.expected_attention.push_back(0.0f);
  }
  const auto same = dc::layer_last_query_mass(one);
  for (int p = 0; p < 5; ++p) CHECK(same[std::size_t(p)] == doctest::Approx(0.1 * (p + 1)).epsilon(1e-6));
  // A position past the newest is named, not read out of bounds.
  one.position[2] = 9;
  CHECK_THROWS_WITH_AS(dc::layer_last_query_mass(one), doctest::Contains("row 2 has position 9 outside [0, 4]"), dc::Error);
  CHECK(dc::parse_policy_input("layer_last_alpha") == dc::PolicyInput::layer_last_alpha);
}

TEST_CASE("newest-query reserve: each group keeps the rows its layer's newest query attends to most") {
  // Head granularity, 2 layers x 2 KV heads, 12 positions; head h of layer l holds every position
  // but l + h + 3 (per-head keep-sets). H2O's mass falls with position; the newest query's mass
  // of head h at p is m(l, h, p) below, so the layer's mean (the other head counts 0 where it
  // evicted p) ranks positions differently from H2O's score.
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.latest_position = 11;
  auto last = [](int l, int h, int p) { return float(((p * 7 + l * 3 + h * 5) % 11) + 1) / 100.0f; };
  auto held = [](int l, int h, int p) { return p != l + h + 3; };
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) {
      const int begin = f.size;
      for (int p = 0; p < 12; ++p) {
        if (!held(l, h, p)) continue;
        f.append_features(0.5f);
        f.group.push_back(f.num_groups());
        f.slot.push_back(f.size - begin);
        f.position.push_back(p);
        f.accumulated_mass.push_back(float(20 - p) / 10.0f);
        f.last_query_mass.push_back(last(l, h, p));
        f.key_norm.push_back(1.0f);
        f.expected_attention.push_back(0.0f);
        ++f.size;
      }
      f.groups.push_back({l, l + 1, h, h + 1, begin, f.size});
    }
  f.validate();
  // H2O as a linear correction (every weight 0) with the newest quarter of the budget kept and a
  // quarter reserved: at a budget of 8, rows 10 and 11 are recent and 2 more are reserved.
  const std::vector<dc::PolicyInput> in = {dc::PolicyInput::alpha};
  const dc::MlpLayout layout(1, {2}, dc::Activation::relu);
  const std::vector<float> zero = {0.0f};
  dc::MlpPolicy policy(in, layout, dc::linear_correction_params(layout, zero), 0);
  policy.set_score_base(dc::ScoreBase::h2o);
  policy.set_recent_fraction(0.25);
  policy.set_newest_query_reserve(0.25);
  CHECK(policy.reserve_tokens(8, 12) == 2);
  std::vector<float> scores(std::size_t(f.size));
  policy.score(f, 8, scores);
  // The oracle: the positions below `end` that a group's head holds, ranked by its layer's mean
  // newest-query mass from the formula (the other head counts 0 where it evicted a position),
  // ties to the newer position.
  auto ranked_by_layer_mass = [&](const dc::FeatureGroup& grp, int end) {
    std::vector<std::pair<float, int>> ranked;
    for (int p = 0; p < end; ++p)
      if (held(grp.layer_begin, grp.head_begin, p)) {
        float sum = 0.0f;
        for (int h = 0; h < 2; ++h)
          if (held(grp.layer_begin, h, p)) sum += last(grp.layer_begin, h, p);
        ranked.push_back({sum / 2.0f, p});
      }
    std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second > b.second; });
    return ranked;
  };
  for (int g = 0; g < f.num_groups(); ++g) {
    const dc::FeatureGroup& grp = f.groups[std::size_t(g)];
    // The reserve: the two largest among the non-recent positions (below 10).
    const auto ranked = ranked_by_layer_mass(grp, 10);
    for (int r = grp.row_begin; r < grp.row_end; ++r) {
      const int p = f.position[std::size_t(r)];
      const bool reserved = p == ranked[0].second || p == ranked[1].second;
      CAPTURE(g);
      CAPTURE(p);
      if (p >= 10 || reserved)
        CHECK(scores[std::size_t(r)] == INFINITY);
      else
        CHECK(scores[std::size_t(r)] == dc::math::h2o_base_score(f.accumulated_mass[std::size_t(r)]));
    }
  }
  // Without the reserve the same policy is H2O with its window; with it, the keep-set at the
  // budget holds the reserved rows although H2O's score ranks them lower.
  dc::MlpPolicy plain = policy;
  plain.set_newest_query_reserve(0.0);
  std::vector<float> h2o(std::size_t(f.size));
  plain.score(f, 8, h2o);
  CHECK(std::count(h2o.begin(), h2o.end(), INFINITY) == 4 * 2);
  CHECK(std::count(scores.begin(), scores.end(), INFINITY) == 4 * 4);
  // A reserve larger than a group's non-recent rows raises all of them.
  std::vector<float> all(std::size_t(f.size), 0.0f);
  dc::reserve_newest_query_rows(f, 100, all);
  CHECK(std::count(all.begin(), all.end(), INFINITY) == f.size);
  // The checkpoint carries it; a file without it has none; impossible shares are refused.
  CHECK(dc::MlpPolicy::from_checkpoint(policy.to_checkpoint()).newest_query_reserve() ==
        std::vector<dc::SchedulePoint>{{1.0, 0.25}});
  CHECK(policy.to_checkpoint().extra["newest_query_reserve"] == 0.25);
  CHECK(dc::MlpPolicy::from_checkpoint(plain.to_checkpoint()).newest_query_reserve().empty());
  // A schedule by budget fraction: linear between its points, constant beyond them; it travels
  // in the checkpoint as [fraction, share] pairs.
  const auto schedule = dc::parse_reserve_schedule("0.125:0,0.25:0.25,0.5:0.375");
  REQUIRE(schedule.size() == 3);
  CHECK(dc::math::schedule_share(schedule, 0.0625) == 0.0);
  CHECK(dc::math::schedule_share(schedule, 0.1875) == doctest::Approx(0.125));
  CHECK(dc::math::schedule_share(schedule, 0.25) == 0.25);
  CHECK(dc::math::schedule_share(schedule, 0.375) == doctest::Approx(0.3125));
  CHECK(dc::math::schedule_share(schedule, 0.75) == 0.375);
  dc::MlpPolicy scheduled = plain;
  scheduled.set_newest_query_reserve(schedule);
  CHECK(scheduled.reserve_tokens(128, 1024) == 0);
  CHECK(scheduled.reserve_tokens(256, 1024) == 64);
  CHECK(scheduled.reserve_tokens(512, 1024) == 192);
  CHECK(dc::MlpPolicy::from_checkpoint(scheduled.to_checkpoint()).newest_query_reserve() == schedule);
  CHECK(dc::describe_reserve_schedule(schedule) == "0.125:0,0.25:0.25,0.5:0.375");
  CHECK(dc::describe_reserve_schedule(dc::parse_reserve_schedule("0.3")) == "0.3");
  CHECK(dc::parse_reserve_schedule("0").empty());
  {  // At 12 tokens and a budget of 8 (fraction 2/3) the schedule gives 0.375: 3 rows reserved.
    std::vector<float> by_schedule(std::size_t(f.size));
    scheduled.score(f, 8, by_schedule);
    CHECK(std::count(by_schedule.begin(), by_schedule.end(), INFINITY) == 4 * (2 + 3));
  }
  {  // The reserve limited to layer 1: layer 0's groups score as without a reserve, layer 1's as
    // with it.
    dc::MlpPolicy layer_one = policy;
    layer_one.set_newest_query_reserve_layers(dc::parse_layer_list("1"));
    std::vector<float> limited(std::size_t(f.size));
    layer_one.score(f, 8, limited);
    for (int r = 0; r < f.size; ++r) {
      CAPTURE(r);
      const bool in_layer_one = f.groups[std::size_t(f.group[std::size_t(r)])].layer_begin == 1;
      CHECK(limited[std::size_t(r)] == (in_layer_one ? scores : h2o)[std::size_t(r)]);
    }
    CHECK(dc::MlpPolicy::from_checkpoint(layer_one.to_checkpoint()).newest_query_reserve_layers() == std::vector<int>{1});
    // Written for 4 layers: layers 2-3 are this model's layer 1 (layer_one's scores); layer 0
    // is no layer's nearest here, and a reserve list that maps to no layer means no reserve,
    // not every layer (an empty list's meaning).
    dc::MlpPolicy deeper = policy;
    deeper.set_layer_rules_depth(4);
    deeper.set_newest_query_reserve_layers({2, 3});
    std::vector<float> mapped(std::size_t(f.size));
    deeper.score(f, 8, mapped);
    CHECK(mapped == limited);
    deeper.set_newest_query_reserve_layers({0});
    deeper.score(f, 8, mapped);
    CHECK(mapped == h2o);
    CHECK(dc::MlpPolicy::from_checkpoint(policy.to_checkpoint()).newest_query_reserve_layers().empty());
    CHECK_THROWS_WITH_AS(layer_one.set_newest_query_reserve_layers({0, 0}), doctest::Contains("names a layer twice"), dc::Error);
    auto bad_layers = layer_one.to_checkpoint();
    bad_layers.extra["newest_query_reserve_layers"] = nlohmann::json::array({"x"});
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad_layers), doctest::Contains("holds \"x\", not a layer index"), dc::Error);
  }
  {  // A reserve elsewhere: layer 1 keeps the reserve of 0.25 (2 rows at a budget of 8), layer 0
    // its own, here 3 rows at this budget's fraction 2/3 (the schedule's 0.375). Each layer then
    // scores as a policy with that reserve in every layer (scores; by_schedule above).
    dc::MlpPolicy layer_one = policy;
    layer_one.set_newest_query_reserve_layers(dc::parse_layer_list("1"));
    layer_one.set_newest_query_reserve_elsewhere(schedule);
    CHECK(layer_one.reserve_elsewhere_tokens(8, 12) == 3);
    std::vector<float> two_reserves(std::size_t(f.size)), three_everywhere(std::size_t(f.size));
    layer_one.score(f, 8, two_reserves);
    dc::MlpPolicy three = policy;
    three.set_newest_query_reserve(schedule);
    three.score(f, 8, three_everywhere);
    for (int r = 0; r < f.size; ++r) {
      CAPTURE(r);
      const bool in_layer_one = f.groups[std::size_t(f.group[std::size_t(r)])].layer_begin == 1;
      CHECK(two_reserves[std::size_t(r)] == (in_layer_one ? scores : three_everywhere)[std::size_t(r)]);
    }
    // Below the schedule's first point there is none elsewhere: layer 0 scores as without a reserve.
    CHECK(layer_one.reserve_elsewhere_tokens(1, 12) == 0);
    const auto c = layer_one.to_checkpoint();
    CHECK(c.extra["newest_query_reserve_elsewhere"] ==
          nlohmann::json::array({{0.125, 0.0}, {0.25, 0.25}, {0.5, 0.375}}));
    CHECK(dc::MlpPolicy::from_checkpoint(c).newest_query_reserve_elsewhere() == schedule);
    CHECK_FALSE(layer_one.same_forced_rules(policy));
    CHECK_FALSE(policy.to_checkpoint().extra.contains("newest_query_reserve_elsewhere"));
    // Written for 4 layers: layers 2-3 are this model's layer 1, so layer 0 is elsewhere; a
    // reserve list that maps to no layer leaves every layer elsewhere.
    dc::MlpPolicy deeper = policy;
    deeper.set_layer_rules_depth(4);
    deeper.set_newest_query_reserve_layers({2, 3});
    deeper.set_newest_query_reserve_elsewhere(schedule);
    std::vector<float> mapped(std::size_t(f.size));
    deeper.score(f, 8, mapped);
    CHECK(mapped == two_reserves);
    deeper.set_newest_query_reserve_elsewhere({});
    deeper.set_newest_query_reserve_layers({0});
    deeper.set_newest_query_reserve_elsewhere(schedule);
    deeper.score(f, 8, mapped);
    CHECK(mapped == three_everywhere);
    // Without reserve layers nothing is elsewhere: refused either way round.
    CHECK_THROWS_WITH_AS(layer_one.set_newest_query_reserve_layers({}), doctest::Contains("a reserve elsewhere needs"),
                         dc::Error);
    dc::MlpPolicy everywhere = policy;
    CHECK_THROWS_WITH_AS(everywhere.set_newest_query_reserve_elsewhere(schedule),
                         doctest::Contains("a reserve elsewhere needs"), dc::Error);
    auto bad = c;
    bad.extra["newest_query_reserve_elsewhere"] = "half";
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad),
                         doctest::Contains("'newest_query_reserve_elsewhere' is neither a number"), dc::Error);
    CHECK(dc::layers_outside(std::vector<int>{1, 3}, 5) == std::vector<int>{0, 2, 4});
    CHECK(dc::layers_outside(std::vector<int>{}, 2) == std::vector<int>{0, 1});
  }
  {  // Pins guided by layer 1: the 2 positions (a quarter of 8) with the largest mean newest-query
    // mass over layer 1's KV heads (the formula; a head that evicted a position counts 0; ties to
    // the newer) score +inf in every group of both layers; every other row as without pins.
    std::vector<std::pair<float, int>> guide;
    for (int p = 0; p < 12; ++p) {
      float sum = 0.0f;
      for (int h = 0; h < 2; ++h)
        if (held(1, h, p)) sum += last(1, h, p);
      guide.push_back({sum / 2.0f, p});
    }
    std::sort(guide.begin(), guide.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second > b.second; });
    auto is_pinned = [&](int p) { return p == guide[0].second || p == guide[1].second; };
    dc::MlpPolicy pinned = plain;
    pinned.set_newest_query_pins({1}, {{1.0, 0.25}});
    CHECK(pinned.pin_tokens(8, 12) == 2);
    std::vector<float> with_pins(std::size_t(f.size));
    pinned.score(f, 8, with_pins);
    int pinned_rows = 0;
    for (int r = 0; r < f.size; ++r) {
      CAPTURE(r);
      const int p = f.position[std::size_t(r)];
      CHECK(with_pins[std::size_t(r)] == (is_pinned(p) ? INFINITY : h2o[std::size_t(r)]));
      pinned_rows += is_pinned(p) && p < 10;  // not recent: a row the pin adds
    }
    CHECK(pinned_rows > 0);  // the pins change something here
    // With the reserve too, it chooses its 2 rows among those the window and the pins left.
    dc::MlpPolicy both = policy;
    both.set_newest_query_pins({1}, {{1.0, 0.25}});
    std::vector<float> with_both(std::size_t(f.size));
    both.score(f, 8, with_both);
    for (int g = 0; g < f.num_groups(); ++g) {
      const dc::FeatureGroup& grp = f.groups[std::size_t(g)];
      int forced = 0, window_or_pin = 0;
      for (int r = grp.row_begin; r < grp.row_end; ++r) {
        forced += with_both[std::size_t(r)] == INFINITY;
        const int p = f.position[std::size_t(r)];
        window_or_pin += p >= 10 || is_pinned(p);
        if (p >= 10 || is_pinned(p)) CHECK(with_both[std::size_t(r)] == INFINITY);
      }
      CHECK(forced == window_or_pin + 2);
    }
    // The checkpoint carries both lists; the rules differ from the plain policy's.
    const auto c = pinned.to_checkpoint();
    CHECK(c.extra["newest_query_pins"] == 0.25);
    CHECK(c.extra["newest_query_pin_layers"] == nlohmann::json::array({1}));
    const dc::MlpPolicy loaded = dc::MlpPolicy::from_checkpoint(c);
    CHECK(loaded.newest_query_pin_layers() == std::vector<int>{1});
    CHECK(loaded.newest_query_pins() == std::vector<dc::SchedulePoint>{{1.0, 0.25}});
    CHECK(loaded.same_forced_rules(pinned));
    CHECK_FALSE(pinned.same_forced_rules(plain));
    CHECK(pinned.describe_forced_rules().find("pins 0.25 guided by layers 1") != std::string::npos);
    CHECK_FALSE(plain.to_checkpoint().extra.contains("newest_query_pins"));
    // Written for 4 layers: guide layers 2-3 are this model's layer 1.
    dc::MlpPolicy deeper = plain;
    deeper.set_layer_rules_depth(4);
    deeper.set_newest_query_pins({2, 3}, {{1.0, 0.25}});
    std::vector<float> mapped(std::size_t(f.size));
    deeper.score(f, 8, mapped);
    CHECK(mapped == with_pins);
    CHECK(deeper.to_checkpoint().extra["layer_rules_model_layers"] == 4);
    // Both or neither; their share and the window's below 1; a guide layer the model lacks is
    // named at scoring time; a file with one half is refused.
    CHECK_THROWS_WITH_AS(deeper.set_newest_query_pins({1}, {}), doctest::Contains("need both guide layers and shares"),
                         dc::Error);
    CHECK_THROWS_WITH_AS(deeper.set_newest_query_pins({}, {{1.0, 0.25}}), doctest::Contains("need both"), dc::Error);
    CHECK_THROWS_WITH_AS(deeper.set_newest_query_pins({1}, {{1.0, 0.8}}),
                         doctest::Contains("recent_fraction 0.25 plus newest_query_pins 0.8"), dc::Error);
    CHECK_THROWS_WITH_AS(deeper.set_newest_query_pins({4}, {{1.0, 0.25}}),
                         doctest::Contains("layer 4 named in rules for a model of 4"), dc::Error);
    dc::MlpPolicy too_deep = plain;
    too_deep.set_newest_query_pins({2}, {{1.0, 0.25}});
    CHECK_THROWS_WITH_AS(too_deep.score(f, 8, mapped), doctest::Contains("guide layer 2 named, the model has 2 layers"),
                         dc::Error);
    CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("0.5:0.1,0.25:0.2", "newest-query pins"),
                         doctest::Contains("newest-query pins: budget fractions must increase"), dc::Error);
    auto half = c;
    half.extra.erase("newest_query_pin_layers");
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(half),
                         doctest::Contains("'newest_query_pins' without 'newest_query_pin_layers'"), dc::Error);
    half = c;
    half.extra.erase("newest_query_pins");
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(half),
                         doctest::Contains("'newest_query_pin_layers' without 'newest_query_pins'"), dc::Error);
    // Window, pins and the reserve of the layers nothing raises may not fill the budget at any
    // budget fraction: 0.25 + 0.25 + 0.5 does everywhere; with the reserve elsewhere a schedule
    // (0.3 at 50 %) meets pins of 0.5 only there.
    CHECK_THROWS_WITH_AS(both.set_newest_query_pins({1}, {{1.0, 0.5}}),
                         doctest::Contains("plus newest_query_pins and the newest_query_reserve reach 1 of the budget"),
                         dc::Error);
    dc::MlpPolicy layered = policy;
    layered.set_newest_query_reserve_layers({1});
    layered.set_newest_query_reserve_elsewhere(dc::parse_reserve_schedule("0.25:0,0.5:0.3"));
    CHECK_THROWS_WITH_AS(layered.set_newest_query_pins({1}, dc::parse_reserve_schedule("0.25:0.5,0.5:0.5")),
                         doctest::Contains("newest_query_reserve_elsewhere reach 1.05 of the budget at budget fraction 0.5"),
                         dc::Error);
    layered.set_newest_query_pins({1}, dc::parse_reserve_schedule("0.25:0.5,0.5:0.1"));
    CHECK_THROWS_WITH_AS(layered.set_newest_query_reserve_elsewhere(dc::parse_reserve_schedule("0.25:0.3,0.5:0.3")),
                         doctest::Contains("reach 1.05 of the budget at budget fraction 0.25"), dc::Error);
    const auto m = dc::math::schedule_sum_max(dc::parse_reserve_schedule("0.25:0.2,0.5:0.1"),
                                              dc::parse_reserve_schedule("0.25:0,0.5:0.3"));
    CHECK(m.share == doctest::Approx(0.4));
    CHECK(m.fraction == 0.5);
    CHECK(dc::math::schedule_sum_max({}, {}).share == 0.0);
    // The top positions: ties to the newer; a count beyond them pins every one.
    const std::vector<float> mass = {1.0f, 3.0f, 3.0f, 2.0f};
    CHECK(dc::pinned_positions(mass, 1) == std::vector<char>{0, 0, 1, 0});
    CHECK(dc::pinned_positions(mass, 3) == std::vector<char>{0, 1, 1, 1});
    CHECK(dc::pinned_positions(mass, 9) == std::vector<char>{1, 1, 1, 1});
  }
  {  // Layer 1 given to the newest query: its groups keep the 8 positions with the largest layer
    // mean (from the formula, ties to the newer), whatever the window and the reserve chose; layer
    // 0's groups score as before.
    dc::MlpPolicy tova_layer = policy;
    tova_layer.set_newest_query_layers(dc::parse_layer_list("1"));
    std::vector<float> given(std::size_t(f.size));
    tova_layer.score(f, 8, given);
    for (int g = 0; g < f.num_groups(); ++g) {
      const dc::FeatureGroup& grp = f.groups[std::size_t(g)];
      const auto ranked = ranked_by_layer_mass(grp, 12);
      for (int r = grp.row_begin; r < grp.row_end; ++r) {
        CAPTURE(g);
        CAPTURE(r);
        if (grp.layer_begin == 0) {
          CHECK(given[std::size_t(r)] == scores[std::size_t(r)]);
        } else {
          const int p = f.position[std::size_t(r)];
          const bool top = std::any_of(ranked.begin(), ranked.begin() + 8, [&](auto e) { return e.second == p; });
          CHECK(given[std::size_t(r)] == (top ? INFINITY : 0.0f));
        }
      }
    }
    CHECK(dc::MlpPolicy::from_checkpoint(tova_layer.to_checkpoint()).newest_query_layers() == std::vector<int>{1});
    CHECK(dc::MlpPolicy::from_checkpoint(policy.to_checkpoint()).newest_query_layers().empty());
    {  // Written for a 4-layer model: layer 3's rule is this 2-layer model's layer 1's (its nearest
      // by depth, math/layer_depth.hpp), so the scores are tova_layer's.
      dc::MlpPolicy deeper = policy;
      deeper.set_layer_rules_depth(4);
      deeper.set_newest_query_layers({3});
      std::vector<float> mapped(std::size_t(f.size));
      deeper.score(f, 8, mapped);
      CHECK(mapped == given);
      const auto c = deeper.to_checkpoint();
      CHECK(c.extra["layer_rules_model_layers"] == 4);
      CHECK(dc::MlpPolicy::from_checkpoint(c).layer_rules_depth() == 4);
      CHECK_THROWS_WITH_AS(deeper.set_newest_query_layers({4}), doctest::Contains("layer 4 named in rules for a model of 4"),
                           dc::Error);
      CHECK_THROWS_WITH_AS(deeper.set_layer_budget_weights({1.0, 2.0}),
                           doctest::Contains("2 layer budget weights for rules written for a model of 4"), dc::Error);
      auto bad = c;
      bad.extra["layer_rules_model_layers"] = 0;
      CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("'layer_rules_model_layers' is 0, not a layer count"),
                           dc::Error);
      bad.extra["layer_rules_model_layers"] = 3;  // layer 3 listed
      CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("layer 3 named in rules for a model of 3"),
                           dc::Error);
      // Budget weights give the depth; a file with them does not repeat it.
      dc::MlpPolicy weighted = policy;
      weighted.set_layer_budget_weights({1.0, 1.0, 1.0, 1.0});
      weighted.set_newest_query_layers({3});
      CHECK(weighted.layer_rules_depth() == 4);
      CHECK(!weighted.to_checkpoint().extra.contains("layer_rules_model_layers"));
      std::vector<float> by_weights(std::size_t(f.size));
      weighted.score(f, 8, by_weights);
      CHECK(by_weights == given);
    }
    {  // Up to a budget fraction: 8 slots of `tokens` give layer 1 to the newest query while
      // 8 / tokens is at most the threshold; above it layer 1 scores as the policy without the rule.
      const double fraction = 8.0 / double(f.latest_position + 1), below = fraction * 0.99;
      dc::MlpPolicy up_to = tova_layer;
      up_to.set_newest_query_layers_up_to(fraction);
      std::vector<float> on(std::size_t(f.size)), off(std::size_t(f.size));
      up_to.score(f, 8, on);
      CHECK(on == given);
      up_to.set_newest_query_layers_up_to(below);
      up_to.score(f, 8, off);
      CHECK(off == scores);
      const auto c = up_to.to_checkpoint();
      CHECK(c.extra["newest_query_layers_up_to"].get<double>() == below);
      CHECK(dc::MlpPolicy::from_checkpoint(c).newest_query_layers_up_to() == below);
      CHECK_FALSE(tova_layer.to_checkpoint().extra.contains("newest_query_layers_up_to"));
      CHECK_FALSE(up_to.same_forced_rules(tova_layer));
      CHECK(up_to.describe_forced_rules().find("newest-query layers 1 up to 0.") != std::string::npos);
      // It needs the layers, either way round, and lies in (0, 1].
      CHECK_THROWS_WITH_AS(up_to.set_newest_query_layers({}), doctest::Contains("needs newest_query_layers"), dc::Error);
      dc::MlpPolicy no_layers = policy;
      CHECK_THROWS_WITH_AS(no_layers.set_newest_query_layers_up_to(0.5), doctest::Contains("needs newest_query_layers"),
                           dc::Error);
      CHECK_THROWS_WITH_AS(up_to.set_newest_query_layers_up_to(0.0), doctest::Contains("outside (0, 1]"), dc::Error);
      auto bad = c;
      bad.extra["newest_query_layers_up_to"] = "half";
      CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad),
                           doctest::Contains("'newest_query_layers_up_to' is not a number"), dc::Error);
      bad.extra["newest_query_layers_up_to"] = 1.5;
      CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("1.5 outside (0, 1]"), dc::Error);
      bad.extra["newest_query_layers_up_to"] = below;
      bad.extra.erase("newest_query_layers");
      CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("needs newest_query_layers"), dc::Error);
    }
    // A layer the model does not have is named at scoring time.
    tova_layer.set_newest_query_layers({1, 2});
    CHECK_THROWS_WITH_AS(tova_layer.score(f, 8, given), doctest::Contains("layer 2 named, the model has 2 layers"), dc::Error);
    CHECK_THROWS_WITH_AS(tova_layer.set_newest_query_layers({1, 1}), doctest::Contains("names a layer twice"), dc::Error);
    auto bad_layers = tova_layer.to_checkpoint();
    bad_layers.extra["newest_query_layers"] = nlohmann::json::array({0, -1});
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad_layers), doctest::Contains("holds -1, not a layer index"), dc::Error);
    bad_layers.extra["newest_query_layers"] = 3;
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad_layers), doctest::Contains("not a non-empty list"), dc::Error);
    // A shared group covers every layer: a list of some of them leaves it out.
    CHECK(dc::group_in_layers({0, 2, 0, 2, 0, 1}, std::vector<int>{0, 1}));
    CHECK_FALSE(dc::group_in_layers({0, 2, 0, 2, 0, 1}, std::vector<int>{1}));
    CHECK(dc::group_in_layers({0, 2, 0, 2, 0, 1}, std::vector<int>{}));
  }
  CHECK(dc::parse_layer_list("8-10,3,9") == std::vector<int>{3, 8, 9, 10});
  CHECK(dc::parse_layer_list("none").empty());
  CHECK(dc::describe_layer_list(dc::parse_layer_list("8-10,3,12")) == "3,8-10,12");
  CHECK(dc::describe_layer_list({}) == "none");
  CHECK_THROWS_WITH_AS(dc::parse_layer_list("4-2"), doctest::Contains("range '4-2' ends before it begins"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_list("1,x"), doctest::Contains("'x' is not a layer index"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_list("-3"), doctest::Contains("'' is not a layer index"), dc::Error);
  // Budget weights per layer: LAYERS=WEIGHT items (others 1) or one weight per layer.
  CHECK(dc::parse_layer_budget_weights("1-2=1.5,4=0.5", 6) == std::vector<double>{1, 1.5, 1.5, 1, 0.5, 1});
  CHECK(dc::parse_layer_budget_weights("2,1,3", 3) == std::vector<double>{2, 1, 3});
  CHECK(dc::parse_layer_budget_weights("2,1,3", 0) == std::vector<double>{2, 1, 3});
  CHECK(dc::parse_layer_budget_weights("none", 6).empty());
  CHECK(dc::describe_layer_budget_weights(dc::parse_layer_budget_weights("4=0.5,1-2=1.5", 6)) == "1-2=1.5,4=0.5");
  CHECK(dc::describe_layer_budget_weights(std::vector<double>{2, 3}) == "2,3");
  CHECK(dc::describe_layer_budget_weights(std::vector<double>{1, 1}) == "1,1");
  CHECK(dc::describe_layer_budget_weights({}) == "none");
  for (const char* text : {"1-2=1.5,4=0.5", "2,1,3,1,1,1", "0-5=2"})  // describe reads back as what it describes
    CHECK(dc::parse_layer_budget_weights(dc::describe_layer_budget_weights(dc::parse_layer_budget_weights(text, 6)), 6) ==
          dc::parse_layer_budget_weights(text, 6));
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1,2", 3), doctest::Contains("2 weights; the model has 3 layers"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1=2", 0), doctest::Contains("needs the model's layer count"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1=2,7=3", 6), doctest::Contains("layer 7 named; the model has 6"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1-3=2,3=1", 6), doctest::Contains("layer 3 is named twice"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1=2,3", 6), doctest::Contains("'3' is not LAYERS=WEIGHT"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1=x", 6), doctest::Contains("'x' is not a number"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1=0", 6), doctest::Contains("the budget weight of layer 1 is 0"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("1,nan", 2), doctest::Contains("must be positive and finite"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_layer_budget_weights("3-1=2", 6), doctest::Contains("range '3-1' ends before it begins"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("0.5:0.1,0.25:0.2"), doctest::Contains("must increase, 0.25 follows 0.5"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("0.25:x"), doctest::Contains("'x' is not a number"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("0.25:0.1,0.5"), doctest::Contains("is not FRACTION:SHARE"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("1.5:0.1"), doctest::Contains("fraction 1.5 outside (0, 1]"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_reserve_schedule("0.5:1"), doctest::Contains("share 1 outside [0, 1)"), dc::Error);
  CHECK_THROWS_WITH_AS(policy.set_newest_query_reserve(0.75), doctest::Contains("their sum must be below 1"), dc::Error);
  CHECK_THROWS_WITH_AS(policy.set_recent_fraction(0.8), doctest::Contains("their sum must be below 1"), dc::Error);
  CHECK_THROWS_WITH_AS(policy.set_newest_query_reserve(-0.1), doctest::Contains("outside [0, 1)"), dc::Error);
  auto bad = policy.to_checkpoint();
  bad.extra["newest_query_reserve"] = "half";
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("neither a number nor"), dc::Error);
  bad.extra["newest_query_reserve"] = nlohmann::json::array({nlohmann::json::array({0.5})});
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad), doctest::Contains("holds [0.5], not a [fraction, share] pair"), dc::Error);
  {  // Rules per layer written for 4 layers and left out on this 2-layer model, where the file
    // says so: budget weights, reserve layers with their reserve and one elsewhere, a newest-query
    // layer, pins. Scored as the policy without them (plain: its window alone); mapped by depth
    // (the default) they change the scores. A reserve in every layer (no list) is no rule per
    // layer and stays (policy's scores).
    dc::MlpPolicy deeper = plain;
    deeper.set_layer_budget_weights({1.0, 1.0, 3.0, 3.0});
    deeper.set_newest_query_reserve(0.25);
    deeper.set_newest_query_reserve_layers({2, 3});
    deeper.set_newest_query_reserve_elsewhere(schedule);
    deeper.set_newest_query_layers({3});
    deeper.set_newest_query_pins({3}, dc::parse_reserve_schedule("0.125"));
    CHECK(deeper.maps_layer_rules());
    std::vector<float> mapped(std::size_t(f.size)), dropped(std::size_t(f.size));
    deeper.score(f, 8, mapped);
    CHECK(mapped != h2o);
    deeper.set_map_layer_rules(false);
    deeper.score(f, 8, dropped);
    CHECK(dropped == h2o);
    dc::MlpPolicy everywhere = policy;
    everywhere.set_layer_rules_depth(4);
    everywhere.set_newest_query_layers({3});
    everywhere.set_map_layer_rules(false);
    everywhere.score(f, 8, dropped);
    std::vector<float> reserved_everywhere(std::size_t(f.size));
    policy.score(f, 8, reserved_everywhere);
    CHECK(dropped == reserved_everywhere);
    CHECK(dropped != h2o);
    // The checkpoint says "drop"; a file without the key maps; anything else is named.
    const auto c = deeper.to_checkpoint();
    CHECK(c.extra["layer_rules_on_other_models"] == "drop");
    CHECK_FALSE(dc::MlpPolicy::from_checkpoint(c).maps_layer_rules());
    CHECK_FALSE(plain.to_checkpoint().extra.contains("layer_rules_on_other_models"));
    CHECK(dc::MlpPolicy::from_checkpoint(plain.to_checkpoint()).maps_layer_rules());
    auto bad_rules = c;
    bad_rules.extra["layer_rules_on_other_models"] = "keep";
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad_rules), doctest::Contains("'keep' is neither 'map' nor 'drop'"),
                         dc::Error);
    bad_rules.extra["layer_rules_on_other_models"] = 1;
    CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(bad_rules),
                         doctest::Contains("'layer_rules_on_other_models' is not a string"), dc::Error);
  }
}

TEST_CASE("warm start targets: sums of inputs, H2O's score, and max: floors") {
  using dc::PolicyInput;
  const std::vector<PolicyInput> in = {PolicyInput::alpha, PolicyInput::position, PolicyInput::layer_last_alpha};
  const std::vector<float> row = {1.5f, 0.75f, 3.0f};
  const float h2o = dc::math::h2o_score_from_inputs(1.5f, 0.75f);  // 1.5 + log(0.25)
  CHECK(dc::WarmStartTarget("alpha=2,layer_last_alpha=-1", in)(row) == doctest::Approx(0.0f));
  CHECK(dc::WarmStartTarget("h2o", in)(row) == doctest::Approx(1.5 + std::log(0.25)));
  CHECK(dc::WarmStartTarget("h2o,layer_last_alpha=4", in)(row) == doctest::Approx(h2o + 12.0f));
  // max: the H2O score unless the input plus the offset is larger.
  CHECK(dc::WarmStartTarget("h2o,max:layer_last_alpha=2", in)(row) == doctest::Approx(5.0f));
  CHECK(dc::WarmStartTarget("h2o,max:layer_last_alpha=-3", in)(row) == doctest::Approx(h2o));
  CHECK(dc::WarmStartTarget(",h2o,,max:alpha=0", in)(row) == doctest::Approx(1.5f));  // empty terms skipped
  // With budget_age among the inputs, h2o also keeps the newest half of the budget first.
  const std::vector<PolicyInput> aged = {PolicyInput::alpha, PolicyInput::position, PolicyInput::budget_age};
  CHECK(dc::WarmStartTarget("h2o", aged)(std::vector<float>{1.5f, 0.75f, -1.0f}) ==
        doctest::Approx(h2o + dc::math::kH2ORecentBonus));
  CHECK(dc::WarmStartTarget("h2o", aged)(std::vector<float>{1.5f, 0.75f, -0.5f}) == doctest::Approx(h2o));
  // Bad specifications, each named.
  auto fails = [&](const char* spec, const char* message) {
    CAPTURE(spec);
    CHECK_THROWS_WITH_AS(dc::WarmStartTarget(spec, in), doctest::Contains(message), dc::Error);
  };
  fails("alpha", "'alpha' is not INPUT=COEFFICIENT");
  fails("max:alpha", "'alpha' is not max:INPUT=OFFSET");
  fails("colour=1", "unknown policy input 'colour'");
  fails("entropy=1", "needs the input 'entropy'");
  fails("alpha=x", "'alpha=x' has no finite number");
  fails("alpha=", "'alpha=' has no finite number");
  fails("alpha=inf", "'alpha=inf' has no finite number");
  fails("max:position=1e999", "has no finite number");
  CHECK_THROWS_WITH_AS(dc::WarmStartTarget("h2o", std::vector<PolicyInput>{PolicyInput::alpha}),
                       doctest::Contains("h2o needs the input 'position'"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::WarmStartTarget("alpha=1", in)(std::vector<float>{1.0f}),
                       doctest::Contains("a row of 1 inputs for a target of 3"), dc::Error);
}

TEST_CASE("MlpPolicy scores rows with its MLP and rejects an inconsistent construction") {
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8, 8}, 7);
  CHECK(policy.name() == "distillcache");
  CHECK(policy.layout().parameters() == std::int64_t(policy.params().size()));
  CHECK_THROWS_WITH_AS(dc::MlpPolicy(dc::paper_policy_inputs(), dc::MlpLayout(6, {8}),
                                     std::vector<float>(std::size_t(dc::MlpLayout(6, {8}).parameters()))),
                       doctest::Contains("takes 6 inputs, the policy gives it 5"), dc::Error);
  std::vector<float> bad(std::size_t(dc::MlpLayout(5, {8}).parameters()), 0.0f);
  bad[3] = NAN;
  CHECK_THROWS_WITH_AS(dc::MlpPolicy(dc::paper_policy_inputs(), dc::MlpLayout(5, {8}), bad),
                       doctest::Contains("parameters"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::parse_policy_input("alpha2"), doctest::Contains("unknown policy input 'alpha2'"), dc::Error);
}

TEST_CASE("inference scores (inputs built into tiles) give the trainer's inputs-then-MLP bits") {
  // Head granularity, 2 layers x 3 KV heads, groups of 1, 31, 32, 33, 100 and 5000 rows (short
  // tiles, whole tiles, one tile past), each holding its own positions of [0, 6000); random
  // features; every input; a one-hidden-layer and a two-hidden-layer MLP, silu and relu.
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.latest_position = 5999;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const int sizes[] = {1, 31, 32, 33, 100, 5000};
  for (int g = 0; g < 6; ++g) {
    std::vector<int> positions(6000);
    for (int p = 0; p < 6000; ++p) positions[std::size_t(p)] = p;
    std::shuffle(positions.begin(), positions.end(), rng);
    positions.resize(std::size_t(sizes[g]));
    std::sort(positions.begin(), positions.end());
    const int begin = f.size;
    for (int p : positions) {
      const float row[dc::kNumFeatures] = {unit(rng) * 0.01f, 0.5f + unit(rng), unit(rng) * 1e-4f,
                                           unit(rng) * 5.0f, float(p) / 5999.0f};
      f.append_features(row);
      f.group.push_back(g);
      f.slot.push_back(f.size - begin);
      f.position.push_back(p);
      f.accumulated_mass.push_back(1.0f);
      f.last_query_mass.push_back(unit(rng) < 0.1f ? 0.0f : unit(rng) * 0.01f);
      f.key_norm.push_back(1.0f);
      f.expected_attention.push_back(0.0f);
      ++f.size;
    }
    f.groups.push_back({g / 3, g / 3 + 1, g % 3, g % 3 + 1, begin, f.size});
  }
  f.validate();
  std::vector<dc::PolicyInput> all;
  for (int i = 0; i < dc::kNumPolicyInputs; ++i) all.push_back(dc::PolicyInput(i));
  {  // The vectorised columns give the scalar formulas' bits (head_variance's square root in vector
     // instructions, entropy over log n computed once per group).
    const std::vector<dc::PolicyInput> two = {dc::PolicyInput::head_variance, dc::PolicyInput::entropy};
    const auto x = dc::policy_inputs(f, two, 700);
    for (int r = 0; r < f.size; ++r) {
      const int n = f.groups[std::size_t(f.group[std::size_t(r)])].rows();
      CAPTURE(r);
      CHECK(x[std::size_t(r) * 2] == dc::math::input_log_relative_spread(f.feature(r, dc::Feature::head_variance), n));
      CHECK(x[std::size_t(r) * 2 + 1] == dc::math::input_relative_entropy(f.feature(r, dc::Feature::entropy), n));
    }
  }
  for (const auto& hidden : {std::vector<int>{16}, std::vector<int>{32, 32}})
    for (dc::Activation act : {dc::Activation::silu, dc::Activation::relu}) {
      const dc::MlpLayout L(int(all.size()), hidden, act);
      const auto p = random_params(L, 21);
      const auto x = dc::policy_inputs(f, all, 700);
      std::vector<float> expected(std::size_t(f.size)), got(std::size_t(f.size), NAN);
      dc::mlp_forward(kCpu, L, p.data(), x.data(), f.size, expected.data(), nullptr);
      dc::mlp_policy_scores(f, all, 700, L, p.data(), got);
      CAPTURE(hidden.size());
      CHECK(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)) == 0);
      // A recent window: its rows +inf (whole tiles of them skip the MLP), the others unchanged.
      for (int recent : {1, 350, 6000}) {
        CAPTURE(recent);
        std::vector<float> windowed = expected;
        int in_window = 0;
        for (int r = 0; r < f.size; ++r)
          if (f.position[std::size_t(r)] > f.latest_position - recent) windowed[std::size_t(r)] = INFINITY, ++in_window;
        CHECK(in_window > 0);
        std::fill(got.begin(), got.end(), NAN);
        dc::mlp_policy_scores(f, all, 700, L, p.data(), got, recent);
        CHECK(std::memcmp(windowed.data(), got.data(), windowed.size() * sizeof(float)) == 0);
      }
    }
  {  // Scattered open rows (what the reserves leave: gathered tiles) and runs of them (read in
     // place) get the bits the MLP gives them among all rows, with the H2O base too; +inf rows
     // stay +inf.
    const dc::MlpLayout L(int(all.size()), {32, 32}, dc::Activation::silu);
    const auto p = random_params(L, 29);
    for (dc::ScoreBase base : {dc::ScoreBase::none, dc::ScoreBase::h2o}) {
      std::vector<float> expected(std::size_t(f.size)), got(std::size_t(f.size));
      dc::mlp_policy_scores(f, all, 700, L, p.data(), expected, 0, base);
      std::mt19937 pick(31);
      for (int r = 0; r < f.size; ++r) {
        const bool in_run = (r / 40) % 3 == 0;  // runs of open rows, then scattered ones
        got[std::size_t(r)] = in_run || pick() % 3 == 0 ? 0.0f : INFINITY;
      }
      const std::vector<float> closed = got;
      dc::mlp_score_open_rows(f, all, 700, L, p.data(), got, base);
      int open = 0;
      for (int r = 0; r < f.size; ++r) {
        CAPTURE(r);
        if (closed[std::size_t(r)] == INFINITY) {
          CHECK(got[std::size_t(r)] == INFINITY);
          continue;
        }
        ++open;
        CHECK(std::memcmp(&got[std::size_t(r)], &expected[std::size_t(r)], sizeof(float)) == 0);
      }
      CHECK(open > 0);
      CHECK(open < f.size);
    }
  }
  {  // Layer by layer (rules_then_mlp.hpp) gives the bits of the steps one after the other: the
     // window, pins (600 positions guided by layer 0, which the pass computes while it scores a
     // layer that reads none), a reserve in each layer (two reserves), a layer given to the
     // newest query (its groups' keep-sets by give_layers_to_newest_query, 0 or 60 rows), 1 and
     // 2 threads.
    const dc::MlpLayout L(int(all.size()), {16}, dc::Activation::relu);
    const auto p = random_params(L, 37);
    const std::vector<int> layer0 = {0}, layer1 = {1};
    const dc::NewestQueryPinRule pins{layer0, 600};
    const std::vector<char> pinned = dc::newest_query_pinned_positions(f, pins.count, pins.guide);
    REQUIRE(std::count(pinned.begin(), pinned.end(), 1) == 600);
    const std::vector<dc::NewestQueryReserve> reserves = {{layer0, 40}, {layer1, 7}};
    for (const std::vector<int>& newest_layers : {std::vector<int>(), layer1})
      for (int newest_rows : {0, 60}) {
        std::vector<char> newest;
        if (!newest_layers.empty())
          for (const dc::FeatureGroup& g : f.groups) newest.push_back(dc::group_in_layers(g, newest_layers) ? 1 : 0);
        std::vector<float> expected(std::size_t(f.size));
        dc::mark_forced_rows(f, 900, pinned, newest, expected);
        dc::reserve_newest_query_rows(f, reserves, expected, newest);
        dc::mlp_score_open_rows(f, all, 700, L, p.data(), expected, dc::ScoreBase::h2o, newest);
        dc::give_layers_to_newest_query(f, newest_rows, newest_layers, expected);
        CHECK(std::count(expected.begin(), expected.end(), INFINITY) > 0);
        for (int threads : {1, 2}) {
          const std::vector<float> got = dc_test::with_threads(threads, [&] {
            std::vector<float> s(std::size_t(f.size), NAN);
            const dc::OpenRowScorer mlp(f, all, 700, L, p.data(), dc::ScoreBase::h2o);
            dc::score_rules_then_mlp(f, 900, pins, reserves, {newest, newest_rows}, mlp, s);
            return s;
          });
          CAPTURE(threads);
          CAPTURE(newest.size());
          CAPTURE(newest_rows);
          CHECK(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)) == 0);
        }
      }
    // Pins that cannot be computed (a guide layer past the model's) throw from the pass, whichever
    // thread computed them.
    const std::vector<int> layer5 = {5};
    for (int threads : {1, 2})
      dc_test::with_threads(threads, [&] {
        std::vector<float> s(std::size_t(f.size), NAN);
        const dc::OpenRowScorer mlp(f, all, 700, L, p.data(), dc::ScoreBase::h2o);
        CHECK_THROWS_WITH_AS(dc::score_rules_then_mlp(f, 900, {layer5, 10}, reserves, {}, mlp, s),
                             doctest::Contains("guide layer 5 named, the model has 2 layers"), dc::Error);
        return 0;
      });
  }
  {  // Inputs no first-layer weight reads are not built: the same bits as building every one.
    const dc::MlpLayout L(int(all.size()), {16, 8}, dc::Activation::relu);
    auto p = random_params(L, 23);
    for (int o = 0; o < 16; ++o)
      for (int i : {0, 3, 4, 6, 9}) p[std::size_t(L.weight_offset(0) + o * L.inputs + i)] = 0.0f;
    const auto x = dc::policy_inputs(f, all, 700);
    std::vector<float> expected(std::size_t(f.size)), got(std::size_t(f.size), NAN);
    dc::mlp_forward(kCpu, L, p.data(), x.data(), f.size, expected.data(), nullptr);
    dc::mlp_policy_scores(f, all, 700, L, p.data(), got);
    CHECK(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)) == 0);
  }
  // The policy's own scores are these, with its recent window (the newest half of the budget).
  auto policy = dc::MlpPolicy::initialised(all, {16}, 3);
  policy.set_recent_fraction(0.5);
  std::vector<float> scores(std::size_t(f.size)), direct(std::size_t(f.size));
  policy.score(f, 700, scores);
  dc::mlp_policy_scores(f, all, 700, policy.layout(), policy.params().data(), direct, 350);
  CHECK(std::memcmp(scores.data(), direct.data(), scores.size() * sizeof(float)) == 0);
  CHECK(std::count(scores.begin(), scores.end(), INFINITY) > 0);
  CHECK_THROWS_WITH_AS(dc::mlp_policy_scores(f, dc::paper_policy_inputs(), 700, policy.layout(),
                                             policy.params().data(), direct),
                       doctest::Contains("the MLP takes 10 inputs, 5 asked for"), dc::Error);
}

TEST_CASE("leave-one-out advantages") {
  const std::vector<double> g = {-1.0, -2.0, -3.0};
  const auto a = dc::leave_one_out_advantages(g);
  CHECK(a[0] == doctest::Approx(-1.0 - (-2.5)));
  CHECK(a[1] == doctest::Approx(-2.0 - (-2.0)));
  CHECK(a[2] == doctest::Approx(-3.0 - (-1.5)));
  double sum = 0.0;
  for (double x : a) sum += x;
  CHECK(sum == doctest::Approx(0.0).scale(1.0));  // the baseline is unbiased: advantages sum to 0
  const auto s = dc::leave_one_out_advantages(g, true);
  CHECK(s[0] == doctest::Approx(a[0] / std::sqrt(2.0 / 3.0)));
  CHECK_THROWS_WITH_AS(dc::leave_one_out_advantages(std::vector<double>{1.0}),
                       doctest::Contains("at least 2 rollouts"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::leave_one_out_advantages(std::vector<double>{1.0, NAN}),
                       doctest::Contains("a return is nan"), dc::Error);
}

TEST_CASE("exp_fast: within 5e-7 of exp over the range, clamped outside it; the loops agree with the scalar") {
  double worst = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(dc::math::exp_fast(x)) - want) / want);
  }
  MESSAGE("exp_fast worst relative error " << worst);
  CHECK(worst < 5e-7);
  CHECK(std::isfinite(dc::math::exp_fast(1e30f)));
  CHECK(dc::math::exp_fast(-1e30f) >= 0.0f);
  CHECK(dc::math::exp_fast(-1e30f) < 1e-37f);
  CHECK(std::isfinite(dc::math::activate(dc::Activation::silu, -1e30f)));
  // activate_all / activate_backward_all (the vectorised loops) give the scalar functions'
  // values (to the rounding of a contracted FMA).
  const std::vector<float> z = {-1e30f, -100.0f, -3.5f, -0.0f, 0.0f, 0.7f, 20.0f, 95.0f, 1e30f};
  const std::vector<float> g(z.size(), 1.5f);
  for (auto a : {dc::Activation::silu, dc::Activation::tanh, dc::Activation::relu}) {
    std::vector<float> out(z.size()), dz(z.size());
    dc::math::activate_all(a, z.data(), out.data(), int(z.size()));
    dc::math::activate_backward_all(a, z.data(), g.data(), dz.data(), int(z.size()));
    for (std::size_t i = 0; i < z.size(); ++i) {
      CHECK(out[i] == doctest::Approx(dc::math::activate(a, z[i])).epsilon(1e-6));
      CHECK(dz[i] == doctest::Approx(1.5f * dc::math::activate_derivative(a, z[i])).epsilon(1e-6));
    }
  }
}

TEST_CASE("h2o_score_from_inputs orders tokens as H2O's summed mass does") {
  // n prompt tokens, every query observed: token i is seen by n - i queries, so its summed mass
  // is mean * (n - i). The score differences must be the log-ratios of the sums.
  const int n = 400;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mean(0.1f / n, 5.0f / n);
  auto score = [&](float m, int i) {
    return dc::math::h2o_score_from_inputs(dc::math::input_log_relative_mass(m, n), float(i) / float(n - 1));
  };
  for (int trial = 0; trial < 200; ++trial) {
    const int i = int(rng() % 350), j = int(rng() % 350);
    const float mi = mean(rng), mj = mean(rng);
    const double want = std::log(double(mi) * (n - i)) - std::log(double(mj) * (n - j));
    CHECK(double(score(mi, i) - score(mj, j)) == doctest::Approx(want).epsilon(0.02).scale(1.0));
  }
}

namespace {

// Two KV-head groups of 300 rows over positions [0, 300), every feature random and every
// accumulated mass distinct (spaced far beyond log_poly's 2 ulps), so that H2O's ranking has no
// ties to break.
dc::TokenFeatures distinct_mass_features() {
  dc::TokenFeatures f;
  f.granularity = dc::Granularity::head;
  f.latest_position = 299;
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int g = 0; g < 2; ++g) {
    std::vector<float> masses(300);
    for (int i = 0; i < 300; ++i) masses[std::size_t(i)] = 0.01f * float(i + 1) * (g + 1);
    std::shuffle(masses.begin(), masses.end(), rng);
    const int begin = f.size;
    for (int p = 0; p < 300; ++p) {
      const float row[dc::kNumFeatures] = {unit(rng) * 0.01f, 0.5f + unit(rng), unit(rng) * 1e-4f,
                                           unit(rng) * 5.0f, float(p) / 299.0f};
      f.append_features(row);
      f.group.push_back(g);
      f.slot.push_back(p);
      f.position.push_back(p);
      f.accumulated_mass.push_back(masses[std::size_t(p)]);
      f.last_query_mass.push_back(unit(rng) * 0.01f);
      f.key_norm.push_back(1.0f);
      f.expected_attention.push_back(0.0f);
      ++f.size;
    }
    f.groups.push_back({0, 1, g, g + 1, begin, f.size});
  }
  f.validate();
  return f;
}

}  // namespace

TEST_CASE("an H2O score base: log(accumulated mass) + the MLP; a zero output layer keeps H2O's keep-sets") {
  const dc::TokenFeatures f = distinct_mass_features();
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {16, 8}, 4, dc::Activation::relu);
  policy.set_score_base(dc::ScoreBase::h2o);
  std::vector<float> scores(std::size_t(f.size)), expected(std::size_t(f.size));
  {  // Random weights: the MLP's output plus the base, the same bits on the trainer's path.
    const auto x = dc::policy_inputs(f, policy.inputs(), 100);
    dc::mlp_forward(kCpu, policy.layout(), policy.params().data(), x.data(), f.size, expected.data(), nullptr);
    for (int r = 0; r < f.size; ++r) expected[std::size_t(r)] += dc::math::h2o_base_score(f.accumulated_mass[std::size_t(r)]);
    policy.score(f, 100, scores);
    CHECK(std::memcmp(expected.data(), scores.data(), scores.size() * sizeof(float)) == 0);
    std::vector<float> inputs, forward(std::size_t(f.size));
    policy.forward(f, 100, inputs, forward);
    CHECK(std::memcmp(expected.data(), forward.data(), forward.size() * sizeof(float)) == 0);
    // The base is the log of the mass: two rows' base scores differ by the log of their ratio.
    CHECK(double(dc::math::h2o_base_score(2.5f) - dc::math::h2o_base_score(0.01f)) ==
          doctest::Approx(std::log(250.0)).epsilon(1e-6));
    CHECK(std::isfinite(dc::math::h2o_base_score(0.0f)));  // no query saw the row: a floor, not -inf
    // Written as a select after the logarithm (so that its loop vectorises), it is still
    // log(max(mass, 1e-30)) bit for bit, at and around the floor and at the odd values too.
    const float floor = 1e-30f;
    for (float m : {0.0f, -0.0f, -1.0f, 1e-45f, 1e-38f, std::nextafter(floor, 0.0f), floor,
                    std::nextafter(floor, 1.0f), 1e-20f, 0.5f, 1.0f, 3.0e38f, INFINITY, -INFINITY, NAN}) {
      CAPTURE(m);
      const float want = dc::math::log_poly(m > floor ? m : floor);
      const float got = dc::math::h2o_base_score(m);
      CHECK(std::memcmp(&want, &got, sizeof(float)) == 0);
    }
  }
  // A zero output layer: H2O's keep-sets, recent half and all, at every budget.
  policy.zero_output_layer();
  policy.set_recent_fraction(0.5);
  dc::H2OPolicy h2o(0.5);
  std::vector<float> h2o_scores(std::size_t(f.size));
  for (int budget : {1, 2, 37, 150, 299}) {
    CAPTURE(budget);
    policy.score(f, budget, scores);
    h2o.score(f, budget, h2o_scores);
    CHECK(dc::select_keep_groups(scores, f, budget) == dc::select_keep_groups(h2o_scores, f, budget));
  }
  // The base travels in the checkpoint; a file naming an unknown one, or not a name, is refused.
  CHECK(dc::MlpPolicy::from_checkpoint(policy.to_checkpoint()).score_base() == dc::ScoreBase::h2o);
  CHECK(dc::MlpPolicy::from_checkpoint(dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 3)
                                           .to_checkpoint()).score_base() == dc::ScoreBase::none);
  auto c = policy.to_checkpoint();
  c.extra["score_base"] = "snapkv";
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(c), doctest::Contains("unknown score base 'snapkv'"), dc::Error);
  c.extra["score_base"] = 1;
  CHECK_THROWS_WITH_AS(dc::MlpPolicy::from_checkpoint(c), doctest::Contains("'score_base' is not a string"), dc::Error);
}

TEST_CASE("a linear correction's inference (its first unit alone) gives the whole network's bits") {
  const dc::TokenFeatures f = distinct_mass_features();
  std::vector<dc::PolicyInput> inputs = dc::paper_policy_inputs();
  inputs.push_back(dc::PolicyInput::last_alpha);
  const auto x = dc::policy_inputs(f, inputs, 100);
  // Weights of both signs and zeros (an input whose weight is 0 is not built at all), and w = 0,
  // whose every output is a zero: the network's is +0.
  const std::vector<std::vector<float>> weights = {
      {0.0f, 1.625f, 0.5f, 0.0f, 0.4375f, 0.0f}, {0.75f, -1.5f, 0.25f, 2.0f, -0.125f, 3.0f}, std::vector<float>(6, 0.0f)};
  for (const std::vector<int>& hidden : {std::vector<int>{2}, std::vector<int>{3, 2}, std::vector<int>{2, 2, 4}})
    for (const std::vector<float>& w : weights) {
      CAPTURE(hidden.size());
      CAPTURE(w[1]);
      const dc::MlpLayout layout(int(inputs.size()), hidden, dc::Activation::relu);
      const auto params = dc::linear_correction_params(layout, w);
      REQUIRE(dc::is_linear_correction(layout, params));
      std::vector<float> network(std::size_t(f.size)), got(std::size_t(f.size), NAN);
      dc::mlp_forward(kCpu, layout, params.data(), x.data(), f.size, network.data(), nullptr);
      for (dc::ScoreBase base : {dc::ScoreBase::none, dc::ScoreBase::h2o}) {
        std::vector<float> expected = network;
        dc::add_score_base(base, f.accumulated_mass.data(), f.size, expected.data());
        std::fill(got.begin(), got.end(), NAN);
        dc::mlp_policy_scores(f, inputs, 100, layout, params.data(), got, 0, base);
        CHECK(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)) == 0);
        // Open rows scattered among forced ones (a recent window and pinned positions), so that
        // runs of open rows are gathered, or with few forced rows scored in place: each open row
        // keeps its bits, on the step-by-step path and on the layer-by-layer one
        // (policy/rules_then_mlp.hpp).
        for (const std::pair<int, int>& window_and_pins : {std::pair{50, 3}, std::pair{10, 10}}) {
          // (not a structured binding: clang 15 cannot capture one in the lambda below)
          const int recent = window_and_pins.first, pin_every = window_and_pins.second;
          CAPTURE(recent);
          std::vector<char> pinned(std::size_t(f.latest_position) + 1, 0);
          for (std::size_t p = 0; p < pinned.size(); p += std::size_t(pin_every)) pinned[p] = 1;
          const auto check_open_rows = [&] {
            int open = 0;
            for (int r = 0; r < f.size; ++r) {
              const int p = f.position[std::size_t(r)];
              if (p > f.latest_position - recent || pinned[std::size_t(p)]) {
                REQUIRE(got[std::size_t(r)] == INFINITY);
              } else {
                ++open;
                REQUIRE(std::memcmp(&expected[std::size_t(r)], &got[std::size_t(r)], sizeof(float)) == 0);
              }
            }
            return double(open) / f.size;
          };
          std::fill(got.begin(), got.end(), NAN);
          dc::mlp_policy_scores(f, inputs, 100, layout, params.data(), got, recent, base, pinned);
          const double open_share = check_open_rows();
          CHECK(open_share < 0.9);
          CHECK((open_share < 0.75) == (pin_every == 3));  // both ways of scoring open rows
          // The pass computes its pins itself: as many positions, guided by the one layer.
          const std::vector<int> layer0 = {0};
          const int pins = int(std::count(pinned.begin(), pinned.end(), 1));
          pinned = dc::newest_query_pinned_positions(f, pins, layer0);
          std::fill(got.begin(), got.end(), NAN);
          const dc::OpenRowScorer scorer(f, inputs, 100, layout, params.data(), base);
          dc::score_rules_then_mlp(f, recent, {layer0, pins}, {}, {}, scorer, got);
          CHECK((check_open_rows() < 0.75) == (pin_every == 3));
        }
      }
      // Any other block is scored by the whole network: one more nonzero weight, a changed
      // pass-through, a bias.
      for (std::size_t at : {std::size_t(layout.weight_offset(0) + layout.inputs + 1),
                             std::size_t(layout.bias_offset(0)), std::size_t(layout.weight_offset(1))}) {
        CAPTURE(at);
        auto other = params;
        other[at] += 0.5f;
        CHECK_FALSE(dc::is_linear_correction(layout, other));
        std::vector<float> whole(std::size_t(f.size));
        dc::mlp_forward(kCpu, layout, other.data(), x.data(), f.size, whole.data(), nullptr);
        std::fill(got.begin(), got.end(), NAN);
        dc::mlp_policy_scores(f, inputs, 100, layout, other.data(), got);
        CHECK(std::memcmp(whole.data(), got.data(), whole.size() * sizeof(float)) == 0);
      }
    }
  const dc::MlpLayout silu(int(inputs.size()), {2}, dc::Activation::silu);
  CHECK_FALSE(dc::is_linear_correction(silu, std::vector<float>(std::size_t(silu.parameters()), 0.0f)));
  const dc::MlpLayout narrow(int(inputs.size()), {2, 1}, dc::Activation::relu);
  CHECK_FALSE(dc::is_linear_correction(narrow, std::vector<float>(std::size_t(narrow.parameters()), 0.0f)));
}

TEST_CASE("a linear correction: the ReLU MLP computes w . x, and on the H2O base w on value_norm is attention x value norm") {
  const dc::TokenFeatures f = distinct_mass_features();
  const auto inputs = dc::paper_policy_inputs();
  const std::vector<float> w = {0.75f, -1.5f, 0.25f, 2.0f, -0.125f};
  const auto x = dc::policy_inputs(f, inputs, 100);
  for (const std::vector<int>& hidden : {std::vector<int>{2}, std::vector<int>{16, 8}, std::vector<int>{3, 2, 5}}) {
    CAPTURE(hidden.size());
    const dc::MlpLayout layout(int(inputs.size()), hidden, dc::Activation::relu);
    const auto params = dc::linear_correction_params(layout, w);
    CHECK(dc::linear_correction_weights(layout, params) == w);
    std::vector<float> out(std::size_t(f.size));
    dc::mlp_forward(kCpu, layout, params.data(), x.data(), f.size, out.data(), nullptr);
    int negative = 0;
    for (int r = 0; r < f.size; ++r) {  // against w . x in double: float's rounding of the sum only
      double dot = 0.0, magnitude = 0.0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        dot += double(w[i]) * double(x[std::size_t(r) * w.size() + i]);
        magnitude += std::abs(double(w[i]) * double(x[std::size_t(r) * w.size() + i]));
      }
      negative += dot < 0.0;
      CHECK(std::abs(double(out[std::size_t(r)]) - dot) <= 1e-6 * (magnitude + 1.0));
    }
    CHECK(negative > 0);  // both halves of relu(w . x) - relu(-w . x) were exercised
    CHECK(negative < f.size);
  }
  // On the H2O base with w = value_norm only, the scores order rows as mass x relative value
  // norm does (the value-aware H2O variant): log(m) + log(v / mean v + eps).
  auto policy = dc::MlpPolicy::initialised(inputs, {16, 8}, 4, dc::Activation::relu);
  policy.set_score_base(dc::ScoreBase::h2o);
  const std::vector<float> vn = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  const auto params = dc::linear_correction_params(policy.layout(), vn);
  std::copy(params.begin(), params.end(), policy.params().begin());
  std::vector<float> scores(std::size_t(f.size));
  policy.score(f, 100, scores);
  for (int r = 0; r < f.size; ++r) {
    const double expected = std::log(double(f.accumulated_mass[std::size_t(r)])) + double(x[std::size_t(r) * 5 + 1]);
    CHECK(double(scores[std::size_t(r)]) == doctest::Approx(expected).epsilon(1e-5));
  }
  // What cannot carry it is refused.
  CHECK_THROWS_WITH_AS(dc::linear_correction_params(dc::MlpLayout(5, {16, 8}, dc::Activation::silu), w),
                       doctest::Contains("must use ReLU"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::linear_correction_params(dc::MlpLayout(5, {16, 1}, dc::Activation::relu), w),
                       doctest::Contains("at least 2 units, one has 1"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::linear_correction_params(dc::MlpLayout(6, {4}, dc::Activation::relu), w),
                       doctest::Contains("5 weights for 6 inputs"), dc::Error);
  const std::vector<float> nan = {0.0f, NAN, 0.0f, 0.0f, 0.0f};
  CHECK_THROWS_AS(dc::linear_correction_params(dc::MlpLayout(5, {4}, dc::Activation::relu), nan), dc::Error);
}
