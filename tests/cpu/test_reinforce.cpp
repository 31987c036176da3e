// REINFORCE end to end without a language model: on a synthetic subset-selection problem whose
// best subset is known, the policy gradient (Plackett-Luce through the MLP, leave-one-out
// advantages, Adam) must find it. Then the trainer on a tiny transformer: a resumed run
// continues bit for bit, and bad trainer state is rejected.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <distillcache/distillcache.hpp>

#include "../../examples/train/linear_search.hpp"
#include "../support/byte_tokenizer.hpp"
#include "../support/temp_dir.hpp"

namespace {

const dc::Context<dc::cpu> kCpu{};
const std::string kFixtures = DC_FIXTURE_DIR;

// A problem: n rows with two inputs each; row i's utility is a nonlinear function of them
// (x0 high is good unless x1 is far from 0). The reward of a keep-set is the sum of its
// utilities, so the best B-subset is the top-B by utility.
struct Problem {
  std::vector<float> inputs;  // [n, 2]
  std::vector<double> utility;
};

Problem make_problem(std::mt19937_64& rng, int n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  for (int i = 0; i < n; ++i) {
    const float x0 = normal(rng), x1 = normal(rng);
    p.inputs.push_back(x0);
    p.inputs.push_back(x1);
    p.utility.push_back(double(x0) - 1.5 * double(x1) * double(x1));
  }
  return p;
}

std::vector<std::int32_t> best_subset(const Problem& p, int b) {
  std::vector<std::int32_t> idx(p.utility.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int c) { return p.utility[std::size_t(a)] > p.utility[std::size_t(c)]; });
  idx.resize(std::size_t(b));
  std::sort(idx.begin(), idx.end());
  return idx;
}

double reward_of(const Problem& p, std::span<const std::int32_t> rows) {
  double r = 0.0;
  for (auto i : rows) r += p.utility[std::size_t(i)];
  return r;
}

}  // namespace

TEST_CASE("REINFORCE with Gumbel-top-k and Plackett-Luce learns the best subset of a synthetic problem") {
  const int n = 12, b = 4, k = 8, updates = 400;
  auto policy = dc::MlpPolicy::initialised({dc::PolicyInput::alpha, dc::PolicyInput::position}, {16, 16}, 5);
  std::vector<float> m(policy.params().size(), 0.0f), v(policy.params().size(), 0.0f),
      grad(policy.params().size());
  std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<std::int32_t> offsets = {0, n};
  std::mt19937_64 rng(17);
  auto scores_of = [&](const Problem& p) {
    std::vector<float> s(static_cast<std::size_t>(n));
    dc::mlp_forward(kCpu, policy.layout(), policy.params().data(), p.inputs.data(), n, s.data(), nullptr);
    return s;
  };
  auto greedy_regret = [&](int problems, std::uint64_t seed) {  // mean optimal - achieved, and exact hits
    std::mt19937_64 test_rng(seed);
    double regret = 0.0;
    int hits = 0;
    for (int t = 0; t < problems; ++t) {
      const Problem p = make_problem(test_rng, n);
      const auto s = scores_of(p);
      auto picks = dc::topk_groups(kCpu, s, positions, offsets, b).rows;
      std::sort(picks.begin(), picks.end());
      const auto best = best_subset(p, b);
      regret += reward_of(p, best) - reward_of(p, picks);
      hits += picks == best;
    }
    return std::make_pair(regret / problems, hits);
  };
  const auto [regret_before, hits_before] = greedy_regret(200, 99);
  for (int u = 1; u <= updates; ++u) {
    const Problem p = make_problem(rng, n);
    const auto s = scores_of(p);
    std::vector<dc::SampledEviction> samples(static_cast<std::size_t>(k));
    std::vector<double> returns;
    for (int j = 0; j < k; ++j) {
      auto& e = samples[std::size_t(j)];
      e.inputs = p.inputs;
      e.group_offsets = offsets;
      e.picks = dc::topk_groups(kCpu, s, positions, offsets, b,
                                dc::GumbelNoise{3, std::uint64_t(u) * 64 + std::uint64_t(j)});
      returns.push_back(reward_of(p, e.picks.rows));
    }
    const auto adv = dc::leave_one_out_advantages(returns);
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (int j = 0; j < k; ++j)
      dc::accumulate_policy_gradient(policy, samples[std::size_t(j)], adv[std::size_t(j)] / k, 0.0, grad);
    dc::AdamHyper h;
    h.lr = 1e-2f;
    dc::adam_update(kCpu, policy.params().data(), grad.data(), m.data(), v.data(),
                    std::int64_t(grad.size()), h, u);
  }
  const auto [regret_after, hits_after] = greedy_regret(200, 99);
  MESSAGE("regret " << regret_before << " -> " << regret_after << ", exact best subset " << hits_before
                    << " -> " << hits_after << " of 200");
  CHECK(regret_after < 0.1 * regret_before);
  CHECK(hits_after >= 140);  // the exact best 4 of 12, from the inputs alone, on unseen problems
}

namespace {

// Random token windows for the tiny model (vocabulary 256): the trainer's plumbing, not its
// learning, is under test here.
std::vector<std::vector<std::int32_t>> random_windows(int count, int length, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(3, 255);
  std::vector<std::vector<std::int32_t>> w(static_cast<std::size_t>(count));
  for (auto& x : w)
    for (int i = 0; i < length; ++i) x.push_back(token(rng));
  return w;
}

// The head-granularity features of a 30-token random prompt on the tiny model (2 layers x 2 KV
// heads: 4 groups of 30 rows).
dc::TokenFeatures tiny_prompt_features() {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  auto cache = model.make_cache(30);
  cache.set_observed_from(0);
  model.forward(random_windows(1, 30, 5)[0], cache);
  return dc::gather_features(model.context(), cache, dc::Granularity::head);
}

dc::TrainerOptions tiny_options() {
  dc::TrainerOptions o;
  o.context = 40;
  o.continuation = 6;
  o.budgets = {0.25, 0.5};
  o.rollouts = 3;
  o.updates = 6;
  o.warmup = 2;
  o.seed = 11;
  return o;
}

}  // namespace

TEST_CASE("trainer: N updates, save, load and N more give bitwise the parameters of 2N straight, "
          "whatever the student batch size") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto windows = random_windows(5, 46, 3);
  for (auto mode : {dc::EvictionMode::prefill, dc::EvictionMode::decode}) {
    auto opt = tiny_options();
    opt.mode = mode;
    opt.chunk = 2;
    CAPTURE(int(mode));
    const std::vector<float> kTarget = {2.0f, 0.0f, 0.0f, 0.0f, 4.0f};  // alpha and position
    auto fresh = [&]() { return dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8, 8}, 4); };

    auto straight = fresh();
    dc::ReinforceTrainer<dc::cpu, float> a(model, straight, opt, windows);
    a.warm_start(2, kTarget, 20, 1e-2f);
    std::vector<dc::UpdateStats> stats;
    while (!a.done()) stats.push_back(a.update());
    CHECK(stats.back().update == 6);
    for (const auto& s : stats) {
      CHECK(std::isfinite(s.reward));
      CHECK(s.kl >= 0.0);
      CHECK(s.tokens > 0);
    }

    // The straight run decodes all 6 students of a context as one batch; the first half of the
    // resumed run one at a time, the second in batches of 2 (straddling the budgets): batching
    // must not change a bit.
    auto first = fresh();
    dc::ReinforceTrainer<dc::cpu, float> b(model, first, opt, windows);
    b.set_max_batch(1);
    b.warm_start(2, kTarget, 20, 1e-2f);
    for (int u = 0; u < 3; ++u) b.update();
    dc_test::TempDir dir;
    const auto path = dir / "checkpoint.dcpolicy";
    dc::save_policy_checkpoint(path, b.save_state());

    const dc::PolicyCheckpoint loaded = dc::load_policy_checkpoint(path);
    auto resumed = dc::MlpPolicy::from_checkpoint(loaded);
    dc::ReinforceTrainer<dc::cpu, float> c(model, resumed, opt, windows);
    c.set_max_batch(2);
    c.restore_state(loaded);
    CHECK(c.step() == 3);
    while (!c.done()) c.update();
    const auto pa = straight.params(), pc = resumed.params();
    CHECK(std::equal(pa.begin(), pa.end(), pc.begin(), pc.end()));
    CHECK(!std::equal(pa.begin(), pa.end(), first.params().begin()));  // it did move on

    // A checkpoint of other options, or a bare policy file, is refused with the reason.
    auto other = opt;
    other.rollouts = 4;
    auto p2 = fresh();
    dc::ReinforceTrainer<dc::cpu, float> d(model, p2, other, windows);
    CHECK_THROWS_WITH_AS(d.restore_state(loaded), doctest::Contains("trained with other options"), dc::Error);
    CHECK_THROWS_WITH_AS(d.restore_state(straight.to_checkpoint()), doctest::Contains("no trainer state"), dc::Error);
  }
}

TEST_CASE("trainer options: impossible settings are refused with the reason") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {4}, 1);
  const auto windows = random_windows(2, 46, 1);
  auto with = [&](auto change) {
    auto o = tiny_options();
    change(o);
    return o;
  };
  using O = dc::TrainerOptions;
  using Trainer = dc::ReinforceTrainer<dc::cpu, float>;
  CHECK_THROWS_WITH_AS(Trainer(model, policy, with([](O& o) { o.rollouts = 1; }), windows),
                       doctest::Contains("leave-one-out needs at least 2"), dc::Error);
  CHECK_THROWS_WITH_AS(Trainer(model, policy, with([](O& o) { o.budgets = {1.0}; }), windows),
                       doctest::Contains("must be in (0, 1)"), dc::Error);
  CHECK_THROWS_WITH_AS(Trainer(model, policy, with([](O& o) { o.context = 30; }), windows),
                       doctest::Contains("has 46 tokens, need 36"), dc::Error);
  CHECK_THROWS_WITH_AS(Trainer(model, policy, tiny_options(), std::vector<std::vector<std::int32_t>>{}),
                       doctest::Contains("no training context"), dc::Error);
  CHECK_THROWS_WITH_AS(dc::TrainerOptions::from_json(nlohmann::json{{"context", 1}}),
                       doctest::Contains("trainer options"), dc::Error);
}

TEST_CASE("forward_logits_on_backend leaves the logits forward() copies out, for kl_rows to read") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 4);
  const auto tokens = random_windows(1, 11, 9)[0];
  auto a = model.make_cache(16), b = model.make_cache(16);
  const auto host = model.forward(tokens, a);  // 11 tokens: three chunks of at most 4
  const float* on_backend = model.forward_logits_on_backend(tokens, b);
  const std::vector<float> copy(on_backend, on_backend + host.size());
  CHECK(copy == host);
  float kl = -1.0f;
  dc::kl_rows(kCpu, host.data(), on_backend, 1, int(host.size()), &kl);
  CHECK(kl == 0.0f);
  CHECK(b.length() == a.length());
}

TEST_CASE("a recent window: the newest rows are kept without a choice and left out of the record") {
  const dc::TokenFeatures f = tiny_prompt_features();
  REQUIRE(f.groups.size() == 4);  // 2 layers x 2 KV heads, 30 rows each

  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 3);
  policy.set_recent_fraction(0.5);
  const int budget = 11, recent = policy.recent_tokens(budget);
  CHECK(recent == 5);
  std::vector<float> scores(std::size_t(f.size));
  policy.score(f, budget, scores);
  for (int i = 0; i < f.size; ++i)
    CHECK((scores[std::size_t(i)] == INFINITY) == (f.position[std::size_t(i)] >= 30 - recent));

  dc::GumbelSelector selector(policy, 9, 0);
  const dc::KeepSets keep = selector.select(f, scores, budget, 0, 0);
  const dc::SampledEviction& e = selector.records().at(0);
  CHECK(e.rows() == 4 * (30 - recent));
  CHECK(e.inputs.size() == std::size_t(e.rows()) * 5);
  for (std::size_t g = 0; g < 4; ++g) {
    CHECK(keep[g].size() == std::size_t(budget));
    CHECK(e.picks.group(int(g)).size() == std::size_t(budget - recent));
    for (int s = 30 - recent; s < 30; ++s)  // slot s holds position s: nothing was evicted yet
      CHECK(std::find(keep[g].begin(), keep[g].end(), s) != keep[g].end());
  }
  std::vector<float> grad(policy.params().size(), 0.0f);
  dc::accumulate_policy_gradient(policy, e, 1.0, 0.01, grad);
  CHECK(std::all_of(grad.begin(), grad.end(), [](float x) { return std::isfinite(x); }));
  // A temperature near 0 samples the greedy top-B (the noise is negligible next to the scores).
  dc::GumbelSelector cold(policy, 9, 0, 0, 1e-7f);
  CHECK(cold.select(f, scores, budget, 0, 0) == dc::select_keep_groups(scores, f, budget));
  CHECK(cold.records().at(0).temperature == 1e-7f);
  CHECK_THROWS_WITH_AS(dc::GumbelSelector(policy, 9, 0, 0, 0.0f), doctest::Contains("temperature 0"), dc::Error);
  CHECK(std::any_of(grad.begin(), grad.end(), [](float x) { return x != 0.0f; }));

  // The window travels in the checkpoint; an impossible fraction is refused.
  CHECK(dc::MlpPolicy::from_checkpoint(policy.to_checkpoint()).recent_fraction() == 0.5);
  CHECK(dc::MlpPolicy::from_checkpoint(dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 3)
                                           .to_checkpoint()).recent_fraction() == 0.0);
  CHECK_THROWS_WITH_AS(policy.set_recent_fraction(1.0), doctest::Contains("outside [0, 1)"), dc::Error);

  // A newest-query reserve is forced the same way: its rows are kept and left out of the record.
  policy.set_newest_query_reserve(0.25);
  const int reserve = policy.reserve_tokens(budget, 30);
  CHECK(reserve == 2);
  std::vector<float> reserved(std::size_t(f.size));
  policy.score(f, budget, reserved);
  dc::GumbelSelector with_reserve(policy, 9, 0);
  const dc::KeepSets kept = with_reserve.select(f, reserved, budget, 0, 0);
  const dc::SampledEviction& r = with_reserve.records().at(0);
  CHECK(r.rows() == 4 * (30 - recent - reserve));
  for (std::size_t g = 0; g < 4; ++g) {
    CHECK(kept[g].size() == std::size_t(budget));
    CHECK(r.picks.group(int(g)).size() == std::size_t(budget - recent - reserve));
    for (int row = f.groups[g].row_begin; row < f.groups[g].row_end; ++row)
      if (reserved[std::size_t(row)] == INFINITY)
        CHECK(std::find(kept[g].begin(), kept[g].end(), f.slot[std::size_t(row)]) != kept[g].end());
  }

  // Layer 1 given to the newest query: its groups force the whole budget and record no picks;
  // layer 0's groups sample their own free budget, the same draws as without it (the noise is
  // keyed on the candidate's index, and layer 0's candidates come first).
  policy.set_newest_query_reserve(0.0);
  policy.set_newest_query_layers({1});
  std::vector<float> layer_given(std::size_t(f.size));
  policy.score(f, budget, layer_given);
  dc::GumbelSelector limited(policy, 9, 0);
  const dc::KeepSets limited_kept = limited.select(f, layer_given, budget, 0, 0);
  const dc::SampledEviction& l = limited.records().at(0);
  CHECK(l.rows() == 2 * (30 - recent) + 2 * (30 - budget));
  for (std::size_t g = 0; g < 4; ++g) {
    CAPTURE(g);
    const bool in_layer_one = f.groups[g].layer_begin == 1;
    CHECK(limited_kept[g].size() == std::size_t(budget));
    CHECK(l.picks.group(int(g)).size() == std::size_t(in_layer_one ? 0 : budget - recent));
    if (!in_layer_one) CHECK(limited_kept[g] == keep[g]);
  }
  std::vector<float> limited_grad(policy.params().size(), 0.0f);
  dc::accumulate_policy_gradient(policy, l, 1.0, 0.01, limited_grad);
  CHECK(std::all_of(limited_grad.begin(), limited_grad.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("future attention shares: what the continuation's queries paid each prompt row, per group") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto window = random_windows(1, 46, 21)[0];
  const std::span<const std::int32_t> all(window);
  const auto prompt = all.first(40), continuation = all.subspan(40);
  for (auto granularity : {dc::Granularity::shared, dc::Granularity::layer, dc::Granularity::head}) {
    CAPTURE(dc::granularity_name(granularity));
    // As the trainer prefills: every prompt query observed, so the rows' sums are large.
    auto cache = model.make_cache(40);
    cache.set_observed_from(0);
    model.forward(prompt, cache);
    const dc::TokenFeatures f = dc::gather_features(model.context(), cache, granularity);
    const auto shares = dc::future_attention_shares(model, cache, f, continuation);
    REQUIRE(shares.size() == std::size_t(f.size));

    // Oracle: a prefill that observes nothing, then only the 5 fed continuation tokens: the
    // prompt rows' accumulated mass is then exactly what the continuation paid.
    auto quiet = model.make_cache(45);
    quiet.disable_statistics();
    model.forward(prompt, quiet);
    quiet.set_observed_from(40);
    model.forward(continuation.first(5), quiet);
    const dc::TokenFeatures after = dc::gather_features(model.context(), quiet, granularity);
    REQUIRE(after.num_groups() == f.num_groups());
    for (int g = 0; g < f.num_groups(); ++g) {
      const dc::FeatureGroup& a = after.groups[std::size_t(g)];
      const dc::FeatureGroup& b = f.groups[std::size_t(g)];
      REQUIRE(a.rows() == b.rows() + 5);
      double total = 0.0, sum_shares = 0.0;
      for (int i = 0; i < b.rows(); ++i) total += after.accumulated_mass[std::size_t(a.row_begin + i)];
      REQUIRE(total > 0.0);
      for (int i = 0; i < b.rows(); ++i) {
        const float expected = float(after.accumulated_mass[std::size_t(a.row_begin + i)] / total);
        CHECK(shares[std::size_t(b.row_begin + i)] == doctest::Approx(expected).epsilon(1e-4).scale(1e-3));
        sum_shares += shares[std::size_t(b.row_begin + i)];
      }
      CHECK(sum_shares == doctest::Approx(1.0).epsilon(1e-5));
    }
  }
  auto cache = model.make_cache(40);
  model.forward(prompt, cache);
  const dc::TokenFeatures f = dc::gather_features(model.context(), cache, dc::Granularity::head);
  CHECK_THROWS_WITH_AS(dc::future_attention_shares(model, cache, f, continuation.first(1)),
                       doctest::Contains("at least 2"), dc::Error);
}

TEST_CASE("the listwise warm start fits each group's softmax to a known target distribution") {
  // 40 groups of 30 rows with two inputs; the target is p ~ exp(2 x0 - x1^2) within each group,
  // a function an MLP can represent: the cross-entropy must come down to the targets' entropy.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> inputs, targets;
  std::vector<std::int64_t> offsets = {0};
  double entropy = 0.0;
  for (int g = 0; g < 40; ++g) {
    std::vector<double> w;
    for (int i = 0; i < 30; ++i) {
      const float x0 = normal(rng), x1 = normal(rng);
      inputs.push_back(x0);
      inputs.push_back(x1);
      w.push_back(std::exp(2.0 * x0 - double(x1) * x1));
    }
    const double z = std::accumulate(w.begin(), w.end(), 0.0);
    for (double x : w) {
      targets.push_back(float(x / z));
      entropy -= x / z * std::log(x / z) / 40.0;
    }
    offsets.push_back(std::int64_t(targets.size()));
  }
  auto policy = dc::MlpPolicy::initialised({dc::PolicyInput::alpha, dc::PolicyInput::position}, {16}, 2);
  const auto r = dc::fit_policy_distributions(policy, inputs, offsets, targets, 400, 1e-2f);
  CHECK(r.rows == 40 * 30);
  CHECK(r.initial_loss - entropy > 0.5);                               // far from it at first
  CHECK(r.final_loss - entropy < 0.05 * (r.initial_loss - entropy));  // then close
  // Malformed calls are refused with the reason.
  std::vector<std::int64_t> bad_offsets = {0, 10};
  CHECK_THROWS_WITH_AS(dc::fit_policy_distributions(policy, inputs, bad_offsets, targets, 1, 1e-2f),
                       doctest::Contains("group offsets must run from 0"), dc::Error);
  std::vector<float> zero(targets.size(), 0.0f);
  CHECK_THROWS_WITH_AS(dc::fit_policy_distributions(policy, inputs, offsets, zero, 1, 1e-2f),
                       doctest::Contains("target mass is zero"), dc::Error);
}

TEST_CASE("the future-attention warm start fits the groups' shares and leaves REINFORCE to go on") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  auto opt = tiny_options();
  auto policy = dc::MlpPolicy::initialised({dc::PolicyInput::alpha, dc::PolicyInput::last_alpha,
                                            dc::PolicyInput::position, dc::PolicyInput::log_age},
                                           {8, 8}, 4, dc::Activation::silu, 0);
  dc::ReinforceTrainer<dc::cpu, float> trainer(model, policy, opt, random_windows(4, 46, 8));
  const auto w = trainer.warm_start_future(3, 200, 1e-2f);
  CHECK(w.rows == 3 * 4 * 40);  // 3 contexts x 4 groups (2 layers x 2 KV heads) x 40 rows
  // Random tokens through a random tiny model attend almost uniformly: little to learn here (the
  // fit itself is checked on a known distribution above); it must not get worse.
  CHECK(w.final_loss <= w.initial_loss);
  const auto s = trainer.update();
  CHECK(std::isfinite(s.reward));
}

TEST_CASE("a task context's continuation is the full-cache model's greedy answer, ending at a stop token") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto ids = random_windows(1, 37, 21)[0];
  dc::tasks::TaskPrompt prompt;
  prompt.task = "synthetic";
  prompt.context.assign(ids.begin(), ids.begin() + 30);
  prompt.question.assign(ids.begin() + 30, ids.end());

  // No stop token: 6 tokens, each the argmax of one forward over the prompt and the answer so far
  // (the oracle runs the whole sequence at once, in chunks, rather than token by token).
  const dc::TrainingContext free = dc::task_training_context(model, prompt, {}, 6);
  CHECK(free.prompt == prompt.full_prompt());
  CHECK(free.kind == "task");  // what --search-balance weighs apart from text windows ("text")
  REQUIRE(free.continuation.size() == 6);
  std::vector<std::int32_t> all = free.prompt;
  all.insert(all.end(), free.continuation.begin(), free.continuation.end() - 1);
  auto cache = model.make_cache(int(all.size()));
  const auto logits = model.forward(all, cache, dc::LogitsFor::all);
  const std::size_t vocab = std::size_t(m.config.vocab_size);
  for (std::size_t t = 0; t < free.continuation.size(); ++t) {
    const std::size_t row = free.prompt.size() - 1 + t;
    CAPTURE(t);
    CHECK(dc::argmax(std::span<const float>(logits.data() + row * vocab, vocab)) == free.continuation[t]);
  }

  // A stop token ends the answer and is kept; a one-token answer gets the teacher's next token,
  // so every context has a step an eviction can change.
  // The answer a stop token s gives: up to its first occurrence k, or 2 tokens if k = 0.
  auto expected = [&](std::int32_t s) {
    const auto k = std::size_t(std::find(free.continuation.begin(), free.continuation.end(), s) - free.continuation.begin());
    return std::vector<std::int32_t>(free.continuation.begin(), free.continuation.begin() + std::ptrdiff_t(std::max<std::size_t>(2, k + 1)));
  };
  for (std::size_t i = 0; i < 4; ++i) {
    const std::int32_t s = free.continuation[i];
    CAPTURE(i);
    const auto stopped = dc::task_training_context(model, prompt, std::vector<std::int32_t>{s}, 6);
    CHECK(stopped.continuation == expected(s));
  }
  CHECK_THROWS_WITH_AS(dc::task_training_context(model, prompt, {}, 1), doctest::Contains("at least 2"), dc::Error);
}

TEST_CASE("the teacher's answer in a task context is scored as the task suite scores it") {
  const dc::Tokenizer tok = dc_test::byte_tokenizer();  // one token per byte
  dc::tasks::TaskPrompt prompt;
  prompt.answers = {"4829173"};
  dc::TrainingContext c;
  const std::string said = " 4829173.#and more";  // '#' plays the stop token below
  c.continuation.assign(said.begin(), said.end());
  const std::vector<std::int32_t> hash{'#'}, digit{'1'}, none;
  CHECK(dc::teacher_answer_score(tok, prompt, c, hash) == 1.0);
  CHECK(dc::teacher_answer_score(tok, prompt, c, none) == 1.0);
  CHECK(dc::teacher_answer_score(tok, prompt, c, digit) == 0.0);  // cut before the first '1': " 4829"
  prompt.answers = {"4829173", "AND MORE"};  // match_all: the fraction found, case-insensitive
  CHECK(dc::teacher_answer_score(tok, prompt, c, hash) == 0.5);
  CHECK(dc::teacher_answer_score(tok, prompt, c, none) == 1.0);
  prompt.scoring = dc::tasks::Scoring::match_part;
  CHECK(dc::teacher_answer_score(tok, prompt, c, hash) == 1.0);
  prompt.answers = {"7777777"};
  CHECK(dc::teacher_answer_score(tok, prompt, c, none) == 0.0);
}

TEST_CASE("the trainer takes contexts of different prompt and continuation lengths") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto w = random_windows(4, 50, 31);
  const std::vector<dc::TrainingContext> text = dc::split_windows({w[0], w[1]}, 40, 10);
  CHECK(text[1].prompt == std::vector<std::int32_t>(w[1].begin(), w[1].begin() + 40));
  CHECK(text[1].continuation == std::vector<std::int32_t>(w[1].begin() + 40, w[1].end()));
  CHECK_THROWS_WITH_AS(dc::split_windows({w[0]}, 40, 4), doctest::Contains("has 50 tokens, need 44"), dc::Error);
  const std::vector<dc::TrainingContext> tasks = {{{w[2].begin(), w[2].begin() + 25}, {w[2].begin() + 25, w[2].begin() + 28}},
                                                  {{w[3].begin(), w[3].begin() + 47}, {w[3].begin() + 47, w[3].end()}}};
  auto contexts = dc::interleave_contexts(text, tasks);
  REQUIRE(contexts.size() == 4);
  CHECK(contexts[1].prompt.size() == 25);  // text, task, text, task
  CHECK(contexts[2].prompt == text[1].prompt);

  auto opt = tiny_options();
  opt.updates = 4;
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 4);
  dc::ReinforceTrainer<dc::cpu, float> trainer(model, policy, opt, contexts);
  const auto warm = trainer.warm_start(4, std::vector<float>{2.0f, 0.0f, 0.0f, 0.0f, 4.0f}, 10, 1e-2f);
  // 2 layers x 2 KV heads, every prompt row once per budget.
  CHECK(warm.rows == std::int64_t(4 * (40 + 25 + 40 + 47) * opt.budgets.size()));
  while (!trainer.done()) {
    const auto s = trainer.update();
    CHECK(std::isfinite(s.reward));
    CHECK(s.kl >= 0.0);
  }
  const auto kl = trainer.validate(tasks);
  REQUIRE(kl.size() == opt.budgets.size());
  for (double x : kl) CHECK(std::isfinite(x));

  using Trainer = dc::ReinforceTrainer<dc::cpu, float>;
  CHECK_THROWS_WITH_AS(Trainer(model, policy, opt, std::vector<dc::TrainingContext>{{{1, 2, 3}, {4}}}),
                       doctest::Contains("need a prompt and at least 2"), dc::Error);
  CHECK_THROWS_WITH_AS(Trainer(model, policy, opt, std::vector<dc::TrainingContext>{{{}, {4, 5}}}),
                       doctest::Contains("need a prompt and at least 2"), dc::Error);
  const std::vector<std::int32_t> too_long(std::size_t(m.config.max_position), 5);
  CHECK_THROWS_WITH_AS(Trainer(model, policy, opt, std::vector<dc::TrainingContext>{{too_long, {4, 5}}}),
                       doctest::Contains("more than the model's context"), dc::Error);
}

TEST_CASE("the policy gradient through an H2O score base and a temperature matches central finite differences of log p") {
  // Two groups of 40 rows, random inputs and accumulated masses (the base spreads the scores over
  // several nats, so a gradient taken at the MLP's scores without it would be far off), 10 picks
  // each, sampled by Gumbel-top-k from the full scores over the temperature 0.5 as the trainer
  // samples them.
  const int rows = 80, picks = 10;
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {16, 8}, 6, dc::Activation::tanh);
  policy.set_score_base(dc::ScoreBase::h2o);
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  dc::SampledEviction e;
  e.temperature = 0.5f;
  for (int i = 0; i < rows * 5; ++i) e.inputs.push_back(normal(rng));
  for (int i = 0; i < rows; ++i) e.accumulated_mass.push_back(std::exp(6.0f * unit(rng) - 3.0f));
  e.group_offsets = {0, 40, rows};
  std::vector<std::int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  auto scores_at = [&](const std::vector<float>& params) {
    std::vector<float> s(rows);
    dc::mlp_forward(dc::Context<dc::cpu>{}, policy.layout(), params.data(), e.inputs.data(), rows, s.data(), nullptr);
    dc::add_score_base(dc::ScoreBase::h2o, e.accumulated_mass.data(), rows, s.data());
    for (float& x : s) x /= e.temperature;
    return s;
  };
  const std::vector<float> params(policy.params().begin(), policy.params().end());
  e.picks = dc::topk_groups(dc::Context<dc::cpu>{}, scores_at(params), positions, e.group_offsets, picks,
                            dc::GumbelNoise{4, 1});
  auto log_p = [&](const std::vector<float>& p) {
    const auto s = scores_at(p);
    const std::vector<double> sd(s.begin(), s.end());
    return dc::plackett_luce_log_prob_groups(std::span<const double>(sd), e.group_offsets, e.picks);
  };
  std::vector<float> grad(params.size(), 0.0f);
  dc::accumulate_policy_gradient(policy, e, -1.0, 0.0, grad);  // loss = +log p: grad = d log p
  const float h = 1e-2f;
  int checked = 0;
  for (std::size_t i = 0; i < params.size(); i += 7) {
    std::vector<float> up = params, down = params;
    up[i] += h;
    down[i] -= h;
    const double numeric = (log_p(up) - log_p(down)) / (double(up[i]) - double(down[i]));
    CAPTURE(i);
    CHECK(double(grad[i]) == doctest::Approx(numeric).epsilon(1e-2).scale(1e-2));
    ++checked;
  }
  CHECK(checked > 20);
  // Without the recorded masses the gradient cannot be taken, and says so.
  e.accumulated_mass.pop_back();
  CHECK_THROWS_WITH_AS(dc::accumulate_policy_gradient(policy, e, 1.0, 0.0, grad),
                       doctest::Contains("masses for 80 rows"), dc::Error);
}

TEST_CASE("shared exploration: the rollouts of one (context, budget) explore the same groups, else their own") {
  const dc::TokenFeatures f = tiny_prompt_features();
  REQUIRE(f.groups.size() == 4);
  const auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 3);
  std::vector<float> scores(std::size_t(f.size));
  const int budget = 9;
  dc::MlpPolicy scorer = policy;
  scorer.score(f, budget, scores);
  // The explored group of a selector that explores one: the group whose picks were recorded.
  const auto explored = [&](dc::GumbelSelector& s) {
    s.select(f, scores, budget, 0, 0);
    const dc::SampledEviction& e = s.records().at(0);
    int which = -1, count = 0;
    for (int g = 0; g < 4; ++g)
      if (!e.picks.group(g).empty()) which = g, ++count;
    CHECK(count == 1);
    return which;
  };
  std::vector<int> own, shared;
  for (std::uint64_t k = 0; k < 8; ++k) {
    dc::GumbelSelector a(policy, 9, k << 16, 1), b(policy, 9, k << 16, 1, 1.0f, std::uint64_t(0));
    own.push_back(explored(a));
    shared.push_back(explored(b));
    // The default explore stream is the selector's own: bit for bit the selector before the option.
    dc::GumbelSelector c(policy, 9, k << 16, 1, 1.0f, k << 16);
    dc::GumbelSelector d(policy, 9, k << 16, 1);
    CHECK(c.select(f, scores, budget, 0, 0) == d.select(f, scores, budget, 0, 0));
  }
  CHECK(std::all_of(shared.begin(), shared.end(), [&](int g) { return g == shared[0]; }));
  CHECK(std::any_of(own.begin(), own.end(), [&](int g) { return g != own[0]; }));

  // Through the trainer: the option travels in the checkpoint's options (absent from older ones:
  // off), and it changes the update (other groups explored) without breaking it.
  auto opt = tiny_options();
  opt.explore_groups = 1;
  auto j = opt.to_json();
  j.erase("shared_exploration");
  CHECK(!dc::TrainerOptions::from_json(j).shared_exploration);
  auto shared_opt = opt;
  shared_opt.shared_exploration = true;
  CHECK(dc::TrainerOptions::from_json(shared_opt.to_json()).shared_exploration);
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto windows = random_windows(3, 46, 3);
  auto p_own = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8}, 4), p_shared = p_own;
  dc::ReinforceTrainer<dc::cpu, float> a(model, p_own, opt, windows), b(model, p_shared, shared_opt, windows);
  const auto sa = a.update(), sb = b.update();
  CHECK(std::isfinite(sb.reward));
  CHECK(sa.reward != sb.reward);
  CHECK(!std::equal(p_own.params().begin(), p_own.params().end(), p_shared.params().begin()));
}

TEST_CASE("validate_policies: several policies in one pass score what each scores alone") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto windows = random_windows(4, 46, 3);
  auto opt = tiny_options();
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8, 8}, 4);
  dc::ReinforceTrainer<dc::cpu, float> trainer(model, policy, opt, windows);
  const auto contexts = dc::split_windows(random_windows(2, 46, 7), opt.context, opt.continuation);
  auto other = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {8, 8}, 5);
  dc::H2OPolicy h2o(0.5);
  const auto together = trainer.validate_policies({&policy, &other, &h2o}, contexts);
  REQUIRE(together.size() == 3);
  CHECK(together[0] == trainer.validate_policy(policy, contexts));
  CHECK(together[1] == trainer.validate_policy(other, contexts));
  CHECK(together[2] == trainer.validate_policy(h2o, contexts));
  CHECK(together[0] != together[1]);  // the policies differ, so the pass did not score one thrice
  CHECK(trainer.training_contexts().size() == windows.size());

  // A mode passed in overrides the training mode: what a trainer of that mode scores.
  auto decode_opt = opt;
  decode_opt.mode = dc::EvictionMode::decode;
  decode_opt.chunk = 2;
  opt.chunk = 2;
  dc::ReinforceTrainer<dc::cpu, float> prefill_trainer(model, policy, opt, windows);
  dc::ReinforceTrainer<dc::cpu, float> decode_trainer(model, policy, decode_opt, windows);
  const auto decoded = prefill_trainer.validate_policies({&h2o}, contexts, dc::EvictionMode::decode);
  CHECK(decoded[0] == decode_trainer.validate_policy(h2o, contexts));
  CHECK(decoded[0] != prefill_trainer.validate_policy(h2o, contexts));  // decode mode evicted more
}

TEST_CASE("train --search-holdout: search and hold-out windows are disjoint, and too few are refused") {
  std::vector<dc::TrainingContext> all;
  for (int i = 0; i < 100; ++i) all.push_back({{i, i + 1}, {0, 1}});  // window i: prompt {i, i + 1}
  for (const auto& counts : std::vector<std::pair<int, int>>{{16, 16}, {24, 24}, {8, 16}, {10, 0}, {7, 3}}) {
    const int n = counts.first, h = counts.second;  // plain ints: clang 14 cannot capture bindings
    CAPTURE(n);
    CAPTURE(h);
    const auto [search, held] = dc_examples::split_search_windows(all, n, h);
    CHECK(search.size() == std::size_t(n));
    CHECK(held.size() == std::size_t(h));
    for (const auto& x : held)
      for (const auto& c : search) CHECK(x.prompt != c.prompt);
    for (std::size_t i = 1; i < held.size(); ++i) CHECK(held[i].prompt != held[i - 1].prompt);
  }
  CHECK_THROWS_WITH_AS(dc_examples::split_search_windows(all, 16, 60), doctest::Contains("too few"), dc::Error);
  // Half as many held out as searched: the hold-out lands on every other search window.
  CHECK_THROWS_WITH_AS(dc_examples::split_search_windows(all, 16, 8), doctest::Contains("the same window"), dc::Error);
  // The pruning pass's windows follow the hold-out's rule: none of the search's, all distinct.
  const auto search16 = dc_examples::split_search_windows(all, 16, 0).first;
  const auto pruned = dc_examples::prune_windows(all, 16, 32);
  CHECK(pruned.size() == 32);
  for (const auto& x : pruned)
    for (const auto& c : search16) CHECK(x.prompt != c.prompt);
  for (std::size_t i = 1; i < pruned.size(); ++i) CHECK(pruned[i].prompt != pruned[i - 1].prompt);
  CHECK_THROWS_WITH_AS(dc_examples::prune_windows(all, 16, 64), doctest::Contains("too few"), dc::Error);
  CHECK_THROWS_WITH_AS(dc_examples::prune_windows(all, 16, 8), doctest::Contains("the same window"), dc::Error);
  // Windows of another length (--search-prune-context): those holding a search window's text are
  // left out. Short window i is the text 4i .. 4i + 3; long window j the text 8j .. 8j + 7 (short
  // windows 2j and 2j + 1).
  std::vector<dc::TrainingContext> text, longer;
  for (int i = 0; i < 100; ++i) text.push_back({{4 * i, 4 * i + 1, 4 * i + 2}, {4 * i + 3}});
  for (int j = 0; j < 50; ++j) longer.push_back({{8 * j, 8 * j + 1, 8 * j + 2, 8 * j + 3, 8 * j + 4, 8 * j + 5}, {8 * j + 6, 8 * j + 7}});
  const auto searched = dc_examples::split_search_windows(text, 16, 0).first;
  std::set<int> touched;  // long windows a search window lies in
  for (const auto& c : searched) touched.insert(c.prompt[0] / 8);
  CHECK(dc_examples::holds_text_of(longer[0], searched[0].prompt));
  const auto apart = dc_examples::prune_windows(text, 16, int(50 - touched.size()), longer);
  CHECK(apart.size() == 50 - touched.size());  // every long window no search window lies in
  for (const auto& w : apart) {
    CHECK(touched.count(w.prompt[0] / 8) == 0);
    for (const auto& c : searched) CHECK(!dc_examples::holds_text_of(w, c.prompt));
  }
  CHECK_THROWS_WITH_AS(dc_examples::prune_windows(text, 16, int(51 - touched.size()), longer),
                       doctest::Contains("share no text with a search window"), dc::Error);
  CHECK(dc_examples::objective_modes({}).size() == 1);
  CHECK(!dc_examples::objective_modes({})[0].has_value());
  CHECK(dc_examples::objective_modes({dc::EvictionMode::prefill, dc::EvictionMode::decode}).size() == 2);
}

TEST_CASE("compass search: finds a quadratic's minimum to within its last step and never goes uphill") {
  const std::vector<double> centre = {0.8, -1.3, 0.45}, curvature = {1.0, 4.0, 0.25};
  const auto f = [&](const std::vector<float>& x) {
    double s = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) s += curvature[i] * (double(x[i]) - centre[i]) * (double(x[i]) - centre[i]);
    return s + 0.1;
  };
  int calls = 0;
  const auto evaluate = [&](const std::vector<std::vector<float>>& points) {
    ++calls;
    std::vector<double> v;
    for (const auto& p : points) v.push_back(f(p));
    return v;
  };
  dc::CompassSearchOptions opt;
  opt.step = 0.5;
  opt.min_step = 1.0 / 64;
  opt.max_rounds = 100;
  std::vector<double> values;
  const auto r = dc::compass_search({0.0f, 0.0f, 0.0f}, opt, evaluate,
                                    [&](const dc::CompassSearchRound& round) { values.push_back(round.value); });
  for (std::size_t i = 0; i < centre.size(); ++i) CHECK(std::abs(double(r.x[i]) - centre[i]) <= opt.min_step);
  CHECK(r.value == f(r.x));
  CHECK(r.rounds < opt.max_rounds);  // it stopped on the step, not the round count
  REQUIRE(values.size() == std::size_t(r.rounds) + 1);  // round 0 reports the start
  CHECK(values[0] == f({0.0f, 0.0f, 0.0f}));
  CHECK(std::is_sorted(values.rbegin(), values.rend()));
  CHECK(r.evaluations == 1 + 6 * r.rounds);
  CHECK(calls == 1 + r.rounds);  // x0 alone, then one batch per round

  // A far minimum: with the step allowed to grow after each success, the search gets there in
  // fewer rounds than at one initial step per round, and as precisely.
  const auto far = [&](const std::vector<std::vector<float>>& points) {
    std::vector<double> v;
    for (const auto& p : points) v.push_back((double(p[0]) - 6.3) * (double(p[0]) - 6.3));
    return v;
  };
  opt.max_step = 0.5;
  const auto slow = dc::compass_search({0.0f}, opt, far);
  opt.max_step = 4.0;
  const auto fast = dc::compass_search({0.0f}, opt, far);
  CHECK(std::abs(double(slow.x[0]) - 6.3) <= opt.min_step);
  CHECK(std::abs(double(fast.x[0]) - 6.3) <= opt.min_step);
  CHECK(slow.rounds >= 13);  // 12 steps of 0.5 to get near 6.3, then the refinement
  CHECK(fast.rounds < slow.rounds);
  opt.max_step = 0.0;

  // A move must gain min_improvement of f(x): the best poll point, (0, -0.5, 0), gains 56 % of
  // f(x0) = 7.55, so asking for 90 % the search never leaves x0.
  opt.min_improvement = 0.9;
  opt.max_rounds = 5;
  const auto stuck = dc::compass_search({0.0f, 0.0f, 0.0f}, opt, evaluate);
  CHECK(stuck.x == std::vector<float>{0.0f, 0.0f, 0.0f});
  CHECK(stuck.value == f({0.0f, 0.0f, 0.0f}));

  // Impossible settings and a non-finite objective are refused with the reason.
  opt.min_improvement = 0.0;
  opt.min_step = 1.0;
  CHECK_THROWS_WITH_AS(dc::compass_search({0.0f}, opt, evaluate), doctest::Contains("minimum step 1"), dc::Error);
  opt.min_step = 0.1;
  const auto nan = [](const std::vector<std::vector<float>>& points) { return std::vector<double>(points.size(), NAN); };
  CHECK_THROWS_WITH_AS(dc::compass_search({0.0f}, opt, nan), doctest::Contains("the objective is nan"), dc::Error);
}

TEST_CASE("backward elimination: drops the weights whose removal does not raise f, best first, and stops") {
  // f = (x0 - 1)^2 + x1^2 + (x3 - 2)^2 + 0 * x2 from (1, 0.5, 3, 2): dropping x1 lowers f by 0.25,
  // dropping x2 leaves it as it is (a tie goes to the simpler point), x0 and x3 raise it.
  const auto f = [](const std::vector<float>& x) {
    const double a = x[0] - 1.0, b = x[1], d = x[3] - 2.0;
    return a * a + b * b + d * d;
  };
  std::vector<std::size_t> sizes;
  const auto evaluate = [&](const std::vector<std::vector<float>>& points) {
    sizes.push_back(points.size());
    std::vector<double> v;
    for (const auto& p : points) v.push_back(f(p));
    return v;
  };
  std::vector<dc::BackwardEliminationStep> steps;
  const auto r = dc::backward_elimination({1.0f, 0.5f, 3.0f, 2.0f}, evaluate,
                                          [&](const dc::BackwardEliminationStep& s) { steps.push_back(s); });
  CHECK(r.x == std::vector<float>{1.0f, 0.0f, 0.0f, 2.0f});
  CHECK(r.zeroed == std::vector<std::size_t>{1, 2});  // the larger gain first
  CHECK(r.start_value == 0.25);
  CHECK(r.value == 0.0);
  CHECK(r.rounds == 3);  // drop x1, drop x2, then every drop raises f
  CHECK(sizes == std::vector<std::size_t>{5, 3, 2});  // x0 and its 4 drops, then the drops alone
  CHECK(r.evaluations == 10);
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].tried == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK(steps[0].dropped == std::vector<double>{1.25, 0.0, 0.25, 4.25});
  CHECK(steps[0].kept == 1);
  CHECK(steps[1].kept == 1);  // x2 is second in {0, 2, 3}
  CHECK(steps[2].value == 0.0);
  CHECK(steps[2].kept == -1);

  // Greedy drops until nothing is left: f = 0.1 x0^2 + 0.2 x1^2 is lowest at 0.
  const auto bowl = [](const std::vector<std::vector<float>>& points) {
    std::vector<double> v;
    for (const auto& p : points) v.push_back(0.1 * p[0] * p[0] + 0.2 * p[1] * p[1]);
    return v;
  };
  const auto all = dc::backward_elimination({1.0f, 1.0f}, bowl);
  CHECK(all.x == std::vector<float>{0.0f, 0.0f});
  CHECK(all.zeroed == std::vector<std::size_t>{1, 0});
  CHECK(all.rounds == 2);
  // Nothing to drop: x0 is scored alone.
  const auto none = dc::backward_elimination({0.0f, 0.0f}, bowl);
  CHECK(none.rounds == 0);
  CHECK(none.evaluations == 1);
  CHECK(none.value == 0.0);

  const auto nan = [](const std::vector<std::vector<float>>& points) { return std::vector<double>(points.size(), NAN); };
  CHECK_THROWS_WITH_AS(dc::backward_elimination({1.0f}, nan), doctest::Contains("the objective is nan"), dc::Error);
}

TEST_CASE("train --search-balance: windows of each kind in proportion, the hold-out none of the search's") {
  // 60 text windows and 30 task prompts, interleaved as the trainer does: a stride of 2 over them
  // picks text only, the split by kind takes both.
  std::vector<dc::TrainingContext> text, tasks;
  for (int i = 0; i < 60; ++i) text.push_back({{i, i + 1}, {0, 1}});
  for (int i = 0; i < 30; ++i) tasks.push_back({{1000 + i, 1}, {0, 1}, "task"});
  const auto all = dc::interleave_contexts(text, tasks);
  const auto count_tasks = [](const std::vector<dc::TrainingContext>& w) {
    return std::count_if(w.begin(), w.end(), [](const dc::TrainingContext& c) { return c.kind == "task"; });
  };
  CHECK(count_tasks(dc_examples::split_search_windows(all, 45, 0).first) == 0);  // what the balance avoids
  REQUIRE(dc_examples::windows_by_kind(all).size() == 2);
  CHECK(dc_examples::windows_by_kind(all)[1].front().kind == "task");
  for (const auto& counts : std::vector<std::pair<int, int>>{{30, 45}, {20, 32}, {7, 11}, {1, 0}}) {
    const int n = counts.first, h = counts.second;
    CAPTURE(n);
    CAPTURE(h);
    const auto [search, held] = dc_examples::split_search_windows(all, n, h, true);
    CHECK(search.size() == std::size_t(n));
    CHECK(held.size() == std::size_t(h));
    // Shares in proportion (2 : 1): text floor(2 n / 3), the tasks the rest.
    CHECK(count_tasks(search) == n - 2 * n / 3);
    CHECK(count_tasks(held) == h - 2 * h / 3);
    std::set<std::vector<std::int32_t>> seen;
    for (const auto& c : search) CHECK(seen.insert(c.prompt).second);
    for (const auto& c : held) CHECK(seen.insert(c.prompt).second);  // none of the search's, all distinct
  }
  CHECK_THROWS_WITH_AS(dc_examples::split_search_windows(all, 30, 61, true),
                       doctest::Contains("'task' windows are too few"), dc::Error);
  // The pruning pass by kind: the same rule.
  const auto search = dc_examples::split_search_windows(all, 30, 0, true).first;
  const auto pruned = dc_examples::prune_windows(all, 30, 30, {}, true);
  CHECK(pruned.size() == 30);
  CHECK(count_tasks(pruned) == 10);
  for (const auto& x : pruned)
    for (const auto& c : search) CHECK(x.prompt != c.prompt);
}

TEST_CASE("train --search-balance: the objective is the mean over kinds and budgets of the KL relative "
          "to the balance policy's") {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral");
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 16);
  const auto opt = tiny_options();
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {2, 2}, 4, dc::Activation::relu);
  policy.set_score_base(dc::ScoreBase::h2o);
  dc::ReinforceTrainer<dc::cpu, float> trainer(model, policy, opt, random_windows(4, 46, 3));
  auto windows = dc::split_windows(random_windows(5, 46, 7), opt.context, opt.continuation);
  windows[1].kind = windows[3].kind = "task";
  const std::vector<std::vector<float>> points = {{0.0f, 1.0f, 0.0f, 0.0f, 0.0f}, {-1.0f, 0.0f, 0.5f, 0.0f, 2.0f}};
  std::vector<dc::MlpPolicy> candidates(points.size(), policy);
  for (std::size_t p = 0; p < points.size(); ++p) {
    const auto params = dc::linear_correction_params(policy.layout(), points[p]);
    std::copy(params.begin(), params.end(), candidates[p].params().begin());
  }
  // Plain: the mean KL over all windows and the budgets.
  dc_examples::LinearSearchSettings plain;
  const auto plain_f = dc_examples::score_linear_points(trainer, policy, points,
                                                        dc_examples::window_objective(trainer, windows, plain));
  for (std::size_t p = 0; p < points.size(); ++p) {
    const auto kl = trainer.validate_policy(candidates[p], windows);
    CHECK(plain_f[p] == doctest::Approx((kl[0] + kl[1]) / 2.0).epsilon(1e-12));
  }
  // Balanced against H2O: each kind's KL per budget over H2O's on the same windows, then the mean.
  dc_examples::LinearSearchSettings balanced;
  balanced.balance = std::make_shared<dc::H2OPolicy>(0.5);
  balanced.balance_name = "h2o";
  const auto objective = dc_examples::window_objective(trainer, windows, balanced);
  REQUIRE(objective.parts.size() == 2);
  CHECK(objective.what == "KL/h2o");  // what the progress lines call the value
  CHECK(dc_examples::window_objective(trainer, windows, plain).what == "KL");
  CHECK(objective.parts[0].size() == 3);
  CHECK(objective.parts[1].size() == 2);
  const auto f = dc_examples::score_linear_points(trainer, policy, points, objective);
  std::vector<dc::TrainingContext> text_windows = {windows[0], windows[2], windows[4]}, task_windows = {windows[1], windows[3]};
  const auto h2o_text = trainer.validate_policy(*balanced.balance, text_windows);
  const auto h2o_task = trainer.validate_policy(*balanced.balance, task_windows);
  // --search-worst-case: the largest of the same ratios.
  balanced.worst_case = true;
  CHECK(dc_examples::window_objective(trainer, windows, balanced).what == "max KL/h2o");
  const auto worst = dc_examples::score_linear_points(trainer, policy, points,
                                                      dc_examples::window_objective(trainer, windows, balanced));
  for (std::size_t p = 0; p < points.size(); ++p) {
    const auto t = trainer.validate_policy(candidates[p], text_windows);
    const auto k = trainer.validate_policy(candidates[p], task_windows);
    double expected = 0.0, largest = 0.0;
    for (std::size_t b = 0; b < 2; ++b) {
      expected += (t[b] / h2o_text[b] + k[b] / h2o_task[b]) / 4.0;
      largest = std::max({largest, t[b] / h2o_text[b], k[b] / h2o_task[b]});
    }
    CHECK(f[p] == doctest::Approx(expected).epsilon(1e-12));
    CHECK(worst[p] == doctest::Approx(largest).epsilon(1e-12));
    CHECK(worst[p] > f[p]);  // the ratios differ, so the largest is above their mean
  }
  // A balance policy that the candidates equal scores 1 on every kind and budget.
  const auto same = dc_examples::score_linear_points(trainer, policy, {points[0]},
      dc_examples::window_objective(trainer, windows, [&] {
        dc_examples::LinearSearchSettings s;
        s.balance = std::make_shared<dc::MlpPolicy>(candidates[0]);
        s.balance_name = "itself";
        return s;
      }()));
  CHECK(same[0] == doctest::Approx(1.0).epsilon(1e-12));
}
