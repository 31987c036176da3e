#pragma once
// train --search-rounds: the policy's score as a linear correction of its score base
// (policy/linear_correction.hpp), its few weights found by compass search (rl/compass_search.hpp)
// on the greedy keep-sets' exact KL over training windows, instead of by REINFORCE.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>

namespace dc_examples {

struct LinearSearchSettings {
  int contexts = 16;  // training windows the objective averages over, taken evenly
  dc::CompassSearchOptions search;
};

// Runs the search from w = 0 (the score base alone) and leaves the best weights in policy.
template <class Trainer>
dc::CompassSearchResult search_linear_correction(Trainer& trainer, dc::MlpPolicy& policy,
                                                 const LinearSearchSettings& s,
                                                 const std::filesystem::path& log_path) {
  const auto& all = trainer.training_contexts();
  DC_CHECK(s.contexts >= 1, "--search-contexts: ", s.contexts);
  std::vector<dc::TrainingContext> contexts;
  const std::size_t n = std::min(all.size(), std::size_t(s.contexts));
  for (std::size_t i = 0; i < n; ++i) contexts.push_back(all[i * all.size() / n]);
  const dc::MlpLayout& layout = policy.layout();
  dc::check_linear_layout(layout);

  {
    std::ofstream log(log_path);
    log << "round,step,objective,moved,evaluations,seconds";
    for (dc::PolicyInput in : policy.inputs()) log << ",w_" << dc::policy_input_name(in);
    log << '\n';
    DC_CHECK(log, "--out: cannot write '", log_path.string(), "'");
  }
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int evaluations = 0;
  const auto evaluate = [&](const std::vector<std::vector<float>>& points) {
    std::vector<dc::MlpPolicy> candidates(points.size(), policy);
    std::vector<dc::EvictionPolicy*> ptrs;
    for (std::size_t p = 0; p < points.size(); ++p) {
      const auto params = dc::linear_correction_params(layout, points[p]);
      std::copy(params.begin(), params.end(), candidates[p].params().begin());
      ptrs.push_back(&candidates[p]);
    }
    const auto kl = trainer.validate_policies(ptrs, contexts);
    std::vector<double> f;
    for (const auto& per_budget : kl) {
      double sum = 0.0;
      for (double x : per_budget) sum += x;
      f.push_back(sum / double(per_budget.size()));
    }
    evaluations += int(points.size());
    return f;
  };
  const auto on_round = [&](const dc::CompassSearchRound& r) {
    std::ofstream log(log_path, std::ios::app);
    log << r.round << ',' << r.step << ',' << r.value << ',' << (r.moved ? 1 : 0) << ',' << evaluations << ','
        << seconds();
    std::string weights;
    for (float w : r.x) {
      log << ',' << w;
      weights += " " + std::to_string(w).substr(0, 6);
    }
    log << '\n';
    const double per_round = seconds() / double(std::max(r.round, 1));
    std::fprintf(stderr, "search round %3d/%d  step %.4f  KL %.4f%s  w%s  %.0f s  (at most %.0f s more)\n", r.round,
                 s.search.max_rounds, r.step, r.value, r.moved ? " (moved)" : "        ", weights.c_str(), seconds(),
                 per_round * double(s.search.max_rounds - r.round));
  };
  std::fprintf(stderr, "train: compass search over %zu weights on %zu training windows, %zu points a round\n",
               policy.inputs().size(), contexts.size(), 2 * policy.inputs().size());
  const std::vector<float> x0(policy.inputs().size(), 0.0f);
  const dc::CompassSearchResult result = dc::compass_search(x0, s.search, evaluate, on_round);
  const auto params = dc::linear_correction_params(layout, result.x);
  std::copy(params.begin(), params.end(), policy.params().begin());
  std::fprintf(stderr, "train: search done: %d rounds, %d evaluations, training-window KL %.4f, %.0f s\n",
               result.rounds, result.evaluations, result.value, seconds());
  return result;
}

}  // namespace dc_examples
