// derive: a copy of a policy file with other forced rules or a linear-correction weight zeroed.
//
// The rules a policy forces without a choice (the recent window, the newest-query reserve and
// its layers, the reserve elsewhere, the newest-query layers; docs/design.md) are settings, not weights: a measurement
// of "v4 with a reserve" needs v4's weights under another rule, not a new training run. Every
// such variant in bench/results/policies/ is this program's output; the file notes what it was
// derived from (extra.derived) and is validated by loading it before it is written.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include <distillcache/io/policy_checkpoint.hpp>
#include <distillcache/policy/linear_correction.hpp>
#include <distillcache/policy/mlp_policy.hpp>

#include "../common/cli.hpp"

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Writes a copy of a policy file with other forced rules or an input's weight zeroed (distillcache)."};
  std::string from_path, out_path, reserve_arg, reserve_layers_arg, reserve_elsewhere_arg, newest_query_layers_arg,
      zero_input, layer_weights_arg, pins_arg, pin_layers_arg, rules_elsewhere_arg;
  double recent_fraction = -1.0, newest_query_layers_up_to = -1.0;
  int model_layers = 0;
  app.add_option("--from", from_path, "the policy file to start from (.dcpolicy)")->required();
  app.add_option("--out", out_path, "the file to write")->required();
  app.add_option("--recent-fraction", recent_fraction, "always keep the newest fraction of the budget")
      ->check(finite_number(0.0, 0.99));
  app.add_option("--newest-query-reserve", reserve_arg, "a share of the budget for the rows each layer's newest "
                 "query attends to most: one share (0.25) or shares by budget fraction (0.125:0,0.25:0.25); 0 removes it");
  app.add_option("--newest-query-reserve-layers", reserve_layers_arg, "apply the reserve in these layers only "
                 "(a list of layers and FIRST-LAST ranges; 'none': every layer)");
  app.add_option("--newest-query-reserve-elsewhere", reserve_elsewhere_arg, "a reserve of its own for the layers "
                 "outside --newest-query-reserve-layers, in the same format; 0 removes it");
  app.add_option("--newest-query-pins", pins_arg, "a share of the budget for the positions the newest query of "
                 "--newest-query-pin-layers attends to most, kept in every layer: one share or shares by budget "
                 "fraction, as the reserve; 0 removes the pins");
  app.add_option("--newest-query-pin-layers", pin_layers_arg, "the guide layers that choose the pinned positions "
                 "(a list of layers and FIRST-LAST ranges)");
  app.add_option("--newest-query-layers", newest_query_layers_arg, "layers whose whole budget goes to the rows the "
                 "layer's newest query attends to most ('none': no layer)");
  app.add_option("--newest-query-layers-up-to", newest_query_layers_up_to, "apply the newest-query layers only at "
                 "budgets up to this fraction of the context (1: at every budget)")->check(finite_number(1e-9, 1.0));
  app.add_option("--layer-budget-weights", layer_weights_arg, "share the budget among layers by these weights "
                 "(docs/design.md, \"Budgets per layer\"): one per model layer (W0,W1,...) or LAYERS=WEIGHT items, "
                 "every other layer 1 (18-20=1.5; needs --model-layers unless the file has weights); 'none' removes them");
  app.add_option("--model-layers", model_layers, "the layer count of the model the rules per layer are for: "
                 "--layer-budget-weights LAYERS=WEIGHT needs it unless the file has weights; without weights it is "
                 "stored with the layer lists, so they apply by relative depth on other models (default: the "
                 "file's own count)")->check(integer_in(1, 1 << 20));
  app.add_option("--layer-rules-on-other-models", rules_elsewhere_arg, "on a model of another depth, apply the rules "
                 "per layer by relative depth (map) or leave them out (drop)")->check(CLI::IsMember({"map", "drop"}));
  app.add_option("--zero-input", zero_input, "set this input's weight to 0 (a linear correction only: an ablation)");
  if (const auto status = parse_command_line(app, argc, argv, "derive")) return *status;

  return run_reporting_errors("derive", [&]() -> int {
    dc::PolicyCheckpoint c = dc::load_policy_checkpoint(from_path);
    dc::MlpPolicy policy = dc::MlpPolicy::from_checkpoint(c);
    const int depth_before = policy.layer_rules_depth();
    std::string derived = "the file " + from_path;
    auto note = [&](const std::string& what) { derived += (derived.find(" with ") == std::string::npos ? " with " : ", ") + what; };
    // Every share of the budget this command replaces is cleared before any is set, so that each
    // setter's check (window + reserves + pins below the budget) meets a state no larger than the
    // final one: a wider window with a smaller reserve is accepted in one command, as its result is.
    const auto pins_before = policy.newest_query_pins();
    const auto pin_layers_before = policy.newest_query_pin_layers();
    const bool pins_change = !pins_arg.empty() || !pin_layers_arg.empty();
    if (pins_change) policy.set_newest_query_pins({}, {});
    if (!reserve_elsewhere_arg.empty()) policy.set_newest_query_reserve_elsewhere({});
    if (!reserve_arg.empty()) policy.set_newest_query_reserve(std::vector<dc::SchedulePoint>());
    if (recent_fraction >= 0.0) {
      policy.set_recent_fraction(recent_fraction);
      note("recent_fraction " + std::to_string(recent_fraction));
    }
    if (!reserve_arg.empty()) {
      policy.set_newest_query_reserve(dc::parse_reserve_schedule(reserve_arg));
      note("newest_query_reserve " + reserve_arg);
    }
    DC_CHECK(model_layers == 0 || depth_before == 0 || model_layers == depth_before || !layer_weights_arg.empty(),
             "--model-layers ", model_layers, ": '", from_path, "' holds rules for a model of ", depth_before,
             " layers (give --layer-budget-weights too, to replace its weights)");
    if (model_layers > 0 && layer_weights_arg.empty()) policy.set_layer_rules_depth(model_layers);
    // (The reserve elsewhere needs reserve layers: cleared above, before they change, set after.)
    if (!reserve_layers_arg.empty()) {
      policy.set_newest_query_reserve_layers(dc::parse_layer_list(reserve_layers_arg));
      note("newest_query_reserve_layers " + reserve_layers_arg);
    }
    if (!reserve_elsewhere_arg.empty()) {
      policy.set_newest_query_reserve_elsewhere(dc::parse_reserve_schedule(reserve_elsewhere_arg));
      note("newest_query_reserve_elsewhere " + reserve_elsewhere_arg);
    }
    DC_CHECK(policy.newest_query_reserve_layers().empty() || !policy.newest_query_reserve().empty(),
             "--newest-query-reserve-layers needs a newest-query reserve (the file has none; give --newest-query-reserve)");
    if (pins_change) {
      auto shares = pins_arg.empty() ? pins_before : dc::parse_reserve_schedule(pins_arg, "newest-query pins");
      auto guide = pin_layers_arg.empty() ? pin_layers_before : dc::parse_layer_list(pin_layers_arg);
      if (shares.empty()) {  // --newest-query-pins 0 removes them, guide layers and all
        DC_CHECK(pin_layers_arg.empty() || guide.empty(), "--newest-query-pin-layers needs pins (",
                 pins_arg.empty() ? "the file has none: give --newest-query-pins" : "--newest-query-pins 0 removes them", ")");
        guide.clear();
      }
      DC_CHECK(shares.empty() || !guide.empty(), "--newest-query-pins needs guide layers: give --newest-query-pin-layers",
               pin_layers_arg.empty() ? " (the file has none)" : " other than none");
      policy.set_newest_query_pins(std::move(guide), std::move(shares));
      note("newest_query_pins " + dc::describe_reserve_schedule(policy.newest_query_pins()) + " guided by layers " +
           dc::describe_layer_list(policy.newest_query_pin_layers()));
    }
    // The threshold needs newest-query layers: reset before they change, set after.
    if (newest_query_layers_up_to > 0.0) policy.set_newest_query_layers_up_to(1.0);
    if (!newest_query_layers_arg.empty()) {
      policy.set_newest_query_layers(dc::parse_layer_list(newest_query_layers_arg));
      note("newest_query_layers " + newest_query_layers_arg);
    }
    if (newest_query_layers_up_to > 0.0) {
      policy.set_newest_query_layers_up_to(newest_query_layers_up_to);
      std::ostringstream up_to;
      up_to << newest_query_layers_up_to;
      note("newest_query_layers_up_to " + up_to.str());
    }
    if (!layer_weights_arg.empty()) {
      const int layers = model_layers > 0 ? model_layers : int(policy.layer_budget_weights().size());
      auto weights = dc::parse_layer_budget_weights(layer_weights_arg, layers);
      if (!weights.empty()) policy.set_layer_rules_depth(0);  // the new weights' count says it
      policy.set_layer_budget_weights(std::move(weights));
      // Weights removed: the lists keep the depth they were written for.
      if (policy.layer_budget_weights().empty() && policy.layer_rules_depth() == 0)
        policy.set_layer_rules_depth(model_layers > 0 ? model_layers : depth_before);
      note("layer_budget_weights " + layer_weights_arg);
    }
    if (!rules_elsewhere_arg.empty()) {
      policy.set_map_layer_rules(dc::MlpPolicy::parse_layer_rules_on_other_models(rules_elsewhere_arg));
      note("layer_rules_on_other_models " + rules_elsewhere_arg);
    }
    if (!zero_input.empty()) {
      const dc::PolicyInput input = dc::parse_policy_input(zero_input);
      auto w = dc::linear_correction_weights(policy.layout(), policy.params());
      const auto rebuilt = dc::linear_correction_params(policy.layout(), w);
      DC_CHECK(std::equal(rebuilt.begin(), rebuilt.end(), policy.params().begin()), "--zero-input: '", from_path,
               "' is not a linear correction (train --search-rounds writes them)");
      const auto at = std::find(policy.inputs().begin(), policy.inputs().end(), input);
      DC_CHECK(at != policy.inputs().end(), "--zero-input: '", from_path, "' has no input ", zero_input);
      w[std::size_t(at - policy.inputs().begin())] = 0.0f;
      const auto params = dc::linear_correction_params(policy.layout(), w);
      std::copy(params.begin(), params.end(), policy.params().begin());
      note("the weight of " + zero_input + " set to 0");
    }
    DC_CHECK(model_layers == 0 || !layer_weights_arg.empty() || !policy.newest_query_reserve_layers().empty() ||
                 !policy.newest_query_layers().empty() || !policy.newest_query_pin_layers().empty(),
             "--model-layers gives the layer count of rules per layer: give --layer-budget-weights or a layer list "
             "with it (the policy has neither)");
    // The file's other extras (its training record, its search) stay; the rules and weights are
    // the policy's own.
    const dc::PolicyCheckpoint rules = policy.to_checkpoint();
    for (const char* key : {"recent_fraction", "newest_query_reserve", "newest_query_reserve_layers",
                            "newest_query_reserve_elsewhere", "newest_query_layers", "newest_query_layers_up_to",
                            "newest_query_pins", "newest_query_pin_layers",
                            "layer_budget_weights",
                            "layer_rules_model_layers", "layer_rules_on_other_models"}) {
      c.extra.erase(key);
      if (rules.extra.contains(key)) c.extra[key] = rules.extra[key];
    }
    c.weights = rules.weights;
    c.extra["derived"] = derived;
    (void)dc::MlpPolicy::from_checkpoint(c);  // what is written loads
    check_writable(out_path, "--out");
    dc::save_policy_checkpoint(out_path, c);
    std::printf("derive: wrote %s (%s)\n", out_path.c_str(), derived.c_str());
    return 0;
  });
}
