#pragma once
// The REINFORCE trainer of the DistillCache policy.
//
// One update: for each of `contexts_per_update` contexts (taken in order from the training
// windows, wrapping), the prompt is prefilled once with the policy's observation window; the
// full cache (teacher) is teacher-forced on the continuation; then for every budget, K keep-sets
// are sampled (Gumbel-top-k per group, rl/sampled_eviction.hpp) and each student is
// teacher-forced on the same continuation from a copy of the one prefill; the students of all
// budgets decode together as one batch (DecoderBatch), the weights streaming once per step for
// all of them. The reward of a
// rollout is minus its mean per-step KL(teacher || student) over the steps its eviction can
// change (step 0 predicts from the prompt's own logits and is the same for every student); the
// advantage is leave-one-out over the K rollouts of that (context, budget) (rl/reinforce.hpp).
// The loss, per (context, budget) and averaged over them,
//   - 1/K sum_k A_k (1/picks) log p(S_k)  -  beta * mean over evictions and groups of H_g
// (picks = the number of choices in one eviction, so a decision weighs the same at any budget
// and granularity), is differentiated through the Plackett-Luce log-probability and the MLP
// (rl/policy_gradient.hpp), clipped to a global norm, and applied by Adam (cpu/adam.hpp) with a
// warm-up + cosine learning rate (rl/schedule.hpp).
//
// Everything random is keyed on (seed, update, context, budget, rollout, eviction), and the
// data order on the update number, so the state is only the parameters, Adam's moments and
// the step: a resumed run continues bit for bit (save_state / restore_state).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../cpu/adam.hpp"
#include "../cpu/kl.hpp"
#include "../decode/evicting_decoder.hpp"
#include "../eval/fidelity.hpp"
#include "../eval/future_attention.hpp"
#include "policy_gradient.hpp"
#include "reinforce.hpp"
#include "sampled_eviction.hpp"
#include "schedule.hpp"
#include "warm_start.hpp"

namespace dc {

struct TrainerOptions {
  int context = 512;       // prompt tokens L
  int continuation = 32;   // teacher-forced tokens T
  std::vector<double> budgets = {0.125, 0.25, 0.5};
  int rollouts = 8;        // K keep-sets sampled per (context, budget)
  Granularity granularity = Granularity::head;
  EvictionMode mode = EvictionMode::prefill;
  int chunk = 16;          // decode-mode slack (Budget::chunk)
  int updates = 200;       // total updates: the learning-rate schedule spans them
  int contexts_per_update = 1;
  float lr = 3e-3f, lr_floor = 3e-4f;
  int warmup = 10;
  float entropy_bonus = 1e-3f;   // beta
  float max_grad_norm = 1.0f;    // global-norm clipping
  bool standardise_advantages = true;
  int explore_groups = 8;        // groups sampled per eviction (0 = all; rl/sampled_eviction.hpp)
  float temperature = 1.0f;      // keep-sets are Plackett-Luce samples of scores / temperature
  // The K rollouts of a (context, budget) explore the same groups (GumbelSelector) rather than
  // groups of their own, so their leave-one-out baseline compares like with like.
  bool shared_exploration = false;
  std::uint64_t seed = 1;

  void validate() const {
    DC_CHECK(context > 0 && continuation >= 2, "trainer: context ", context, " must be > 0 and "
             "continuation ", continuation, " >= 2 (step 0 is the same for every student)");
    DC_CHECK(!budgets.empty(), "trainer: no budget");
    for (double b : budgets)
      DC_CHECK(b > 0.0 && b < 1.0, "trainer: budget fraction ", b, " must be in (0, 1)");
    DC_CHECK(rollouts >= 2, "trainer: ", rollouts, " rollouts; leave-one-out needs at least 2");
    DC_CHECK(updates >= 1 && contexts_per_update >= 1 && warmup >= 0 && warmup <= updates,
             "trainer: updates ", updates, ", contexts per update ", contexts_per_update,
             ", warm-up ", warmup, ": need updates >= 1, contexts >= 1, 0 <= warm-up <= updates");
    DC_CHECK(chunk >= 1, "trainer: chunk must be >= 1, got ", chunk);
    DC_CHECK(explore_groups >= 0, "trainer: explore_groups must be >= 0, got ", explore_groups);
    DC_CHECK(std::isfinite(entropy_bonus) && entropy_bonus >= 0.0f, "trainer: entropy bonus ",
             entropy_bonus, " must be finite and >= 0");
    DC_CHECK(std::isfinite(max_grad_norm) && max_grad_norm > 0.0f, "trainer: max gradient norm ",
             max_grad_norm, " must be finite and > 0");
    DC_CHECK(std::isfinite(temperature) && temperature > 0.0f, "trainer: sampling temperature ",
             temperature, " must be finite and > 0");
  }

  nlohmann::json to_json() const {
    return {{"context", context}, {"continuation", continuation}, {"budgets", budgets},
            {"rollouts", rollouts}, {"granularity", granularity_name(granularity)},
            {"mode", mode == EvictionMode::prefill ? "prefill" : "decode"}, {"chunk", chunk},
            {"updates", updates}, {"contexts_per_update", contexts_per_update}, {"lr", lr},
            {"lr_floor", lr_floor}, {"warmup", warmup}, {"entropy_bonus", entropy_bonus},
            {"max_grad_norm", max_grad_norm}, {"standardise_advantages", standardise_advantages},
            {"explore_groups", explore_groups}, {"temperature", temperature},
            {"shared_exploration", shared_exploration}, {"seed", seed}};
  }
  static TrainerOptions from_json(const nlohmann::json& j) {
    DC_CHECK(j.is_object(), "trainer options: not a JSON object");
    TrainerOptions o;
    try {
      o.context = j.at("context").get<int>();
      o.continuation = j.at("continuation").get<int>();
      o.budgets = j.at("budgets").get<std::vector<double>>();
      o.rollouts = j.at("rollouts").get<int>();
      o.granularity = parse_granularity(j.at("granularity").get<std::string>());
      const auto mode = j.at("mode").get<std::string>();
      DC_CHECK(mode == "prefill" || mode == "decode", "trainer options: unknown mode '", mode, "'");
      o.mode = mode == "prefill" ? EvictionMode::prefill : EvictionMode::decode;
      o.chunk = j.at("chunk").get<int>();
      o.updates = j.at("updates").get<int>();
      o.contexts_per_update = j.at("contexts_per_update").get<int>();
      o.lr = j.at("lr").get<float>();
      o.lr_floor = j.at("lr_floor").get<float>();
      o.warmup = j.at("warmup").get<int>();
      o.entropy_bonus = j.at("entropy_bonus").get<float>();
      o.max_grad_norm = j.at("max_grad_norm").get<float>();
      o.standardise_advantages = j.at("standardise_advantages").get<bool>();
      o.explore_groups = j.at("explore_groups").get<int>();
      o.temperature = j.value("temperature", 1.0f);  // absent in checkpoints written before it
      o.shared_exploration = j.value("shared_exploration", false);  // likewise
      o.seed = j.at("seed").get<std::uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      DC_FAIL("trainer options: ", e.what());
    }
    o.validate();
    return o;
  }
};

// One training context: the prompt the policy compresses and the continuation teacher-forced
// after it. Text windows split at TrainerOptions::context; a task sample's prompt has its own
// length and its continuation is the full-cache model's own answer (rl/task_contexts.hpp).
struct TrainingContext {
  std::vector<std::int32_t> prompt, continuation;
  // What the window is ("text", "task": rl/task_contexts.hpp): a search can weigh each kind alike
  // however many windows it has (examples/train --search-balance). Training ignores it.
  std::string kind = "text";
};

// Windows of context + continuation tokens, each split into its prompt and its continuation.
inline std::vector<TrainingContext> split_windows(const std::vector<std::vector<std::int32_t>>& windows,
                                                  int context, int continuation) {
  std::vector<TrainingContext> out;
  out.reserve(windows.size());
  for (std::size_t i = 0; i < windows.size(); ++i) {
    DC_CHECK(int(windows[i].size()) == context + continuation, "trainer: context ", i, " has ",
             windows[i].size(), " tokens, need ", context + continuation);
    out.push_back({{windows[i].begin(), windows[i].begin() + context},
                   {windows[i].begin() + context, windows[i].end()}});
  }
  return out;
}

struct UpdateStats {
  int update = 0;
  float lr = 0.0f;
  double reward = 0.0;       // mean return of the sampled students (= - mean KL)
  double kl = 0.0;           // mean per-step KL of the sampled students
  double entropy = 0.0;      // mean first-pick entropy per group
  double grad_norm = 0.0;    // before clipping
  double seconds = 0.0;
  std::int64_t tokens = 0;   // tokens run through the model (prefill + teacher + students)
};

template <Backend B, class W>
class ReinforceTrainer {
 public:
  // Text windows of options.context + options.continuation tokens.
  ReinforceTrainer(Transformer<B, W>& model, MlpPolicy& policy, TrainerOptions options,
                   const std::vector<std::vector<std::int32_t>>& windows)
      : ReinforceTrainer(model, policy, options,
                         split_windows(windows, options.context, options.continuation)) {}

  // Contexts of any prompt and continuation lengths (a mix of text windows and task samples).
  ReinforceTrainer(Transformer<B, W>& model, MlpPolicy& policy, TrainerOptions options,
                   std::vector<TrainingContext> contexts)
      : model_(model), policy_(policy), opt_(std::move(options)), contexts_(std::move(contexts)),
        m_(policy.params().size(), 0.0f), v_(policy.params().size(), 0.0f),
        grad_(policy.params().size(), 0.0f) {
    opt_.validate();
    DC_CHECK(!contexts_.empty(), "trainer: no training context");
    for (std::size_t i = 0; i < contexts_.size(); ++i) check_context(contexts_[i], "context " + std::to_string(i));
  }

  const TrainerOptions& options() const { return opt_; }
  int step() const { return step_; }
  bool done() const { return step_ >= opt_.updates; }

  // Students decoded as one batch (not a training option: it changes speed and memory, never a
  // result). Each holds a KV cache of context + continuation tokens.
  void set_max_batch(std::size_t students) {
    DC_CHECK(students >= 1, "trainer: a batch of ", students, " students");
    max_batch_ = students;
  }

  // Runs the next update (step() + 1).
  UpdateStats update() {
    DC_CHECK(!done(), "trainer: all ", opt_.updates, " updates are done");
    const auto start = std::chrono::steady_clock::now();
    const int u = step_ + 1;
    UpdateStats st;
    st.update = u;
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    const double pairs = double(opt_.contexts_per_update) * double(opt_.budgets.size());
    double reward_sum = 0.0, entropy_sum = 0.0;
    std::int64_t rollouts = 0, entropy_terms = 0;
    for (int c = 0; c < opt_.contexts_per_update; ++c) {
      const std::size_t w = (std::size_t(u - 1) * std::size_t(opt_.contexts_per_update) + std::size_t(c)) %
                            contexts_.size();
      const std::span<const std::int32_t> prompt(contexts_[w].prompt), continuation(contexts_[w].continuation);
      const auto teacher = prefill_and_teach(prompt, continuation);
      st.tokens += std::int64_t(prompt.size() + continuation.size());
      // Every rollout of every budget of this context, decoded as batches (rollouts()).
      const std::size_t per_budget = std::size_t(opt_.rollouts);
      std::vector<double> returns(opt_.budgets.size() * per_budget);
      std::vector<std::vector<SampledEviction>> records(returns.size());
      rollouts_of_context(u, c, prompt.size(), continuation, teacher, returns, records);
      st.tokens += std::int64_t(returns.size()) * std::int64_t(continuation.size() - 1);
      for (std::size_t b = 0; b < opt_.budgets.size(); ++b) {
        const std::span<double> budget_returns(returns.data() + b * per_budget, per_budget);
        for (double r : budget_returns) reward_sum += r;
        rollouts += opt_.rollouts;
        const auto adv = leave_one_out_advantages(budget_returns, opt_.standardise_advantages);
        for (int k = 0; k < opt_.rollouts; ++k) {
          const auto& recs = records[b * per_budget + std::size_t(k)];
          for (const SampledEviction& e : recs) {
            const double picks = std::max<double>(1.0, double(e.picks.rows.size()));
            const double groups = double(e.group_offsets.size() - 1);  // the entropy is over all
            const double weight = adv[std::size_t(k)] / (double(opt_.rollouts) * pairs * picks);
            const double beta = double(opt_.entropy_bonus) /
                                (double(opt_.rollouts) * pairs * double(recs.size()) * groups);
            const auto t = accumulate_policy_gradient(policy_, e, weight, beta, grad_);
            entropy_sum += t.entropy / groups;
            ++entropy_terms;
          }
        }
      }
    }
    const Context<cpu> host;
    const auto n = std::int64_t(grad_.size());
    st.grad_norm = grad_norm(host, grad_.data(), n);
    scale_gradients(host, grad_.data(), n, math::clip_factor(st.grad_norm, opt_.max_grad_norm));
    st.lr = learning_rate(u, opt_.warmup, opt_.updates, opt_.lr, opt_.lr_floor);
    AdamHyper hyper;
    hyper.lr = st.lr;
    adam_update(host, policy_.params().data(), grad_.data(), m_.data(), v_.data(), n, hyper, u);
    step_ = u;
    st.reward = rollouts ? reward_sum / double(rollouts) : 0.0;
    st.kl = -st.reward;
    st.entropy = entropy_terms ? entropy_sum / double(entropy_terms) : 0.0;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return st;
  }

  // Warm start (rl/warm_start.hpp): fits the scores to sum_j target[j] * input_j (target has
  // one coefficient per policy input, in the policy's input order; e.g. 2 * alpha + 8 *
  // position: attention mass with a soft preference for recent tokens) on the first `contexts`
  // training windows' features (once per training budget), at most max_rows rows taken evenly
  // from them.
  WarmStartResult warm_start(int contexts, std::span<const float> target, int steps, float lr,
                             std::int64_t max_rows = 1 << 15) {
    DC_CHECK(target.size() == policy_.inputs().size(), "warm start: ", target.size(),
             " target coefficients for ", policy_.inputs().size(), " policy inputs");
    return warm_start_to(contexts, [&](std::span<const float> row) {
      float t = 0.0f;
      for (std::size_t j = 0; j < row.size(); ++j) t += target[j] * row[j];
      return t;
    }, steps, lr, max_rows);
  }

  // The same with any target: target_of(row) gives the score to fit for one row of inputs.
  template <class TargetOf>
  WarmStartResult warm_start_to(int contexts, TargetOf&& target_of, int steps, float lr,
                                std::int64_t max_rows = 1 << 15) {
    const std::size_t k = policy_.inputs().size();
    std::vector<float> inputs, targets;
    for_warm_start_contexts(contexts, [&](std::span<const std::int32_t>, const KVCache<B>& cache,
                                          const TokenFeatures& f) {
      // The rows once per training budget: budget_age differs between them, the rest does not.
      for (double fraction : opt_.budgets) {
        const auto x = policy_inputs(f, policy_.inputs(), budget_of(fraction).resolve(cache.length()));
        inputs.insert(inputs.end(), x.begin(), x.end());
        for (std::size_t r = 0; r < x.size() / k; ++r)
          targets.push_back(target_of(std::span<const float>(x.data() + r * k, k)));
      }
    });
    return fit_rows(inputs, targets, steps, lr, max_rows);
  }

  // Warm start to what the full-cache model reads next (eval/future_attention.hpp): in each group
  // the softmax of the scores is fitted to the rows' shares of the continuation's attention
  // (fit_policy_distributions: cross-entropy), on the first `contexts` training windows, whose
  // continuations the teacher runs once more with statistics on. Whole groups are kept, evenly
  // spaced, up to about max_rows rows; with budget_age among the inputs a group enters once per
  // training budget (its inputs differ), otherwise once.
  WarmStartResult warm_start_future(int contexts, int steps, float lr, std::int64_t max_rows = 1 << 16) {
    DC_CHECK(max_rows >= 1, "warm start: ", max_rows, " rows");
    const std::size_t k = policy_.inputs().size();
    const auto& in = policy_.inputs();
    const bool per_budget = std::find(in.begin(), in.end(), PolicyInput::budget_age) != in.end();
    struct Group {
      std::vector<float> inputs, shares;
    };
    std::vector<Group> groups;
    for_warm_start_contexts(contexts, [&](std::span<const std::int32_t> continuation,
                                          const KVCache<B>& cache, const TokenFeatures& f) {
      const auto shares = future_attention_shares(model_, cache, f, continuation);
      const std::size_t budgets = per_budget ? opt_.budgets.size() : 1;
      for (std::size_t b = 0; b < budgets; ++b) {
        const auto x = policy_inputs(f, in, budget_of(opt_.budgets[b]).resolve(cache.length()));
        for (const FeatureGroup& g : f.groups)
          groups.push_back({{x.begin() + std::ptrdiff_t(std::size_t(g.row_begin) * k),
                             x.begin() + std::ptrdiff_t(std::size_t(g.row_end) * k)},
                            {shares.begin() + g.row_begin, shares.begin() + g.row_end}});
      }
    });
    DC_CHECK(!groups.empty(), "warm start: no group to fit");
    std::int64_t all_rows = 0;
    for (const Group& g : groups) all_rows += std::int64_t(g.shares.size());
    const std::size_t stride = std::size_t(std::max<std::int64_t>(1, (all_rows + max_rows - 1) / max_rows));
    std::vector<float> inputs, targets;
    std::vector<std::int64_t> offsets = {0};
    for (std::size_t g = 0; g < groups.size(); g += stride) {
      inputs.insert(inputs.end(), groups[g].inputs.begin(), groups[g].inputs.end());
      targets.insert(targets.end(), groups[g].shares.begin(), groups[g].shares.end());
      offsets.push_back(std::int64_t(targets.size()));
    }
    return fit_policy_distributions(policy_, inputs, offsets, targets, steps, lr);
  }

  // Mean KL of the policy's deterministic keep-sets on held-out windows, per budget (same
  // granularity and mode as training), through the evaluator examples/eval uses.
  std::vector<double> validate(const std::vector<std::vector<std::int32_t>>& windows) {
    return validate(split_windows(windows, opt_.context, opt_.continuation));
  }
  std::vector<double> validate(const std::vector<TrainingContext>& contexts) {
    return validate_policy(policy_, contexts);
  }
  // The same for any policy, e.g. a heuristic to compare the learned one with.
  std::vector<double> validate_policy(EvictionPolicy& policy, const std::vector<TrainingContext>& contexts) {
    return validate_policies({&policy}, contexts)[0];
  }
  // Several policies in one pass (one prefill and teacher per context for all): [policy][budget].
  // `mode` overrides the training mode (a search may score prefill and decode mode alike);
  // `progress`, when given, is called with the count of contexts done after each one.
  std::vector<std::vector<double>> validate_policies(const std::vector<EvictionPolicy*>& policies,
                                                     const std::vector<TrainingContext>& contexts,
                                                     std::optional<EvictionMode> mode = std::nullopt,
                                                     const std::function<void(std::size_t)>& progress = {}) {
    std::vector<Budget> budgets;
    for (double f : opt_.budgets) budgets.push_back(budget_of(f));
    FidelityEvaluator<B, W> eval(model_, policies, budgets, mode.value_or(opt_.mode), {opt_.granularity});
    for (std::size_t i = 0; i < contexts.size(); ++i) {
      check_context(contexts[i], "validation context " + std::to_string(i));
      eval.add_context(contexts[i].prompt, contexts[i].continuation, [](std::size_t) {});
      if (progress) progress(i + 1);
    }
    std::vector<std::vector<double>> kl(policies.size());
    for (std::size_t p = 0; p < policies.size(); ++p)
      for (std::size_t b = 0; b < budgets.size(); ++b) kl[p].push_back(eval.total(p, 0, b).kl_mean());
    return kl;
  }
  // The training contexts, in the order updates take them.
  const std::vector<TrainingContext>& training_contexts() const { return contexts_; }

  // The policy checkpoint with the optimizer state (Adam's moments, the step, the options):
  // what a resumed run needs to continue bit for bit.
  PolicyCheckpoint save_state() const {
    PolicyCheckpoint c = policy_.to_checkpoint();
    c.state["adam_m"] = m_;
    c.state["adam_v"] = v_;
    c.trainer = {{"step", step_}, {"options", opt_.to_json()}};
    return c;
  }
  // Restores the optimizer state of a checkpoint save_state() wrote (the policy's parameters
  // are loaded with the policy: MlpPolicy::from_checkpoint). The options must be the same.
  void restore_state(const PolicyCheckpoint& c) {
    DC_CHECK(c.trainer.is_object() && c.trainer.contains("step") && c.trainer.contains("options"),
             "trainer: the checkpoint holds no trainer state (a policy file, not a training "
             "checkpoint?)");
    const TrainerOptions saved = TrainerOptions::from_json(c.trainer.at("options"));
    DC_CHECK(saved.to_json() == opt_.to_json(), "trainer: the checkpoint was trained with other "
             "options: ", saved.to_json().dump(), " (now ", opt_.to_json().dump(), ")");
    for (const char* name : {"adam_m", "adam_v"}) {
      DC_CHECK(c.state.count(name), "trainer: the checkpoint has no '", name, "' tensor");
      DC_CHECK(c.state.at(name).size() == m_.size(), "trainer: '", name, "' has ",
               c.state.at(name).size(), " entries for ", m_.size(), " parameters");
    }
    m_ = c.state.at("adam_m");
    v_ = c.state.at("adam_v");
    const int step = c.trainer.at("step").get<int>();
    DC_CHECK(step >= 0 && step <= opt_.updates, "trainer: checkpoint step ", step, " outside [0, ",
             opt_.updates, "]");
    step_ = step;
  }

 private:
  void check_context(const TrainingContext& c, const std::string& what) const {
    DC_CHECK(!c.prompt.empty() && c.continuation.size() >= 2, "trainer: ", what, " has a prompt of ",
             c.prompt.size(), " and a continuation of ", c.continuation.size(),
             " tokens; need a prompt and at least 2 (step 0 is the same for every student)");
    DC_CHECK(std::int64_t(c.prompt.size() + c.continuation.size()) <= model_.config().max_position,
             "trainer: ", what, " has ", c.prompt.size() + c.continuation.size(),
             " tokens, more than the model's context of ", model_.config().max_position);
  }

  Budget budget_of(double fraction) const {
    Budget b = Budget::of_fraction(fraction);
    b.chunk = opt_.chunk;
    return b;
  }

  // Prefills the prompt of each of the first `contexts` training windows as the policy observes
  // it and calls visit(continuation, cache, features at the training granularity).
  template <class Visit>
  void for_warm_start_contexts(int contexts, Visit&& visit) {
    DC_CHECK(contexts >= 1, "warm start: ", contexts, " contexts");
    for (int c = 0; c < contexts && std::size_t(c) < contexts_.size(); ++c) {
      const TrainingContext& context = contexts_[std::size_t(c)];
      const int n = int(context.prompt.size());
      auto cache = model_.make_cache(n);
      cache.set_observed_from(policy_.observation_start(n));
      model_.forward(context.prompt, cache);
      const TokenFeatures f = gather_features(model_.context(), cache, opt_.granularity);
      visit(context.continuation, cache, f);
    }
  }

  // Fits the policy to targets on at most max_rows of the rows, taken evenly.
  WarmStartResult fit_rows(const std::vector<float>& all_inputs, const std::vector<float>& all_targets,
                           int steps, float lr, std::int64_t max_rows) {
    DC_CHECK(max_rows >= 1, "warm start: ", max_rows, " rows");
    const std::size_t k = policy_.inputs().size();
    const std::int64_t rows = std::int64_t(all_targets.size());
    const std::int64_t stride = std::max<std::int64_t>(1, (rows + max_rows - 1) / max_rows);
    std::vector<float> inputs, targets;
    for (std::int64_t r = 0; r < rows; r += stride) {
      inputs.insert(inputs.end(), all_inputs.begin() + std::ptrdiff_t(std::size_t(r) * k),
                    all_inputs.begin() + std::ptrdiff_t(std::size_t(r + 1) * k));
      targets.push_back(all_targets[std::size_t(r)]);
    }
    return fit_policy_scores(policy_, inputs, targets, steps, lr);
  }

  struct Teacher {
    KVCache<B> prefilled;
    std::vector<float> prompt_logits;  // [vocab]: step 0
    std::vector<float> rows;           // [T, vocab]: step t's next-token logits
  };

  Teacher prefill_and_teach(std::span<const std::int32_t> prompt,
                            std::span<const std::int32_t> continuation) {
    const int n = int(prompt.size());
    Teacher t{model_.make_cache(n), {}, {}};
    t.prefilled.set_observed_from(policy_.observation_start(n));
    t.prompt_logits = model_.forward(prompt, t.prefilled);
    // The full cache on the continuation, without statistics (nobody reads them).
    auto full = model_.make_cache(n + int(continuation.size()));
    full.copy_from(model_.context(), t.prefilled);
    full.disable_statistics();
    const std::size_t vocab = t.prompt_logits.size();
    t.rows = t.prompt_logits;
    std::vector<float> logits(vocab);
    for (std::size_t s = 0; s + 1 < continuation.size(); ++s) {
      model_.forward(continuation.subspan(s, 1), full, std::span<float>(logits));
      t.rows.insert(t.rows.end(), logits.begin(), logits.end());
    }
    return t;
  }

  // The sampled students of context c in update u: rollout k of budget b fills
  // returns[b * K + k] (minus its mean KL over steps 1..T-1) and records[b * K + k] (its sampled
  // evictions). They decode as batches of at most max_batch (DecoderBatch); each has its own
  // Gumbel stream, so batching does not change any result (on the CPU, bit for bit).
  void rollouts_of_context(int u, int c, std::size_t prompt_tokens, std::span<const std::int32_t> continuation,
                           const Teacher& teacher, std::span<double> returns,
                           std::span<std::vector<SampledEviction>> records) {
    const int steps = int(continuation.size());
    const std::size_t vocab = teacher.prompt_logits.size(), per_budget = std::size_t(opt_.rollouts);
    for (std::size_t begin = 0; begin < returns.size(); begin += max_batch_) {
      const std::size_t end = std::min(returns.size(), begin + max_batch_);
      std::vector<std::unique_ptr<EvictingDecoder<B, W>>> decoders;
      std::vector<std::unique_ptr<GumbelSelector>> selectors;
      std::vector<EvictingDecoder<B, W>*> batch;
      for (std::size_t i = begin; i < end; ++i) {
        const std::size_t b = i / per_budget, k = i % per_budget;
        const auto stream_of = [&](std::size_t rollout) {
          return (((std::uint64_t(u) * 4096 + std::uint64_t(c)) * 64 + b) * 1024 + std::uint64_t(rollout)) << 16;
        };
        const std::uint64_t stream = stream_of(k);
        decoders.push_back(std::make_unique<EvictingDecoder<B, W>>(
            model_, policy_, budget_of(opt_.budgets[b]), opt_.mode, int(prompt_tokens), steps,
            opt_.granularity));
        selectors.push_back(std::make_unique<GumbelSelector>(
            policy_, opt_.seed, stream, opt_.explore_groups, opt_.temperature,
            opt_.shared_exploration ? std::optional<std::uint64_t>(stream_of(0)) : std::nullopt));
        decoders.back()->set_selector(selectors.back().get());
        decoders.back()->adopt_prefill(teacher.prefilled, teacher.prompt_logits);
        batch.push_back(decoders.back().get());
      }
      std::vector<std::vector<float>> student(batch.size());
      stepper_.teacher_force(batch, continuation.first(std::size_t(steps - 1)), student);
      std::vector<float> kl(std::size_t(steps - 1));
      for (std::size_t i = 0; i < batch.size(); ++i) {
        kl_rows(Context<cpu>{}, teacher.rows.data() + vocab, student[i].data(), steps - 1, int(vocab),
                kl.data());
        double sum = 0.0;
        for (float x : kl) sum += double(x);
        returns[begin + i] = -sum / double(steps - 1);
        records[begin + i] = selectors[i]->records();
      }
    }
  }

  Transformer<B, W>& model_;
  MlpPolicy& policy_;
  TrainerOptions opt_;
  std::vector<TrainingContext> contexts_;
  std::vector<float> m_, v_, grad_;
  int step_ = 0;
  std::size_t max_batch_ = 32;
  DecoderBatch<B, W> stepper_;
};

}  // namespace dc
