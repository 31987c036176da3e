// examples/train: trains the DistillCache policy by REINFORCE on a real model and real text.
//
// Contexts of L + T tokens come from a training corpus (by default the Python documentation
// Debian ships, disjoint from the Vim help files examples/eval measures on); the first
// --validation-contexts windows are held out for validation, the rest are trained on. Every
// --validate-every updates the policy's deterministic keep-sets are scored on the held-out
// windows and the best is kept (OUT/best.dcpolicy); every --checkpoint-every updates the whole
// training state is saved atomically (OUT/checkpoint.dcpolicy), which --resume continues bit
// for bit. A CSV log of every update goes to OUT/train_log.csv.
//
// --search-rounds N trains no MLP by REINFORCE: the score is the score base plus a linear
// correction w . inputs, and w is found by compass search on the greedy keep-sets' KL over
// --search-contexts training windows (linear_search.hpp); OUT/search.dcpolicy is the result,
// OUT/search_log.csv one line per round, and best.dcpolicy is replaced when it validates better.
// --search-holdout, --search-modes and --search-from shape that search, and --search-prune
// follows it with a pass that sets weights to 0 where other windows say they do not help
// (linear_search.hpp).
//
// --tasks adds RULER-style task samples (rl/task_contexts.hpp) to the text windows, one task
// context after each text window while they last: the query-aware prompt and the full-cache
// model's own answer as the continuation, built with --task-seed (examples/eval's task prompts
// use its --seed, 0 by default) and a haystack from the training corpus, so neither the samples
// nor the essay text are the evaluation's. The first --task-validation samples of each task are
// held out; validation then reports the text and the task KL, and keeps the policy with the
// best mean of the two. --task-solved-only drops the prompts whose full-cache answer is wrong.
//
//   train --model SmolLM2-135M-Instruct.Q4_1.gguf --out runs/smollm2 --updates 120
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <distillcache/distillcache.hpp>

#include "../common/cli.hpp"
#include "../common/weights.hpp"
#include "linear_search.hpp"

namespace {

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Trains the DistillCache eviction policy by REINFORCE (distillcache)."};
  dc::TrainerOptions opt;
  std::string model_path, text_path = "/usr/share/doc/python3.11/html/_sources/library", out_dir,
              budgets_arg = "0.125,0.25,0.5", granularity_arg = "head", mode_arg = "prefill",
              hidden_arg = "32,32", inputs_arg = "alpha,value_norm,head_variance,entropy,position",
              activation_arg = "silu", resume_path, dtype = "f32";
  std::string init_target = "alpha=2";
  int init_contexts = 4, init_steps = 300;
  std::string compare_arg, tasks_arg, task_haystack, task_words = dc::tasks::WordList::kDefaultPath;
  int task_samples = 8, task_validation = 1, task_length = 1024;
  bool task_solved_only = false;
  int search_rounds = 0;
  dc_examples::LinearSearchSettings search;
  std::string search_modes_arg, search_from;
  std::uint64_t task_seed = 1;
  int validation_contexts = 4, validate_every = 20, checkpoint_every = 10, stop_after = 0,
      max_train_contexts = 100000, window = 32, batch = 32, prune_context = 0;
  double recent_fraction = 0.0;
  double newest_query_layers_up_to = 1.0;
  std::string reserve_arg = "0";
  std::string reserve_elsewhere_arg = "0", pins_arg = "0", pin_layers_arg;
  std::string newest_query_layers_arg, reserve_layers_arg, layer_weights_arg;
  std::string score_base_arg = "none";
  app.add_option("--model", model_path, "GGUF model file")->required();
  app.add_option("--text", text_path, "training corpus: a .txt file or a folder of them");
  app.add_option("--out", out_dir, "output folder: checkpoint.dcpolicy, best.dcpolicy, train_log.csv")->required();
  app.add_option("--context", opt.context, "prompt tokens L")->check(integer_in(8, 1 << 16));
  app.add_option("--continuation", opt.continuation, "teacher-forced tokens T")->check(integer_in(2, 4096));
  app.add_option("--budget", budgets_arg, "kept fractions trained on, e.g. 0.125,0.25,0.5")->check(number_list());
  app.add_option("--rollouts", opt.rollouts, "keep-sets sampled per (context, budget)")->check(integer_in(2, 1024));
  app.add_option("--granularity", granularity_arg, "shared, layer or head")
      ->check(CLI::IsMember({"shared", "layer", "head"}));
  app.add_option("--mode", mode_arg, "prefill: compress once; decode: also evict while decoding")
      ->check(CLI::IsMember({"prefill", "decode"}));
  app.add_option("--chunk", opt.chunk, "decode-mode slack")->check(integer_in(1, 1 << 16));
  app.add_option("--updates", opt.updates, "total updates (the schedule spans them)")->check(integer_in(1, 1 << 24));
  app.add_option("--contexts-per-update", opt.contexts_per_update, "contexts per update")->check(integer_in(1, 1 << 16));
  app.add_option("--lr", opt.lr, "peak learning rate")->check(finite_number(0.0, 1.0));
  app.add_option("--lr-floor", opt.lr_floor, "final learning rate")->check(finite_number(0.0, 1.0));
  app.add_option("--warmup", opt.warmup, "warm-up updates")->check(integer_in(0, 1 << 24));
  app.add_option("--entropy-bonus", opt.entropy_bonus, "beta of the first-pick entropy bonus")->check(finite_number(0.0, 100.0));
  app.add_option("--max-grad-norm", opt.max_grad_norm, "global gradient-norm clip")->check(finite_number(1e-9, 1e9));
  app.add_option("--explore-groups", opt.explore_groups, "groups sampled per eviction; the rest keep "
                 "their greedy top-B (0 = sample every group)")->check(integer_in(0, 1 << 20));
  app.add_option("--seed", opt.seed, "seed of the initialisation and the sampling")->check(unsigned_integer());
  app.add_option("--hidden", hidden_arg, "hidden layer sizes, e.g. 32,32");
  app.add_option("--inputs", inputs_arg, "policy inputs, in order (alpha, value_norm, head_variance, entropy, position, last_alpha, budget_age, log_age, depth, layer_last_alpha)");
  app.add_option("--activation", activation_arg, "silu, tanh or relu")->check(CLI::IsMember({"silu", "tanh", "relu"}));
  app.add_option("--window", window, "prompt queries observed at prefill (0 = all)")->check(integer_in(0, 1 << 20));
  app.add_option("--validation-contexts", validation_contexts, "held-out windows (the first ones)")->check(integer_in(1, 4096));
  app.add_option("--max-train-contexts", max_train_contexts, "training windows at most")->check(integer_in(1, 1 << 24));
  app.add_option("--validate-every", validate_every, "updates between validations")->check(integer_in(1, 1 << 24));
  app.add_option("--checkpoint-every", checkpoint_every, "updates between checkpoints")->check(integer_in(1, 1 << 24));
  app.add_option("--stop-after", stop_after, "stop (with a checkpoint) after this update; 0 = run all")->check(integer_in(0, 1 << 24));
  app.add_option("--init-target", init_target, "warm start: fit the scores to this combination of the "
                 "inputs before REINFORCE, e.g. alpha=2,position=8; the term h2o adds H2O's heavy-hitter score "
                 "(needs alpha and position) and, with the input budget_age, H2O's recent half of the budget; "
                 "a term max:INPUT=OFFSET raises the sum to at least INPUT + OFFSET (e.g. h2o,max:layer_last_alpha=0 "
                 "ranks by H2O except where the layer's newest query attends more); "
                 "'future': each token's share of the attention the full-cache model's continuation pays it; "
                 "'none': no warm start)");
  app.add_option("--init-contexts", init_contexts, "warm start: training windows whose features it fits")
      ->check(integer_in(1, 4096));
  app.add_option("--init-steps", init_steps, "warm start: Adam steps")->check(integer_in(0, 1 << 20));
  app.add_option("--resume", resume_path, "continue from a checkpoint.dcpolicy (its options win)");
  app.add_option("--dtype", dtype, std::string(kWeightDtypeHelp) + " (teacher and students alike)")
      ->check(CLI::IsMember(kWeightDtypes));
  app.add_option("--recent-fraction", recent_fraction, "always keep the newest fraction of the budget "
                 "(as H2O keeps half); the MLP chooses the rest")->check(finite_number(0.0, 0.99));
  app.add_option("--newest-query-reserve", reserve_arg, "also keep this share of the budget for the rows each "
                 "layer's newest query attends to most (TOVA's signal; docs/design.md): one share (0.25) or shares "
                 "by budget fraction, linear in between (0.125:0,0.25:0.25,0.5:0.375)");
  app.add_option("--newest-query-layers", newest_query_layers_arg, "layers whose whole budget goes to the rows "
                 "the layer's newest query attends to most (TOVA's keep-set there; retrieval layers, e.g. 18-20 "
                 "on SmolLM2; docs/design.md); a list of layers and FIRST-LAST ranges");
  app.add_option("--newest-query-layers-up-to", newest_query_layers_up_to, "apply --newest-query-layers only at "
                 "budgets up to this fraction of the context (default 1: at every budget)")
      ->check(finite_number(1e-9, 1.0));
  app.add_option("--newest-query-reserve-layers", reserve_layers_arg, "apply --newest-query-reserve in these "
                 "layers only (a list of layers and FIRST-LAST ranges; default all)");
  app.add_option("--newest-query-reserve-elsewhere", reserve_elsewhere_arg, "a reserve of its own, in the format of "
                 "--newest-query-reserve, for the layers outside --newest-query-reserve-layers (e.g. 0.25:0,0.5:0.3: "
                 "none up to 25 % of the context, 0.3 of the budget at 50 %)");
  app.add_option("--newest-query-pins", pins_arg, "a share of the budget, in the format of --newest-query-reserve, "
                 "for the positions the newest query of --newest-query-pin-layers attends to most, kept in every layer "
                 "(docs/design.md, \"Pins\")");
  app.add_option("--newest-query-pin-layers", pin_layers_arg, "the guide layers that choose --newest-query-pins' "
                 "positions (a list of layers and FIRST-LAST ranges; e.g. 20-22 on SmolLM2)");
  app.add_option("--layer-budget-weights", layer_weights_arg, "share the budget among layers by these weights "
                 "(docs/design.md, \"Budgets per layer\"): LAYERS=WEIGHT items, every other layer 1 (18-20=1.5: "
                 "SmolLM2's retrieval layers keep 1.5x the others' share), or one weight per layer; needs "
                 "--search-rounds and a layer or head granularity");
  app.add_option("--temperature", opt.temperature, "sampling temperature: keep-sets are Plackett-Luce "
                 "samples of scores / T (below 1: closer to the greedy top-B deployed)")
      ->check(finite_number(1e-6, 1e6));
  app.add_flag("--shared-exploration", opt.shared_exploration, "the rollouts of a (context, budget) "
               "explore the same groups (with --explore-groups), so that their baseline compares like with like");
  app.add_flag("!--raw-advantages", opt.standardise_advantages, "do not divide each (context, budget)'s "
               "advantages by its returns' standard deviation");
  app.add_option("--search-rounds", search_rounds, "instead of REINFORCE: the score is a linear correction "
                 "of the score base (w . inputs, carried by the ReLU MLP), w found by compass search on the "
                 "greedy keep-sets' KL over --search-contexts training windows, at most this many rounds")
      ->check(integer_in(0, 1000));
  app.add_option("--search-contexts", search.contexts, "--search-rounds: training windows the objective averages over")
      ->check(integer_in(1, 4096));
  app.add_option("--search-step", search.search.step, "--search-rounds: first step along each weight")
      ->check(finite_number(1e-6, 100.0));
  app.add_option("--search-min-step", search.search.min_step, "--search-rounds: stop below this step")
      ->check(finite_number(1e-6, 100.0));
  app.add_option("--search-max-step", search.search.max_step, "--search-rounds: the step doubles after each "
                 "move, up to this (0: the first step)")->check(finite_number(0.0, 100.0));
  app.add_option("--search-min-improvement", search.search.min_improvement, "--search-rounds: relative "
                 "decrease of the objective a move needs")->check(finite_number(0.0, 0.5));
  app.add_option("--search-holdout", search.holdout, "--search-rounds: this many other training windows "
                 "choose the kept point (the visited point they score best), against overfitting the search "
                 "windows; 0 = keep the objective's minimum")->check(integer_in(0, 4096));
  app.add_option("--search-modes", search_modes_arg, "--search-rounds: modes the objective (and the "
                 "validation) averages over, e.g. prefill,decode (default: --mode)");
  app.add_option("--search-prune", search.prune, "--search-rounds: after the search, set weights to 0 one "
                 "at a time while that does not raise the KL on this many other training windows (a multiple "
                 "of --search-contexts; 0 = no pruning)")->check(integer_in(0, 4096));
  app.add_option("--search-prune-context", prune_context, "--search-prune: prompts of this many tokens for the "
                 "pruning pass's windows, from the same training text (0 = --context): a term that helps only at "
                 "the search's length is dropped")->check(integer_in(0, 1 << 20));
  app.add_option("--search-balance", search.balance_name, "--search-rounds: the objective (and hold-out and "
                 "pruning pass) is the mean over kinds of window (text, --tasks prompts), budgets and modes of "
                 "the KL relative to this policy's on the same windows (e.g. h2o), and each kind gives "
                 "search, hold-out and pruning windows in proportion to its count");
  app.add_flag("--search-worst-case", search.worst_case, "--search-balance: the objective is the largest of the "
               "ratios (the worst kind, budget and mode against the balance policy), not their mean");
  app.add_option("--search-from", search_from, "--search-rounds: start from this policy file's linear "
                 "correction (weights matched by input name; inputs it lacks start at 0)");
  app.add_option("--score-base", score_base_arg, "none: the score is the MLP's output; h2o: log(H2O's "
                 "accumulated mass) + the MLP's output, starting from a zero output layer (H2O itself; "
                 "needs --init-target none)")->check(CLI::IsMember({"none", "h2o"}));
  app.add_option("--batch", batch, "students decoded as one batch (speed and memory only; each holds "
                 "a KV cache of --context + --continuation tokens)")->check(integer_in(1, 4096));
  app.add_option("--compare", compare_arg, "before training, the validation KL of these policies too "
                 "(e.g. h2o,snapkv,streaming,tova)");
  app.add_option("--tasks", tasks_arg, "also train on these RULER-style tasks (query-aware prompts, the "
                 "full-cache answer as continuation), e.g. niah_single_1,niah_multikey_1,vt");
  app.add_option("--task-samples", task_samples, "--tasks: training samples per task")->check(integer_in(1, 1 << 16));
  app.add_option("--task-validation", task_validation, "--tasks: held-out samples per task")->check(integer_in(0, 1 << 16));
  app.add_option("--task-length", task_length, "--tasks: prompt + answer length in tokens")->check(integer_in(64, 1 << 20));
  app.add_option("--task-seed", task_seed, "--tasks: seed of the samples (examples/eval uses --seed, 0 by default)")
      ->check(unsigned_integer());
  app.add_option("--task-haystack", task_haystack, "--tasks: essay haystack (default: the training corpus --text)");
  app.add_option("--task-words", task_words, "--tasks: word list for keys and cwe");
  app.add_flag("--task-solved-only", task_solved_only, "--tasks: keep only the prompts whose full-cache answer "
               "scores 1 (within --continuation tokens), training and validation alike");
  if (const auto status = parse_command_line(app, argc, argv, "train")) return *status;

  return run_reporting_errors("train", [&]() -> int {
    namespace fs = std::filesystem;
    DC_CHECK(!task_solved_only || !tasks_arg.empty(), "--task-solved-only filters task prompts: it needs --tasks");
    opt.granularity = dc::parse_granularity(granularity_arg);
    opt.mode = mode_arg == "prefill" ? dc::EvictionMode::prefill : dc::EvictionMode::decode;
    opt.budgets.clear();
    for (const auto& s : split_list(budgets_arg)) {
      const auto v = detail::to_number(s);
      DC_CHECK(v.has_value(), "--budget: '", s, "' is not a number");
      opt.budgets.push_back(*v);
    }
    std::vector<int> hidden;
    for (const auto& s : split_list(hidden_arg)) {
      const auto v = detail::to_integer(s);
      DC_CHECK(v.has_value() && *v > 0 && *v <= 4096, "--hidden: '", s, "' is not a size in 1..4096");
      hidden.push_back(int(*v));
    }
    std::vector<dc::PolicyInput> inputs;
    for (const auto& s : split_list(inputs_arg)) inputs.push_back(dc::parse_policy_input(s));
    const dc::ScoreBase score_base = dc::parse_score_base(score_base_arg);
    const std::vector<dc::SchedulePoint> newest_query_reserve = dc::parse_reserve_schedule(reserve_arg);
    const std::vector<int> newest_query_layers = dc::parse_layer_list(newest_query_layers_arg);
    DC_CHECK(newest_query_layers_up_to == 1.0 || !newest_query_layers.empty(), "--newest-query-layers-up-to "
             "needs --newest-query-layers");
    const std::vector<int> reserve_layers = dc::parse_layer_list(reserve_layers_arg);
    DC_CHECK(reserve_layers.empty() || !newest_query_reserve.empty(), "--newest-query-reserve-layers needs "
             "--newest-query-reserve");
    const std::vector<dc::SchedulePoint> reserve_elsewhere = dc::parse_reserve_schedule(reserve_elsewhere_arg);
    DC_CHECK(reserve_elsewhere.empty() || !reserve_layers.empty(), "--newest-query-reserve-elsewhere needs "
             "--newest-query-reserve-layers (without them the reserve is in every layer)");
    const std::vector<dc::SchedulePoint> pins = dc::parse_reserve_schedule(pins_arg, "newest-query pins");
    const std::vector<int> pin_layers = dc::parse_layer_list(pin_layers_arg);
    DC_CHECK(pins.empty() == pin_layers.empty(), pins.empty() ? "--newest-query-pin-layers needs --newest-query-pins"
                                                              : "--newest-query-pins needs --newest-query-pin-layers");
    // Budgets per layer: the greedy keep-sets of the search take them; sampled ones (REINFORCE's
    // GumbelSelector) do not yet, and a shared keep-set has no layers to share among.
    DC_CHECK(layer_weights_arg.empty() || layer_weights_arg == "none" || search_rounds > 0,
             "--layer-budget-weights needs --search-rounds (REINFORCE's sampled keep-sets take one budget for "
             "every layer)");
    DC_CHECK(layer_weights_arg.empty() || layer_weights_arg == "none" || opt.granularity != dc::Granularity::shared,
             "--layer-budget-weights shares the budget among layers: it needs --granularity layer or head");
    // The rows a policy of this run forces without a choice (set on the trained policy below).
    auto apply_forced_rules = [&](dc::MlpPolicy& p) {
      p.set_recent_fraction(recent_fraction);
      p.set_newest_query_reserve(newest_query_reserve);
      p.set_newest_query_reserve_elsewhere({});  // it needs the layers: cleared before, set after
      p.set_newest_query_reserve_layers(reserve_layers);
      p.set_newest_query_reserve_elsewhere(reserve_elsewhere);
      p.set_newest_query_layers_up_to(1.0);  // it needs the layers: reset before, set after
      p.set_newest_query_layers(newest_query_layers);
      p.set_newest_query_layers_up_to(newest_query_layers_up_to);
      p.set_newest_query_pins(pin_layers, pins);
      p.set_score_base(score_base);
    };
    for (const auto& [reserve, text] : {std::pair{&newest_query_reserve, &reserve_arg},
                                        std::pair{&reserve_elsewhere, &reserve_elsewhere_arg}})
      DC_CHECK(recent_fraction + dc::max_reserve_share(*reserve) < 1.0, "--recent-fraction ", recent_fraction,
               " plus --newest-query-reserve", reserve == &reserve_elsewhere ? "-elsewhere " : " ", *text,
               " leave nothing of the budget to the policy (their sum must be below 1)");
    DC_CHECK(recent_fraction + dc::max_reserve_share(pins) < 1.0, "--recent-fraction ", recent_fraction,
             " plus --newest-query-pins ", pins_arg, " leave nothing of the budget to the policy (their sum must be below 1)");
    DC_CHECK(score_base == dc::ScoreBase::none || init_target == "none" || !resume_path.empty(),
             "--score-base ", score_base_arg, " starts from the base's own ranking (a zero output layer): "
             "give --init-target none, not '", init_target, "'");
    // A warm-start target that names an unknown input or no number fails here, before any work.
    if (resume_path.empty() && init_target != "future" && init_target != "none")
      (void)dc::WarmStartTarget(init_target, inputs);

    if (search_rounds > 0) {
      DC_CHECK(resume_path.empty() && init_target == "none", "--search-rounds searches from the score base "
               "alone: give --init-target none and no --resume");
      dc::check_linear_layout(dc::MlpLayout(int(inputs.size()), hidden, dc::parse_activation(activation_arg)));
      search.search.validate();
      if (!search_from.empty()) {
        dc::MlpPolicy rules = dc::MlpPolicy::initialised(inputs, hidden, opt.seed, dc::Activation::relu, window);
        apply_forced_rules(rules);
        search.start = dc_examples::linear_weights_from(search_from, inputs, rules);
      }
      for (const auto& name : split_list(search_modes_arg)) {
        DC_CHECK(name == "prefill" || name == "decode", "--search-modes: '", name, "' is not prefill or decode");
        search.modes.push_back(name == "prefill" ? dc::EvictionMode::prefill : dc::EvictionMode::decode);
      }
      if (!search.balance_name.empty())  // an unknown name fails here, before any work
        search.balance = dc::make_policy(search.balance_name, opt.seed, DC_SHIPPED_POLICY);
      DC_CHECK(!search.worst_case || search.balance, "--search-worst-case takes the largest ratio to the "
               "--search-balance policy: give --search-balance");
    } else {
      DC_CHECK(search_modes_arg.empty() && search_from.empty() && search.holdout == 0 && search.prune == 0 &&
                   search.balance_name.empty() && !search.worst_case,
               "--search-modes, --search-from, --search-holdout, --search-prune, --search-balance and "
               "--search-worst-case need --search-rounds");
    }
    if (search.prune == 0) {
      DC_CHECK(prune_context == 0, "--search-prune-context needs --search-prune");
    }
    std::optional<dc::PolicyCheckpoint> resume;
    if (!resume_path.empty()) {
      resume = dc::load_policy_checkpoint(resume_path);
      DC_CHECK(resume->trainer.is_object() && resume->trainer.contains("options"), "--resume: '",
               resume_path, "' is a policy, not a training checkpoint (no trainer state)");
      const int total = opt.updates;
      opt = dc::TrainerOptions::from_json(resume->trainer.at("options"));
      DC_CHECK(total == opt.updates || app.count("--updates") == 0, "--resume: the checkpoint "
               "trains for ", opt.updates, " updates; --updates ", total, " would change its schedule");
    }
    opt.validate();

    fs::create_directories(out_dir);
    const fs::path checkpoint_path = fs::path(out_dir) / "checkpoint.dcpolicy";
    const fs::path best_path = fs::path(out_dir) / "best.dcpolicy";
    const fs::path log_path = fs::path(out_dir) / "train_log.csv";
    check_writable(log_path.string(), "--out");

    model_format(model_path);
    dc::GgufFile file(model_path);
    dc::HfModel m = dc::load_gguf_model(file);
    const dc::Tokenizer tokenizer(dc::tokenizer_data_from_gguf(file));
    for (const auto& [layers, option] : {std::pair{&newest_query_layers, "--newest-query-layers"},
                                         std::pair{&reserve_layers, "--newest-query-reserve-layers"},
                                         std::pair{&pin_layers, "--newest-query-pin-layers"}})
      DC_CHECK(layers->empty() || layers->back() < m.config.num_layers, option, " names layer ",
               layers->empty() ? 0 : layers->back(), "; the model has ", m.config.num_layers, " layers");
    const std::vector<double> layer_weights = dc::parse_layer_budget_weights(layer_weights_arg, m.config.num_layers);
    const int window_tokens = opt.context + opt.continuation;
    DC_CHECK(window_tokens <= m.config.max_position, "--context + --continuation = ", window_tokens,
             " exceeds the model's context of ", m.config.max_position);
    auto windows = dc::token_windows(tokenizer, text_path, window_tokens,
                                     validation_contexts + max_train_contexts);
    DC_CHECK(int(windows.size()) > validation_contexts, "--text: ", text_path, " gives ",
             windows.size(), " windows of ", window_tokens, " tokens; need more than the ",
             validation_contexts, " held out for validation");
    std::vector<std::vector<std::int32_t>> validation(windows.begin(), windows.begin() + validation_contexts);
    windows.erase(windows.begin(), windows.begin() + validation_contexts);
    // Too few windows for the pruning pass fail before any work (task prompts count at most once each).
    if (search.prune > 0 && (prune_context == 0 || prune_context == opt.context))
      dc_examples::check_prune_count(windows.size() + split_list(tasks_arg).size() * std::size_t(task_samples),
                                     search.contexts, search.prune);
    std::fprintf(stderr, "train: %zu training and %zu validation windows of %d tokens from %s\n",
                 windows.size(), validation.size(), window_tokens, text_path.c_str());
    std::vector<dc::TrainingContext> prune_pool;  // --search-prune-context's windows
    if (prune_context > 0 && prune_context != opt.context) {
      const int prune_tokens = prune_context + opt.continuation;
      DC_CHECK(prune_tokens <= m.config.max_position, "--search-prune-context + --continuation = ", prune_tokens,
               " exceeds the model's context of ", m.config.max_position);
      // Windows of either length start at each file's beginning and leave out each file's tail,
      // so a file holds no more long windows than short ones: the first validation_contexts long
      // windows cover all the validation text, and skipping them keeps the pass off it.
      auto longer = dc::token_windows(tokenizer, text_path, prune_tokens, validation_contexts + max_train_contexts);
      longer.erase(longer.begin(), longer.begin() + std::min<std::ptrdiff_t>(validation_contexts, std::ptrdiff_t(longer.size())));
      prune_pool = dc::split_windows(longer, prune_context, opt.continuation);
      std::fprintf(stderr, "train: %zu windows of %d tokens for the pruning pass\n", prune_pool.size(), prune_tokens);
    }
    // Every task prompt is built (and so every task name, length and input file checked) before
    // the model runs; their answers come from the model inside run().
    std::vector<dc::tasks::TaskPrompt> task_train_prompts, task_validation_prompts;
    if (!tasks_arg.empty()) {
      namespace t = dc::tasks;
      if (task_haystack.empty()) task_haystack = text_path;
      const t::ChatTemplate chat = t::ChatTemplate::from_choice("auto", file);
      std::optional<t::WordList> words;
      std::optional<t::EssayText> essay;
      for (const auto& name : split_list(tasks_arg)) {
        const t::TaskSpec& task = t::find_task(name);
        if (!words && (task.kind == t::TaskKind::niah || task.kind == t::TaskKind::common_words))
          words = t::WordList::from_file(task_words);
        if (!essay && task.kind == t::TaskKind::niah && task.haystack == t::HaystackType::essay)
          essay = t::EssayText::from_path(task_haystack);
      }
      DC_CHECK(task_length + opt.continuation <= m.config.max_position, "--task-length ", task_length,
               " exceeds the model's context of ", m.config.max_position);
      const t::TaskPromptBuilder builder(tokenizer, chat, {words ? &*words : nullptr, essay ? &*essay : nullptr},
                                         task_seed);
      for (const auto& name : split_list(tasks_arg)) {
        const t::TaskSpec& task = t::find_task(name);
        for (int s = 0; s < task_validation + task_samples; ++s)
          (s < task_validation ? task_validation_prompts : task_train_prompts).push_back(builder.build(task, task_length, s));
      }
      std::fprintf(stderr, "train: %zu training and %zu validation task prompts of at most %d tokens (seed %llu)\n",
                   task_train_prompts.size(), task_validation_prompts.size(), task_length,
                   (unsigned long long)task_seed);
    }

    auto run = [&]<class W>(dc::Weights<dc::cpu, W> weights) -> int {
      dc::Transformer<dc::cpu, W> model(m.config, std::move(weights), 64);
      dc::MlpPolicy policy = resume ? dc::MlpPolicy::from_checkpoint(*resume)
                                    : dc::MlpPolicy::initialised(inputs, hidden, opt.seed,
                                                                 dc::parse_activation(activation_arg), window);
      if (!resume) {
        apply_forced_rules(policy);
        policy.set_layer_rules_depth(m.config.num_layers);  // the layer lists' model, for others to map
        policy.set_layer_budget_weights(layer_weights);
        if (score_base != dc::ScoreBase::none) policy.zero_output_layer();
      }
      // The task contexts' continuations: the full-cache model's own answers.
      const auto stop = dc::answer_stop_tokens(tokenizer);
      auto answer_all = [&](const std::vector<dc::tasks::TaskPrompt>& prompts, const char* what) {
        std::vector<dc::TrainingContext> out;
        const auto from = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          auto context = dc::task_training_context(model, prompts[i], stop, opt.continuation);
          if (!task_solved_only || dc::teacher_answer_score(tokenizer, prompts[i], context, stop) >= 1.0)
            out.push_back(std::move(context));
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
          std::fprintf(stderr, "\rtrain: %s task answers %zu/%zu, %.0f s, ETA %s   ", what, i + 1, prompts.size(),
                       secs, format_seconds(secs / double(i + 1) * double(prompts.size() - i - 1)).c_str());
        }
        if (!prompts.empty()) std::fprintf(stderr, "\n");
        if (task_solved_only && !prompts.empty())
          std::fprintf(stderr, "train: --task-solved-only keeps %zu of %zu %s task prompts\n", out.size(),
                       prompts.size(), what);
        return out;
      };
      const auto task_validation_contexts = answer_all(task_validation_prompts, "validation");
      auto task_contexts = answer_all(task_train_prompts, "training");
      DC_CHECK(task_train_prompts.empty() || !task_contexts.empty(), "--task-solved-only: the full-cache model "
               "answers none of the ", task_train_prompts.size(), " training task prompts right within ",
               opt.continuation, " tokens (--continuation)");
      auto contexts = dc::interleave_contexts(dc::split_windows(windows, opt.context, opt.continuation),
                                              std::move(task_contexts));
      const auto text_validation = dc::split_windows(validation, opt.context, opt.continuation);
      dc::ReinforceTrainer<dc::cpu, W> trainer(model, policy, opt, std::move(contexts));
      trainer.set_max_batch(std::size_t(batch));
      if (search.prune > 0)  // chosen now, so that too few fail before the search's work
        search.prune_windows = dc_examples::prune_windows(trainer.training_contexts(), search.contexts, search.prune,
                                                          prune_pool, bool(search.balance));
      double best = INFINITY;
      if (resume) {
        trainer.restore_state(*resume);
        if (resume->trainer.contains("best_validation_kl"))
          best = resume->trainer.at("best_validation_kl").get<double>();
      }
      nlohmann::json search_info;  // set by --search-rounds: how the weights were found
      auto save = [&](const fs::path& path, double best_kl, bool with_state) {
        dc::PolicyCheckpoint c = with_state ? trainer.save_state() : policy.to_checkpoint();
        c.extra["model"] = fs::path(model_path).filename().string();
        c.extra["corpus"] = text_path;
        c.extra["training"] = opt.to_json();
        if (!tasks_arg.empty())
          c.extra["tasks"] = {{"tasks", tasks_arg}, {"samples", task_samples}, {"validation", task_validation},
                              {"length", task_length}, {"seed", task_seed}, {"haystack", task_haystack},
                              {"solved_only", task_solved_only}};
        if (!search_info.is_null()) c.extra["search"] = search_info;
        if (with_state) c.trainer["best_validation_kl"] = best_kl;
        dc::save_policy_checkpoint(path, c);
      };
      auto mean = [](const std::vector<double>& v) {
        double s = 0.0;
        for (double x : v) s += x;
        return s / double(v.size());
      };
      // The validation score: the text windows' mean KL over the budgets, averaged with the
      // task samples' when there are any (the two weigh the same whatever their counts).
      // With --search-modes the text score averages those modes.
      std::string validation_detail;
      const auto validation_modes = dc_examples::objective_modes(search.modes);
      auto validate = [&](dc::EvictionPolicy& scored) {
        double score = 0.0;
        char buf[128];
        validation_detail = "text";
        for (const auto& mode : validation_modes) {
          const auto v = trainer.validate_policies({&scored}, text_validation, mode)[0];
          score += mean(v) / double(validation_modes.size());
          if (mode) validation_detail += *mode == dc::EvictionMode::prefill ? " prefill" : " decode";
          for (std::size_t b = 0; b < v.size(); ++b) {
            std::snprintf(buf, sizeof buf, " %g: %.4f", opt.budgets[b], v[b]);
            validation_detail += buf;
          }
        }
        if (!task_validation_contexts.empty()) {
          const auto vt = trainer.validate_policy(scored, task_validation_contexts);
          validation_detail += "; tasks";
          for (std::size_t b = 0; b < vt.size(); ++b) {
            std::snprintf(buf, sizeof buf, " %g: %.4f", opt.budgets[b], vt[b]);
            validation_detail += buf;
          }
          score = 0.5 * (score + mean(vt));
        }
        return score;
      };
      auto log_line = [&](const std::string& line) {
        std::ofstream log(log_path, std::ios::app);
        DC_CHECK(log, "--out: cannot append to '", log_path.string(), "'");
        log << line << '\n';
      };
      if (trainer.step() == 0 && init_target == "future" && init_steps > 0) {
        const auto w = trainer.warm_start_future(init_contexts, init_steps, 1e-2f);
        std::fprintf(stderr, "train: warm start (future attention of %d contexts) on %lld rows: cross-entropy %.4f -> %.4f\n",
                     init_contexts, (long long)w.rows, w.initial_loss, w.final_loss);
      } else if (trainer.step() == 0 && init_target != "none" && init_steps > 0) {
        const dc::WarmStartTarget target(init_target, policy.inputs());
        const auto w = trainer.warm_start_to(init_contexts, [&](std::span<const float> row) {
          return target(row);
        }, init_steps, 1e-2f);
        std::fprintf(stderr, "train: warm start (%s) on %lld rows: MSE %.4f -> %.4f\n", init_target.c_str(),
                     (long long)w.rows, w.initial_loss, w.final_loss);
      }
      if (trainer.step() == 0) {
        {
          std::ofstream log(log_path);  // a fresh run starts a fresh log
          log << "update,lr,reward,kl_sampled,entropy,grad_norm,seconds,tokens_per_s,validation_kl\n";
          DC_CHECK(log, "--out: cannot write '", log_path.string(), "'");
        }
        for (const auto& name : split_list(compare_arg)) {
          const auto other = dc::make_policy(name, opt.seed, DC_SHIPPED_POLICY);
          const double kl = validate(*other);
          std::fprintf(stderr, "train: %s, validation KL %.4f (%s)\n", name.c_str(), kl, validation_detail.c_str());
        }
        best = validate(policy);
        std::fprintf(stderr, "train: untrained policy, validation KL %.4f (%s)\n", best, validation_detail.c_str());
        log_line("0,,,,,,,," + std::to_string(best));
        save(best_path, best, false);
      }
      if (search_rounds > 0) {
        search.search.max_rounds = search_rounds;
        const double untrained = best;
        const auto found = search_linear_correction(trainer, policy, search, fs::path(out_dir) / "search_log.csv");
        search_info = {{"method", "compass search of a linear correction"}, {"contexts", search.contexts},
                       {"step", search.search.step}, {"min_step", search.search.min_step},
                       {"max_step", search.search.max_step}, {"expand", search.search.expand},
                       {"max_rounds", search.search.max_rounds}, {"min_improvement", search.search.min_improvement},
                       {"holdout", search.holdout}, {"modes", search_modes_arg.empty() ? mode_arg : search_modes_arg},
                       {"balance", search.balance_name}, {"worst_case", search.worst_case},
                       {"from", search_from},
                       {"rounds", found.rounds}, {"evaluations", found.evaluations},
                       {"training_kl", found.value}, {"weights", found.x}};
        if (search.prune > 0) {
          const auto pruned = dc_examples::prune_linear_correction(trainer, policy, search,
                                                                   fs::path(out_dir) / "prune_log.csv");
          std::vector<std::string> zeroed;
          for (std::size_t i : pruned.zeroed) zeroed.push_back(dc::policy_input_name(inputs[i]));
          search_info["prune"] = {{"contexts", search.prune}, {"context", prune_context > 0 ? prune_context : opt.context},
                                  {"zeroed", zeroed}, {"kl_before", pruned.start_value},
                                  {"kl_after", pruned.value}, {"weights", pruned.x}};
        }
        const double kl = validate(policy);
        std::fprintf(stderr, "train: searched policy, validation KL %.4f (%s); untrained %.4f\n", kl,
                     validation_detail.c_str(), untrained);
        save(fs::path(out_dir) / "search.dcpolicy", kl, false);
        if (kl < best) save(best_path, kl, false);
        return 0;
      }
      const auto start = std::chrono::steady_clock::now();
      const int first = trainer.step();
      const int last = stop_after > 0 ? std::min(stop_after, opt.updates) : opt.updates;
      while (trainer.step() < last) {
        const dc::UpdateStats st = trainer.update();
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double eta = elapsed / double(st.update - first) * double(last - st.update);
        std::string val;
        if (st.update % validate_every == 0 || st.update == last) {
          const double kl = validate(policy);
          val = std::to_string(kl);
          if (kl < best) {
            best = kl;
            save(best_path, best, false);
          }
          std::fprintf(stderr, "\rupdate %5d/%d  validation KL %.4f (best %.4f; %s)%10s\n", st.update,
                       opt.updates, kl, best, validation_detail.c_str(), "");
        }
        std::fprintf(stderr, "\rupdate %5d/%d  lr %.2e  reward %.4f  KL %.4f  H %.3f  |g| %.3g  %.0f tok/s  ETA %s   ",
                     st.update, opt.updates, st.lr, st.reward, st.kl, st.entropy, st.grad_norm,
                     double(st.tokens) / st.seconds, format_seconds(eta).c_str());
        std::fflush(stderr);
        char line[256];
        std::snprintf(line, sizeof line, "%d,%g,%.6f,%.6f,%.5f,%.5g,%.3f,%.1f,", st.update, st.lr, st.reward,
                      st.kl, st.entropy, st.grad_norm, st.seconds, double(st.tokens) / st.seconds);
        log_line(line + val);
        if (st.update % checkpoint_every == 0 || st.update == last) save(checkpoint_path, best, true);
      }
      std::fprintf(stderr, "\ntrain: done at update %d; best validation KL %.4f in %s, state in %s\n",
                   trainer.step(), best, best_path.string().c_str(), checkpoint_path.string().c_str());
      return 0;
    };
    return with_cpu_weights(dtype, model_path, m, run);
  });
}
