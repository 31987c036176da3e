#pragma once
// train --search-rounds: the policy's score as a linear correction of its score base
// (policy/linear_correction.hpp), its few weights found by compass search (rl/compass_search.hpp)
// on the greedy keep-sets' exact KL over training windows, instead of by REINFORCE.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <distillcache/distillcache.hpp>

namespace dc_examples {

struct LinearSearchSettings {
  int contexts = 16;  // training windows the objective averages over, taken evenly
  // Held-out training windows (none of the objective's) that choose which round's point is kept:
  // the objective's own minimum overfits few windows (a 12-window decode-mode search lowered its
  // objective by 24 % and the validation KL rose). 0: keep the objective's minimum.
  int holdout = 0;
  // Modes the objective averages over (each window scored in each); empty: the training mode.
  std::vector<dc::EvictionMode> modes;
  std::vector<float> start;  // the first point; empty: w = 0, the score base alone
  // After the search: training windows (none of the search's) that score the pruning pass, which
  // sets weights to 0 while that does not raise their KL (prune_linear_correction). 0: no pass.
  int prune = 0;
  std::vector<dc::TrainingContext> prune_windows;  // the pass's windows (prune_windows())
  // --search-balance: the objective of the search, its hold-out and its pruning pass becomes the
  // mean over kinds (text windows, task prompts), budgets and modes of the KL relative to this
  // policy's on the same windows (WindowObjective), and their windows are taken from each kind in
  // proportion. Without it a kind with large KLs rules: a task prompt's KL under H2O is 1-2 nats,
  // a text window's 0.1-0.3. Null: the plain mean KL.
  std::shared_ptr<dc::EvictionPolicy> balance;
  std::string balance_name;
  // --search-worst-case: with a balance, the objective is the largest of those ratios, the kind and
  // budget where the policy does worst against the balance policy, instead of their mean (a mean
  // lets a large gain on one kind pay for a loss on another; the target is a ratio below 1 on all).
  bool worst_case = false;
  dc::CompassSearchOptions search;
};

// The modes a search's objective (and its validation) averages over: the given ones, or the
// trainer's own mode (nullopt) when none are given.
inline std::vector<std::optional<dc::EvictionMode>> objective_modes(const std::vector<dc::EvictionMode>& modes) {
  if (modes.empty()) return {std::nullopt};
  return {modes.begin(), modes.end()};
}

// `count` training windows half-way between those every (size / count)-th would pick: the windows
// at odd multiples of size / (2 count).
inline std::vector<dc::TrainingContext> midpoint_windows(const std::vector<dc::TrainingContext>& all, int count) {
  std::vector<dc::TrainingContext> out;
  for (int i = 0; i < count; ++i) out.push_back(all[(2 * std::size_t(i) + 1) * all.size() / (2 * std::size_t(count))]);
  return out;
}

// Refuses `other` windows (named by `option`) that coincide with any of the search's windows.
inline void check_disjoint(const std::vector<dc::TrainingContext>& other, const std::vector<dc::TrainingContext>& search,
                           const char* option, int count, int contexts) {
  // Odd multiples of size / (2 h) never meet a multiple of size / n when h is a multiple of n
  // (n = h included); this check covers the rest (and rounding).
  for (const auto& h : other)
    for (const auto& c : search)
      DC_CHECK(h.prompt != c.prompt, option, " ", count, " and --search-contexts ", contexts,
               " pick the same window; choose a count that is a multiple of the search count");
}

// The windows of each kind (TrainingContext::kind: text windows, task prompts), the kinds in the
// order they first appear.
inline std::vector<std::vector<dc::TrainingContext>> windows_by_kind(const std::vector<dc::TrainingContext>& all) {
  std::vector<std::vector<dc::TrainingContext>> out;
  for (const auto& w : all) {
    const auto at = std::find_if(out.begin(), out.end(), [&](const auto& k) { return k.front().kind == w.kind; });
    if (at == out.end())
      out.push_back({w});
    else
      at->push_back(w);
  }
  return out;
}

// Part k's share of `count` split in proportion to the parts' sizes (the shares sum to count).
inline int proportional_share(int count, const std::vector<std::vector<dc::TrainingContext>>& parts, std::size_t k) {
  std::size_t total = 0, before = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i < k) before += parts[i].size();
    total += parts[i].size();
  }
  const auto upto = [&](std::size_t n) { return int(std::size_t(count) * n / total); };
  return upto(before + parts[k].size()) - upto(before);
}

// Training windows for the objective (every (size / n)-th) and for the hold-out (the windows
// half-way between those), disjoint as long as there are at least 2n of them.
inline std::pair<std::vector<dc::TrainingContext>, std::vector<dc::TrainingContext>> split_evenly(
    const std::vector<dc::TrainingContext>& all, int contexts, int holdout) {
  const std::size_t n = std::min(all.size(), std::size_t(contexts));
  DC_CHECK(holdout == 0 || all.size() >= 2 * std::max(n, std::size_t(holdout)), "--search-holdout ", holdout,
           ": ", all.size(), " training windows are too few for ", n, " search and ", holdout,
           " held-out windows (need twice the larger)");
  std::vector<dc::TrainingContext> search;
  for (std::size_t i = 0; i < n; ++i) search.push_back(all[i * all.size() / n]);
  std::vector<dc::TrainingContext> held = midpoint_windows(all, holdout);
  check_disjoint(held, search, "--search-holdout", holdout, contexts);
  return {std::move(search), std::move(held)};
}

// Kind by kind (--search-balance): each kind's share of `contexts` search windows, every
// (size / n)-th of its windows, and its share of `others` windows (the hold-out's or the pruning
// pass's), the midpoints of its windows that are not search windows: disjoint whatever the shares
// (per kind the counts seldom divide each other, as split_evenly would need).
inline std::pair<std::vector<dc::TrainingContext>, std::vector<dc::TrainingContext>> split_by_kind(
    const std::vector<dc::TrainingContext>& all, int contexts, int others, const char* option) {
  const auto kinds = windows_by_kind(all);
  std::pair<std::vector<dc::TrainingContext>, std::vector<dc::TrainingContext>> out;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    const auto& kind = kinds[k];
    const std::size_t n = std::min(kind.size(), std::size_t(proportional_share(contexts, kinds, k)));
    const int h = proportional_share(others, kinds, k);
    std::vector<bool> searched(kind.size(), false);
    for (std::size_t i = 0; i < n; ++i) searched[i * kind.size() / n] = true;
    std::vector<dc::TrainingContext> rest;
    for (std::size_t i = 0; i < kind.size(); ++i) (searched[i] ? out.first : rest).push_back(kind[i]);
    DC_CHECK(rest.size() >= std::size_t(h), option, " ", others, ": the ", kind.size(), " '", kind.front().kind,
             "' windows are too few for its share of ", n, " search and ", h, " other windows");
    const auto part = midpoint_windows(rest, h);
    out.second.insert(out.second.end(), part.begin(), part.end());
  }
  return out;
}

// The search's and the hold-out's windows: split_evenly over all training windows, or, `by_kind`
// (--search-balance), split_by_kind, so that every kind is in both whatever the order the trainer
// interleaves them in (an even stride over alternating text windows and task prompts can pick
// text alone).
inline std::pair<std::vector<dc::TrainingContext>, std::vector<dc::TrainingContext>> split_search_windows(
    const std::vector<dc::TrainingContext>& all, int contexts, int holdout, bool by_kind = false) {
  DC_CHECK(contexts >= 1 && holdout >= 0, "--search-contexts ", contexts, ", --search-holdout ", holdout);
  if (by_kind) return split_by_kind(all, contexts, holdout, "--search-holdout");
  return split_evenly(all, contexts, holdout);
}

// Whether `window` holds the first or the last `piece` tokens of `prompt` (so the two texts overlap
// by at least `piece` tokens wherever `prompt` lies).
inline bool holds_text_of(const dc::TrainingContext& window, const std::vector<std::int32_t>& prompt,
                          std::size_t piece = 32) {
  std::vector<std::int32_t> text = window.prompt;
  text.insert(text.end(), window.continuation.begin(), window.continuation.end());
  const std::size_t n = std::min(piece, prompt.size());
  const auto found = [&](auto first) { return std::search(text.begin(), text.end(), first, first + std::ptrdiff_t(n)) != text.end(); };
  return found(prompt.begin()) || found(prompt.end() - std::ptrdiff_t(n));
}

// Refuses a pruning pass on the training windows that `available` of them cannot serve.
inline void check_prune_count(std::size_t available, int contexts, int prune) {
  DC_CHECK(prune >= 1 && available >= 2 * std::size_t(std::max(prune, contexts)), "--search-prune ", prune, ": ",
           available, " training windows are too few for it and ", contexts, " search windows (need twice the larger)");
}

// The windows the pruning pass scores on, none of the search's. From the training windows
// (`pool` empty): `prune` midpoint windows, as the hold-out's (`by_kind`: of each kind, in
// proportion, as split_search_windows). From `pool` (windows of another length from the same
// training text, --search-prune-context): `prune` midpoint windows of those that share no text
// with a search window.
inline std::vector<dc::TrainingContext> prune_windows(const std::vector<dc::TrainingContext>& all, int contexts,
                                                      int prune, const std::vector<dc::TrainingContext>& pool = {},
                                                      bool by_kind = false) {
  if (!pool.empty()) {
    const auto search = split_search_windows(all, contexts, 0, by_kind).first;
    std::vector<dc::TrainingContext> apart;
    for (const auto& w : pool)
      if (std::none_of(search.begin(), search.end(), [&](const dc::TrainingContext& c) { return holds_text_of(w, c.prompt); }))
        apart.push_back(w);
    DC_CHECK(prune >= 1 && apart.size() >= std::size_t(prune), "--search-prune ", prune, ": only ", apart.size(),
             " of the ", pool.size(), " --search-prune-context windows share no text with a search window");
    return midpoint_windows(apart, prune);
  }
  check_prune_count(all.size(), contexts, prune);
  if (by_kind) return split_by_kind(all, contexts, prune, "--search-prune").second;
  std::vector<dc::TrainingContext> windows = midpoint_windows(all, prune);
  check_disjoint(windows, split_search_windows(all, contexts, 0).first, "--search-prune", prune, contexts);
  return windows;
}

// The linear correction a policy file carries, as weights for `inputs` (matched by name; an
// input the file lacks gets 0). The file must be a linear correction under the same forced rules
// as `rules`, this run's policy (score base, recent window, newest-query reserve and layers), or
// its weights would mean another ranking. Read before the model loads, so a wrong file fails at
// once.
inline std::vector<float> linear_weights_from(const std::string& path, const std::vector<dc::PolicyInput>& inputs,
                                              const dc::MlpPolicy& rules) {
  const dc::MlpPolicy from = dc::MlpPolicy::from_checkpoint(dc::load_policy_checkpoint(path));
  const auto& hidden = from.layout().hidden;
  DC_CHECK(from.layout().activation == dc::Activation::relu &&
               std::all_of(hidden.begin(), hidden.end(), [](int h) { return h >= 2; }),
           "--search-from: '", path, "' is not a linear correction (those use ReLU and at least 2 units a "
           "layer; train --search-rounds writes them)");
  const auto w = dc::linear_correction_weights(from.layout(), from.params());
  const auto rebuilt = dc::linear_correction_params(from.layout(), w);
  DC_CHECK(std::equal(rebuilt.begin(), rebuilt.end(), from.params().begin()), "--search-from: '", path,
           "' is not a linear correction (a trained MLP; train --search-rounds writes them)");
  DC_CHECK(from.same_forced_rules(rules), "--search-from: '", path, "' has ", from.describe_forced_rules(),
           "; this run has ", rules.describe_forced_rules());
  std::vector<float> start(inputs.size(), 0.0f);
  for (std::size_t i = 0; i < from.inputs().size(); ++i) {
    const auto at = std::find(inputs.begin(), inputs.end(), from.inputs()[i]);
    DC_CHECK(at != inputs.end() || w[i] == 0.0f, "--search-from: '", path, "' weighs the input ",
             dc::policy_input_name(from.inputs()[i]), ", which --inputs lacks");
    if (at != inputs.end()) start[std::size_t(at - inputs.begin())] = w[i];
  }
  return start;
}

// How a search scores points on a set of windows (its objective, its hold-out, its pruning pass).
// Plain: the mean KL over windows, budgets and modes. Balanced (--search-balance): the mean over
// kinds, budgets and modes of a kind's mean KL divided by the balance policy's on the same
// windows, so that a kind of window or a budget whose KLs are small weighs as much as the others;
// with --search-worst-case the largest of those ratios.
struct WindowObjective {
  std::vector<std::vector<dc::TrainingContext>> parts;  // all windows as one part, or one part per kind
  std::vector<std::optional<dc::EvictionMode>> modes;
  std::vector<std::vector<std::vector<double>>> scale;  // [mode][part][budget]: the divisor (1 when plain)
  bool worst_case = false;  // the largest ratio instead of the mean (--search-worst-case)
  std::string what = "KL";  // what the value is, for progress lines: "KL", "KL/h2o", "max KL/h2o"
  std::size_t windows() const {
    std::size_t n = 0;
    for (const auto& p : parts) n += p.size();
    return n;
  }
};

// The objective on `windows` for settings `s`: with s.balance, the balance policy is scored on
// each kind's windows once here (a refusal names a kind and budget where its KL is 0 or not finite).
template <class Trainer>
WindowObjective window_objective(Trainer& trainer, const std::vector<dc::TrainingContext>& windows,
                                 const LinearSearchSettings& s) {
  WindowObjective o;
  o.modes = objective_modes(s.modes);
  o.parts = s.balance ? windows_by_kind(windows) : std::vector<std::vector<dc::TrainingContext>>{windows};
  o.worst_case = s.worst_case;
  if (s.balance) o.what = (s.worst_case ? "max KL/" : "KL/") + s.balance_name;
  for (const auto& mode : o.modes) {
    auto& scale = o.scale.emplace_back();
    for (const auto& part : o.parts) {
      if (!s.balance) {
        scale.push_back(std::vector<double>(trainer.options().budgets.size(), 1.0));
        continue;
      }
      scale.push_back(trainer.validate_policies({s.balance.get()}, part, mode)[0]);
      for (std::size_t b = 0; b < scale.back().size(); ++b)
        DC_CHECK(std::isfinite(scale.back()[b]) && scale.back()[b] > 0.0, "--search-balance ", s.balance_name,
                 ": its KL on the ", part.size(), " '", part.front().kind, "' windows at budget ",
                 trainer.options().budgets[b], " is ", scale.back()[b], "; the objective cannot be relative to it");
    }
  }
  return o;
}

// Each point's (linear weights') objective on o's windows, all points scored in one pass per part
// and mode.
template <class Trainer>
std::vector<double> score_linear_points(Trainer& trainer, const dc::MlpPolicy& policy,
                                        const std::vector<std::vector<float>>& points, const WindowObjective& o,
                                        const char* progress_label = nullptr) {
  std::vector<dc::MlpPolicy> candidates(points.size(), policy);
  std::vector<dc::EvictionPolicy*> ptrs;
  for (std::size_t p = 0; p < points.size(); ++p) {
    const auto params = dc::linear_correction_params(policy.layout(), points[p]);
    std::copy(params.begin(), params.end(), candidates[p].params().begin());
    ptrs.push_back(&candidates[p]);
  }
  std::vector<double> f(points.size(), 0.0);
  const auto start = std::chrono::steady_clock::now();
  const std::size_t total = o.windows() * o.modes.size();
  std::size_t done = 0;
  // With a label: a progress line with an ETA after each window (a pass may take many minutes).
  const auto progress = [&](std::size_t) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++done;
    std::fprintf(stderr, "\r%s: %zu points, window %zu/%zu, %.0f s, ETA %.0f s   ", progress_label, points.size(), done,
                 total, secs, secs / double(done) * double(total - done));
    if (done == total) std::fprintf(stderr, "\n");
  };
  for (std::size_t m = 0; m < o.modes.size(); ++m)
    for (std::size_t q = 0; q < o.parts.size(); ++q) {
      const auto kl = progress_label ? trainer.validate_policies(ptrs, o.parts[q], o.modes[m], progress)
                                     : trainer.validate_policies(ptrs, o.parts[q], o.modes[m]);
      for (std::size_t p = 0; p < points.size(); ++p)
        for (std::size_t b = 0; b < kl[p].size(); ++b)
          if (o.worst_case)
            f[p] = std::max(f[p], kl[p][b] / o.scale[m][q][b]);
          else
            f[p] += kl[p][b] / o.scale[m][q][b] / double(kl[p].size() * o.parts.size() * o.modes.size());
    }
  return f;
}

// Prints the balance policy's KL on each kind of the search's windows: what the objective's
// ratios divide by.
inline void report_balance(const WindowObjective& o, const std::string& name, const std::vector<double>& budgets) {
  for (std::size_t m = 0; m < o.modes.size(); ++m)
    for (std::size_t q = 0; q < o.parts.size(); ++q) {
      std::string kl;
      for (std::size_t b = 0; b < budgets.size(); ++b) {
        char one[48];
        std::snprintf(one, sizeof one, " %g: %.4f", budgets[b], o.scale[m][q][b]);
        kl += one;
      }
      std::fprintf(stderr, "train: --search-balance: %s's KL on the %zu '%s' search windows%s%s (the objective is "
                   "the KL relative to it, each kind and budget alike)\n", name.c_str(), o.parts[q].size(),
                   o.parts[q].front().kind.c_str(), o.modes[m] ? (*o.modes[m] == dc::EvictionMode::prefill ? ", prefill" : ", decode") : "",
                   kl.c_str());
    }
}

// Runs the search from s.start (w = 0 when empty) and leaves the chosen weights in policy: the
// objective's minimum, or with a hold-out the visited point that scored best on it.
template <class Trainer>
dc::CompassSearchResult search_linear_correction(Trainer& trainer, dc::MlpPolicy& policy,
                                                 const LinearSearchSettings& s,
                                                 const std::filesystem::path& log_path) {
  const auto windows = split_search_windows(trainer.training_contexts(), s.contexts, s.holdout, bool(s.balance));
  const std::vector<dc::TrainingContext>& contexts = windows.first;
  const std::vector<dc::TrainingContext>& held = windows.second;
  const WindowObjective objective = window_objective(trainer, contexts, s);
  const WindowObjective holdout_objective = window_objective(trainer, held, s);
  if (s.balance) report_balance(objective, s.balance_name, trainer.options().budgets);
  const dc::MlpLayout& layout = policy.layout();
  dc::check_linear_layout(layout);

  {
    std::ofstream log(log_path);
    log << "round,step,objective,holdout,moved,evaluations,seconds";
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
    evaluations += int(points.size());
    return score_linear_points(trainer, policy, points, objective);
  };
  std::vector<float> kept;  // with a hold-out: the visited point it scores best
  double kept_value = INFINITY, kept_holdout = INFINITY;
  const auto on_round = [&](const dc::CompassSearchRound& r) {
    double holdout = NAN;
    if (!held.empty()) {
      holdout = score_linear_points(trainer, policy, {r.x}, holdout_objective)[0];
      if (holdout < kept_holdout) {
        kept_holdout = holdout;
        kept_value = r.value;
        kept = r.x;
      }
    }
    std::ofstream log(log_path, std::ios::app);
    log << r.round << ',' << r.step << ',' << r.value << ',' << holdout << ',' << (r.moved ? 1 : 0) << ','
        << evaluations << ',' << seconds();
    std::string weights;
    for (float w : r.x) {
      log << ',' << w;
      weights += " " + std::to_string(w).substr(0, 6);
    }
    log << '\n';
    const double per_round = seconds() / double(std::max(r.round, 1));
    char held_out[48] = "";
    if (!held.empty()) std::snprintf(held_out, sizeof held_out, "  hold-out %.4f", holdout);
    std::fprintf(stderr, "search round %3d/%d  step %.4f  %s %.4f%s%s  w%s  %.0f s  (at most %.0f s more)\n", r.round,
                 s.search.max_rounds, r.step, objective.what.c_str(), r.value, held_out, r.moved ? " (moved)" : "        ", weights.c_str(),
                 seconds(), per_round * double(s.search.max_rounds - r.round));
  };
  std::fprintf(stderr, "train: compass search over %zu weights on %zu training windows (%zu mode%s), %zu points a "
               "round; %zu held-out windows choose the result\n", policy.inputs().size(), contexts.size(),
               objective.modes.size(), objective.modes.size() > 1 ? "s" : "", 2 * policy.inputs().size(), held.size());
  std::vector<float> x0 = s.start;
  if (x0.empty()) x0.assign(policy.inputs().size(), 0.0f);
  DC_CHECK(x0.size() == policy.inputs().size(), "--search-from: ", x0.size(), " weights for ",
           policy.inputs().size(), " inputs");
  dc::CompassSearchResult result = dc::compass_search(x0, s.search, evaluate, on_round);
  std::fprintf(stderr, "train: search done: %d rounds, %d evaluations, training-window %s %.4f, %.0f s\n",
               result.rounds, result.evaluations, objective.what.c_str(), result.value, seconds());
  if (!held.empty() && kept != result.x) {
    std::fprintf(stderr, "train: the hold-out keeps an earlier point: training-window %s %.4f, hold-out %.4f\n",
                 objective.what.c_str(), kept_value, kept_holdout);
    result.x = kept;
    result.value = kept_value;
  }
  const auto params = dc::linear_correction_params(layout, result.x);
  std::copy(params.begin(), params.end(), policy.params().begin());
  return result;
}

// train --search-prune: backward elimination (rl/backward_elimination.hpp) of the policy's
// nonzero linear weights, each drop scored on s.prune_windows in the search's modes; leaves the kept weights in policy. One line per scored drop goes to log_path.
template <class Trainer>
dc::BackwardEliminationResult prune_linear_correction(Trainer& trainer, dc::MlpPolicy& policy,
                                                      const LinearSearchSettings& s,
                                                      const std::filesystem::path& log_path) {
  const std::vector<dc::TrainingContext>& windows = s.prune_windows;
  DC_CHECK(!windows.empty(), "train: the pruning pass has no windows");
  const WindowObjective objective = window_objective(trainer, windows, s);
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  {
    std::ofstream log(log_path);
    log << "round,objective,dropped_input,objective_without,kept,seconds\n";
    DC_CHECK(log, "--out: cannot write '", log_path.string(), "'");
  }
  std::fprintf(stderr, "train: pruning pass: each nonzero weight set to 0 in turn, scored on %zu other training "
               "windows of %zu prompt tokens\n", windows.size(), windows.front().prompt.size());
  const auto w0 = dc::linear_correction_weights(policy.layout(), policy.params());
  const auto evaluate = [&](const std::vector<std::vector<float>>& points) {
    return score_linear_points(trainer, policy, points, objective, "prune");
  };
  const auto on_round = [&](const dc::BackwardEliminationStep& r) {
    std::ofstream log(log_path, std::ios::app);
    for (std::size_t j = 0; j < r.tried.size(); ++j) {
      const char* name = dc::policy_input_name(policy.inputs()[r.tried[j]]);
      const bool kept = r.kept == std::ptrdiff_t(j);
      log << r.round << ',' << r.value << ',' << name << ',' << r.dropped[j] << ',' << (kept ? 1 : 0) << ','
          << seconds() << '\n';
      std::fprintf(stderr, "prune round %d  %s %.4f  without %-13s %.4f (%+.2f %%)%s\n", r.round,
                   objective.what.c_str(), r.value, name,
                   r.dropped[j], 100.0 * (r.dropped[j] / r.value - 1.0), kept ? "  dropped" : "");
    }
  };
  dc::BackwardEliminationResult result = dc::backward_elimination(w0, evaluate, on_round);
  std::fprintf(stderr, "train: pruning done: %zu weight%s set to 0, prune-window %s %.4f -> %.4f, %.0f s\n",
               result.zeroed.size(), result.zeroed.size() == 1 ? "" : "s", objective.what.c_str(), result.start_value,
               result.value,
               seconds());
  const auto params = dc::linear_correction_params(policy.layout(), result.x);
  std::copy(params.begin(), params.end(), policy.params().begin());
  return result;
}

}  // namespace dc_examples
