#pragma once
// MlpPolicy: the learned DistillCache policy. Scores every row with a small MLP over the row's
// scale-free inputs (policy/policy_inputs.hpp); at inference the keep-set is the deterministic
// top-B of each group (policy/select.hpp). It runs at any granularity, since inputs are taken
// relative to the row's group.
//
// recent_fraction r (0 by default): the newest floor(r * budget) positions are always kept (scored
// +inf, as H2O keeps its recent half) and the MLP chooses the rest among the older rows. A
// structural prior rather than a learned one: H2O's recency window is measured in units of the
// budget, which the scale-free inputs do not see.
//
// newest_query_reserve q (none by default; policy/newest_query_reserve.hpp): of the rows the
// recent window leaves, the floor(q * budget) that the layer's newest query attends to most are
// kept too (TOVA's signal given a share of the budget), and the MLP chooses the rest. q is one
// share, or a schedule of shares by budget fraction (budget / context tokens; linear between
// points, math/budget_schedule.hpp), since what it costs and buys depends on the budget.
//
// newest_query_pins (none by default; policy/newest_query_pins.hpp): a share of the budget, by
// budget fraction as the reserve's, for the positions the newest query of a few guide layers
// attends to most, kept in every layer (one set of positions for all of them).
//
// score_base (none by default; policy/mlp_scoring.hpp): h2o makes the score log(H2O's
// accumulated mass) + the MLP's output, a learned correction to H2O's ranking
// (zero_output_layer() then gives H2O itself as the starting point of training).
//
// layer_budget_weights (none by default): how the budget is shared among layers
// (math/layer_budgets.hpp), e.g. from what evicting each layer alone costs on training text
// (eval/layer_sensitivity.hpp; train --layer-budget-weights). Kept in the checkpoint's "extra"
// object, so older files load unchanged.
//
// Rules per layer (the budget weights, newest_query_reserve_layers, newest_query_layers) belong
// to the model they were written for: layer_rules_depth() is its layer count. On a model of
// another depth each layer takes the rule of the layer at the same relative depth
// (math/layer_depth.hpp), so a policy trained on SmolLM2 (30 layers) runs on Gemma 3 (18):
// the decoder maps the weights, score() the lists. Or, where the file says so
// (layer_rules_on_other_models "drop"), the rules per layer are left out on another model: those
// of SmolLM2's v10 mapped onto Gemma 3 more than doubled H2O's KL at 50 %, the policy without
// them had the lowest (bench/results/README.md, "v10 on Gemma").
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/finite.hpp"
#include "../cpu/mlp.hpp"
#include "../io/policy_checkpoint.hpp"
#include "../math/layer_budgets.hpp"
#include "policy.hpp"
#include "mlp_scoring.hpp"
#include "layer_lists.hpp"
#include "newest_query_pins.hpp"
#include "newest_query_reserve.hpp"
#include "policy_inputs.hpp"
#include "rules_then_mlp.hpp"

namespace dc {

class MlpPolicy final : public EvictionPolicy {
 public:
  // window: the prompt queries observed at prefill (0 = all).
  MlpPolicy(std::vector<PolicyInput> inputs, MlpLayout layout, std::vector<float> params,
            int window = 32, std::string name = "distillcache")
      : inputs_(std::move(inputs)), layout_(std::move(layout)), params_(std::move(params)),
        window_(window), name_(std::move(name)) {
    DC_CHECK(!inputs_.empty(), "mlp policy: no inputs");
    DC_CHECK(layout_.inputs == int(inputs_.size()), "mlp policy: the MLP takes ", layout_.inputs,
             " inputs, the policy gives it ", inputs_.size());
    DC_CHECK(std::int64_t(params_.size()) == layout_.parameters(), "mlp policy: ",
             params_.size(), " parameters for an MLP of ", layout_.parameters());
    DC_CHECK(window_ >= 0, "mlp policy: negative observation window ", window_);
    check_all_finite(params_, "mlp policy: parameters");
  }

  // A freshly initialised policy: weights ~ N(0, 1/fan_in) (the output layer 10x smaller, so
  // the untrained scores are nearly uniform), biases 0. Deterministic in seed.
  static MlpPolicy initialised(std::vector<PolicyInput> inputs, std::vector<int> hidden,
                               std::uint64_t seed, Activation activation = Activation::silu,
                               int window = 32) {
    MlpLayout layout(int(inputs.size()), std::move(hidden), activation);
    std::vector<float> params(std::size_t(layout.parameters()), 0.0f);
    std::mt19937_64 rng(seed);
    for (int l = 0; l < layout.layers(); ++l) {
      const float scale = float(1.0 / std::sqrt(double(layout.in(l)))) * (l + 1 == layout.layers() ? 0.1f : 1.0f);
      std::normal_distribution<float> normal(0.0f, scale);
      const std::int64_t w = layout.weight_offset(l), n = std::int64_t(layout.in(l)) * layout.out(l);
      for (std::int64_t i = 0; i < n; ++i) params[std::size_t(w + i)] = normal(rng);
    }
    return MlpPolicy(std::move(inputs), std::move(layout), std::move(params), window);
  }

  static MlpPolicy from_checkpoint(const PolicyCheckpoint& c, std::string name = "distillcache") {
    DC_CHECK(c.feature_normalisation == kPolicyNormalisation, "policy checkpoint: feature "
             "normalisation '", c.feature_normalisation, "', this build knows '",
             kPolicyNormalisation, "'");
    std::vector<PolicyInput> inputs;
    for (const std::string& s : c.inputs) inputs.push_back(parse_policy_input(s));
    int window = 32;
    if (c.extra.contains("observation_window")) {
      DC_CHECK(c.extra["observation_window"].is_number_integer(),
               "policy checkpoint: 'observation_window' is not an integer");
      window = c.extra["observation_window"].get<int>();
    }
    MlpLayout layout(int(inputs.size()), c.hidden, parse_activation(c.activation));
    MlpPolicy policy(std::move(inputs), std::move(layout), c.weights, window, std::move(name));
    if (c.extra.contains("layer_rules_model_layers")) {
      const auto& d = c.extra["layer_rules_model_layers"];
      DC_CHECK(d.is_number_integer() && d.get<long>() > 0 && d.get<long>() < (1L << 20), "policy checkpoint: "
               "'layer_rules_model_layers' is ", d.dump(), ", not a layer count");
      policy.set_layer_rules_depth(d.get<int>());
    }
    if (c.extra.contains("layer_rules_on_other_models")) {
      const auto& m = c.extra["layer_rules_on_other_models"];
      DC_CHECK(m.is_string(), "policy checkpoint: 'layer_rules_on_other_models' is not a string");
      policy.set_map_layer_rules(parse_layer_rules_on_other_models(m.get<std::string>()));
    }
    if (c.extra.contains("layer_budget_weights")) {
      const auto& w = c.extra["layer_budget_weights"];
      DC_CHECK(w.is_array() && !w.empty(), "policy checkpoint: 'layer_budget_weights' is not a non-empty array");
      std::vector<double> weights;
      for (const auto& v : w) {
        DC_CHECK(v.is_number(), "policy checkpoint: 'layer_budget_weights' holds a non-number");
        weights.push_back(v.get<double>());
      }
      policy.set_layer_budget_weights(std::move(weights));
    }
    if (c.extra.contains("score_base")) {
      DC_CHECK(c.extra["score_base"].is_string(), "policy checkpoint: 'score_base' is not a string");
      policy.set_score_base(parse_score_base(c.extra["score_base"].get<std::string>()));
    }
    if (c.extra.contains("recent_fraction")) {
      DC_CHECK(c.extra["recent_fraction"].is_number(),
               "policy checkpoint: 'recent_fraction' is not a number");
      policy.set_recent_fraction(c.extra["recent_fraction"].get<double>());
    }
    if (c.extra.contains("newest_query_reserve"))
      policy.set_newest_query_reserve(reserve_schedule_from_json(c.extra["newest_query_reserve"], "newest_query_reserve"));
    if (c.extra.contains("newest_query_reserve_layers"))
      policy.set_newest_query_reserve_layers(layer_list_from_json(c.extra["newest_query_reserve_layers"],
                                                                  "newest_query_reserve_layers"));
    if (c.extra.contains("newest_query_reserve_elsewhere"))
      policy.set_newest_query_reserve_elsewhere(
          reserve_schedule_from_json(c.extra["newest_query_reserve_elsewhere"], "newest_query_reserve_elsewhere"));
    if (c.extra.contains("newest_query_pins") || c.extra.contains("newest_query_pin_layers")) {
      const bool shares = c.extra.contains("newest_query_pins");
      DC_CHECK(shares && c.extra.contains("newest_query_pin_layers"), "policy checkpoint: '",
               shares ? "newest_query_pins" : "newest_query_pin_layers", "' without '",
               shares ? "newest_query_pin_layers" : "newest_query_pins", "'");
      policy.set_newest_query_pins(layer_list_from_json(c.extra["newest_query_pin_layers"], "newest_query_pin_layers"),
                                   reserve_schedule_from_json(c.extra["newest_query_pins"], "newest_query_pins"));
    }
    if (c.extra.contains("newest_query_layers"))
      policy.set_newest_query_layers(layer_list_from_json(c.extra["newest_query_layers"], "newest_query_layers"));
    if (c.extra.contains("newest_query_layers_up_to")) {
      DC_CHECK(c.extra["newest_query_layers_up_to"].is_number(),
               "policy checkpoint: 'newest_query_layers_up_to' is not a number");
      policy.set_newest_query_layers_up_to(c.extra["newest_query_layers_up_to"].get<double>());
    }
    return policy;
  }

  PolicyCheckpoint to_checkpoint() const {
    PolicyCheckpoint c;
    c.feature_normalisation = kPolicyNormalisation;
    for (PolicyInput i : inputs_) c.inputs.push_back(policy_input_name(i));
    c.hidden = layout_.hidden;
    c.activation = activation_name(layout_.activation);
    c.weights = params_;
    c.extra["observation_window"] = window_;
    if (recent_fraction_ > 0.0) c.extra["recent_fraction"] = recent_fraction_;
    if (!reserve_.empty()) c.extra["newest_query_reserve"] = reserve_schedule_json(reserve_);
    if (!newest_query_layers_.empty()) c.extra["newest_query_layers"] = newest_query_layers_;
    if (newest_query_layers_up_to_ < 1.0) c.extra["newest_query_layers_up_to"] = newest_query_layers_up_to_;
    if (!reserve_layers_.empty()) c.extra["newest_query_reserve_layers"] = reserve_layers_;
    if (!reserve_elsewhere_.empty()) c.extra["newest_query_reserve_elsewhere"] = reserve_schedule_json(reserve_elsewhere_);
    if (!pins_.empty()) {
      c.extra["newest_query_pins"] = reserve_schedule_json(pins_);
      c.extra["newest_query_pin_layers"] = pin_layers_;
    }
    if (score_base_ != ScoreBase::none) c.extra["score_base"] = score_base_name(score_base_);
    if (!map_layer_rules_) c.extra["layer_rules_on_other_models"] = layer_rules_on_other_models_name(false);
    if (!layer_weights_.empty()) c.extra["layer_budget_weights"] = layer_weights_;
    // The weights' count is the depth; without weights the lists need it said (written only
    // then, so a file with weights reads as before).
    else if (layer_rules_depth_ > 0 && (!reserve_layers_.empty() || !newest_query_layers_.empty() || !pin_layers_.empty()))
      c.extra["layer_rules_model_layers"] = layer_rules_depth_;
    return c;
  }

  std::span<const double> layer_budget_weights() const override { return layer_weights_; }
  // One positive, finite weight per layer of the model they are written for (on another model
  // the decoder maps them by depth); empty: uniform.
  void set_layer_budget_weights(std::vector<double> weights) {
    check_layer_budget_weights(weights, "mlp policy");
    DC_CHECK(weights.empty() || layer_rules_depth_ == 0 || weights.size() == std::size_t(layer_rules_depth_),
             "mlp policy: ", weights.size(), " layer budget weights for rules written for a model of ",
             layer_rules_depth_, " layers");
    layer_weights_ = std::move(weights);
    check_layer_lists();
  }

  // The layer count of the model the rules per layer were written for: the weights' count, else
  // the depth set with set_layer_rules_depth (0: unset); 0 where neither says (the lists then
  // apply as written, and a layer the model lacks is an error).
  int layer_rules_depth() const override {
    return layer_weights_.empty() ? layer_rules_depth_ : int(layer_weights_.size());
  }
  void set_layer_rules_depth(int layers) {
    DC_CHECK(layers >= 0, "mlp policy: negative layer count ", layers);
    DC_CHECK(layers == 0 || layer_weights_.empty() || layers == int(layer_weights_.size()), "mlp policy: rules for a model of ",
             layers, " layers, but ", layer_weights_.size(), " layer budget weights");
    layer_rules_depth_ = layers;
    check_layer_lists();
  }

  // On a model of another depth: the rules per layer by relative depth (true, the default) or
  // left out (EvictionPolicy::maps_layer_rules).
  bool maps_layer_rules() const override { return map_layer_rules_; }
  void set_map_layer_rules(bool map) { map_layer_rules_ = map; }
  // The checkpoint's and derive's names for the two: "map" and "drop".
  static const char* layer_rules_on_other_models_name(bool map) { return map ? "map" : "drop"; }
  static bool parse_layer_rules_on_other_models(std::string_view name) {
    if (name == "map") return true;
    if (name == "drop") return false;
    DC_FAIL("layer rules on other models: '", std::string(name), "' is neither 'map' nor 'drop'");
  }

  double recent_fraction() const { return recent_fraction_; }
  void set_recent_fraction(double fraction) {
    DC_CHECK(std::isfinite(fraction) && fraction >= 0.0 && fraction < 1.0, "mlp policy: "
             "recent_fraction ", fraction, " outside [0, 1)");
    check_forced_share(fraction, std::max(max_reserve_share(reserve_), max_reserve_share(reserve_elsewhere_)),
                       max_reserve_share(pins_));
    check_pins_with_reserve(fraction, pins_, reserve_, reserve_elsewhere_, reserve_layers_.empty());
    recent_fraction_ = fraction;
  }
  // The newest positions always kept at a budget of `budget` slots per group.
  int recent_tokens(int budget) const { return int(recent_fraction_ * double(budget)); }

  // The reserve's schedule (empty: none; one point at fraction 1: the same share at every budget).
  const std::vector<SchedulePoint>& newest_query_reserve() const { return reserve_; }
  void set_newest_query_reserve(double share) {
    DC_CHECK(std::isfinite(share) && share >= 0.0 && share < 1.0, "mlp policy: "
             "newest_query_reserve ", share, " outside [0, 1)");
    set_newest_query_reserve(share == 0.0 ? std::vector<SchedulePoint>() : std::vector<SchedulePoint>{{1.0, share}});
  }
  void set_newest_query_reserve(std::vector<SchedulePoint> points) {
    check_reserve_schedule(points);
    check_forced_share(recent_fraction_, std::max(max_reserve_share(points), max_reserve_share(reserve_elsewhere_)),
                       max_reserve_share(pins_));
    check_pins_with_reserve(recent_fraction_, pins_, points, reserve_elsewhere_, reserve_layers_.empty());
    reserve_ = std::move(points);
  }
  // The layers whose groups get the reserve, sorted (empty: every layer). Limited to the
  // retrieval layers alone it cost the training text as much as a reserve everywhere; with those
  // layers given more of the budget (layer_budget_weights) it is the rule of v5 and later
  // (bench/results/README.md, "Retrieval layers", "v5 shipped", "v6 shipped").
  const std::vector<int>& newest_query_reserve_layers() const { return reserve_layers_; }
  void set_newest_query_reserve_layers(std::vector<int> layers) {
    DC_CHECK(!layers.empty() || reserve_elsewhere_.empty(), "mlp policy: a reserve elsewhere needs "
             "newest_query_reserve_layers (without them the reserve is in every layer and nothing is elsewhere)");
    check_pins_with_reserve(recent_fraction_, pins_, reserve_, reserve_elsewhere_, layers.empty());
    reserve_layers_ = sorted_layer_list(std::move(layers), "newest_query_reserve_layers");
    check_layer_lists();
  }
  // The reserve of the layers outside newest_query_reserve_layers (empty: none there), a
  // schedule of its own. Why a second one: the retrieval layers want a large reserve at every
  // budget, the others none at 12.5 and 25 % (where any reserve costs text KL) but one at 50 %,
  // where SmolLM2's retrieval layers keep their whole cache under 3x weights and the needle is
  // lost in the other layers (bench/results/README.md, "v8 shipped").
  const std::vector<SchedulePoint>& newest_query_reserve_elsewhere() const { return reserve_elsewhere_; }
  void set_newest_query_reserve_elsewhere(std::vector<SchedulePoint> points) {
    check_reserve_schedule(points);
    DC_CHECK(points.empty() || !reserve_layers_.empty(), "mlp policy: a reserve elsewhere needs "
             "newest_query_reserve_layers (without them the reserve is in every layer and nothing is elsewhere)");
    check_forced_share(recent_fraction_, std::max(max_reserve_share(reserve_), max_reserve_share(points)),
                       max_reserve_share(pins_));
    check_pins_with_reserve(recent_fraction_, pins_, reserve_, points, reserve_layers_.empty());
    reserve_elsewhere_ = std::move(points);
  }
  // Layers whose whole budget goes to the rows the layer's newest query attends to most (TOVA's
  // choice at the layer level; neither the recent window, the reserve nor the MLP chooses
  // there), sorted; empty: none. Retrieval happens in a few layers (SmolLM2: 18-20,
  // bench/results/README.md, "Retrieval layers"), so TOVA's keep-set there keeps needles; those
  // layers matter to the text too: TOVA's keep-set in three of them adds 30-70 % to v4's KL on
  // the training text; with 3x the budget there, in layer 18 alone about 10 % (the shipped v7's
  // rule, "v7 shipped").
  const std::vector<int>& newest_query_layers() const { return newest_query_layers_; }
  void set_newest_query_layers(std::vector<int> layers) {
    DC_CHECK(!layers.empty() || newest_query_layers_up_to_ == 1.0, kUpToNeedsLayers);
    newest_query_layers_ = sorted_layer_list(std::move(layers), "newest_query_layers");
    check_layer_lists();
  }
  // The largest budget, as a fraction of the context, at which newest_query_layers apply (1: at
  // every budget; above it those layers are scored as any other). Why: a newest-query layer whose
  // budget is not raised keeps needles at 12.5 and 25 % but costs text KL at 50 %, where SmolLM2's
  // retrieval layers keep their whole cache anyway and the reserve elsewhere keeps the needles
  // (bench/results/README.md, "v9 shipped"). Set only with newest-query layers.
  double newest_query_layers_up_to() const { return newest_query_layers_up_to_; }
  void set_newest_query_layers_up_to(double fraction) {
    DC_CHECK(std::isfinite(fraction) && fraction > 0.0 && fraction <= 1.0, "mlp policy: newest_query_layers_up_to ",
             fraction, " outside (0, 1]");
    DC_CHECK(fraction == 1.0 || !newest_query_layers_.empty(), kUpToNeedsLayers);
    newest_query_layers_up_to_ = fraction;
  }
  // Pins (policy/newest_query_pins.hpp): in every layer, the positions the newest query of the
  // `guide_layers` attends to most (their mean over those layers' KV heads), as many as `shares`
  // gives of the budget at its fraction (the reserve's schedule format; empty: none). Both or
  // neither. Why: TOVA's rule in SmolLM2's retrieval layers keeps a needle there, but the layers
  // after them lose its digits (bench/results/README.md, "v10 shipped").
  const std::vector<SchedulePoint>& newest_query_pins() const { return pins_; }
  const std::vector<int>& newest_query_pin_layers() const { return pin_layers_; }
  void set_newest_query_pins(std::vector<int> guide_layers, std::vector<SchedulePoint> shares) {
    check_reserve_schedule(shares, "newest-query pins");
    DC_CHECK(guide_layers.empty() == shares.empty(), "mlp policy: newest-query pins need both guide layers and "
             "shares, or neither (", guide_layers.empty() ? "no guide layer given" : "no share given", ")");
    check_forced_share(recent_fraction_, std::max(max_reserve_share(reserve_), max_reserve_share(reserve_elsewhere_)),
                       max_reserve_share(shares));
    check_pins_with_reserve(recent_fraction_, shares, reserve_, reserve_elsewhere_, reserve_layers_.empty());
    pin_layers_ = sorted_layer_list(std::move(guide_layers), "newest_query_pin_layers");
    pins_ = std::move(shares);
    check_layer_lists();
  }
  int pin_tokens(int budget, int tokens) const { return scheduled_rows(pins_, budget, tokens); }

  // The rows kept for the newest query at a budget of `budget` slots per group when the context
  // holds `tokens` (the budget's fraction picks the share).
  int reserve_tokens(int budget, int tokens) const { return scheduled_rows(reserve_, budget, tokens); }
  int reserve_elsewhere_tokens(int budget, int tokens) const {
    return scheduled_rows(reserve_elsewhere_, budget, tokens);
  }

  // Whether `other` forces the same rows as this policy (score base, recent window, reserve and
  // its layers, newest-query layers): a linear correction's weights mean the same ranking only
  // under the same rules (train --search-from). Budget weights per layer are not compared: they
  // change how many rows a layer keeps, not which rows are forced, so a search may start from a
  // file searched under other weights.
  bool same_forced_rules(const MlpPolicy& other) const {
    return score_base_ == other.score_base_ && recent_fraction_ == other.recent_fraction_ &&
           reserve_ == other.reserve_ && reserve_layers_ == other.reserve_layers_ &&
           reserve_elsewhere_ == other.reserve_elsewhere_ && newest_query_layers_ == other.newest_query_layers_ &&
           newest_query_layers_up_to_ == other.newest_query_layers_up_to_ && pins_ == other.pins_ &&
           pin_layers_ == other.pin_layers_;
  }
  std::string describe_forced_rules() const {
    std::ostringstream o;
    o << "score base " << score_base_name(score_base_) << ", recent fraction " << recent_fraction_
      << ", newest-query reserve " << describe_reserve_schedule(reserve_) << " in layers "
      << (reserve_layers_.empty() ? std::string("all") : describe_layer_list(reserve_layers_))
      << ", newest-query layers " << describe_layer_list(newest_query_layers_);
    if (newest_query_layers_up_to_ < 1.0) o << " up to " << newest_query_layers_up_to_ << " of the context";
    if (!reserve_elsewhere_.empty()) o << ", reserve elsewhere " << describe_reserve_schedule(reserve_elsewhere_);
    if (!pins_.empty())
      o << ", pins " << describe_reserve_schedule(pins_) << " guided by layers " << describe_layer_list(pin_layers_);
    return o.str();
  }

  ScoreBase score_base() const { return score_base_; }
  void set_score_base(ScoreBase base) { score_base_ = base; }

  // Zeroes the output layer's weights and bias: every row's MLP output is then 0, so with a
  // score base the policy ranks by the base alone (H2O's ranking for ScoreBase::h2o). The hidden
  // layers keep their random weights: the first update's gradient reaches the output layer
  // only, and the layers below once it is nonzero.
  void zero_output_layer() {
    const int last = layout_.layers() - 1;
    const auto begin = params_.begin() + std::ptrdiff_t(layout_.weight_offset(last));
    std::fill(begin, params_.end(), 0.0f);
  }

  std::string name() const override { return name_; }
  int observation_window() const override { return window_; }

  const MlpLayout& layout() const { return layout_; }
  const std::vector<PolicyInput>& inputs() const { return inputs_; }
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }

  // The inputs and scores of every row of f at a budget of `budget` rows per group (what score()
  // writes before the recent window), for the trainer.
  void forward(const TokenFeatures& f, int budget, std::vector<float>& inputs, std::span<float> scores,
               float* saved = nullptr) const {
    inputs = policy_inputs(f, inputs_, budget);
    mlp_forward(Context<cpu>{}, layout_, params_.data(), inputs.data(), f.size, scores.data(), saved);
    add_score_base(score_base_, f.accumulated_mass.data(), f.size, scores.data());
  }

 protected:
  void score_slots(const TokenFeatures& f, int budget, std::span<float> scores) override {
    const int depth = layer_rules_depth(), model_layers = f.model_layers();
    const bool same_depth = depth == 0 || depth == model_layers;
    const int tokens = f.latest_position + 1;
    const bool newest_query_layers_on = tokens > 0 && budget_fraction(budget, tokens) <= newest_query_layers_up_to_;
    if (!same_depth && !map_layer_rules_) {  // rules per layer left out: the window, a reserve in every layer
      mlp_policy_scores(f, inputs_, budget, layout_, params_.data(), scores, recent_tokens(budget), score_base_);
      if (reserve_layers_.empty()) reserve_newest_query_rows(f, reserve_tokens(budget, tokens), scores);
      return;
    }
    // Pins first (with the recent window: mark_forced_rows sets both +inf), so the reserves then
    // choose among the rows still free. On another model the lists apply at the same depth; no
    // guide layer there means no pins.
    const std::vector<int> pin_guide = same_depth ? pin_layers_ : layer_list_at_depth(pin_layers_, depth, model_layers);
    const NewestQueryPinRule pins{pin_guide, pin_tokens(budget, tokens)};
    // The newest-query layers' groups take the newest query's keep-set whole, so neither the
    // rules nor the MLP score them (on SmolLM2, 6 of its 90 groups at head granularity).
    const std::vector<int> newest_layers =
        !newest_query_layers_on ? std::vector<int>()
        : same_depth            ? newest_query_layers_
                                : layer_list_at_depth(newest_query_layers_, depth, model_layers);
    std::vector<char> rescored;
    if (!newest_layers.empty())  // (an empty list would mean every layer to group_in_layers)
      for (const FeatureGroup& g : f.groups) rescored.push_back(group_in_layers(g, newest_layers) ? 1 : 0);
    // Another model: the lists at the same depth. An empty reserve list means every layer, so
    // a list that maps to no layer means no reserve (and every layer is elsewhere).
    const std::vector<int> reserve_layers =
        same_depth ? reserve_layers_ : layer_list_at_depth(reserve_layers_, depth, model_layers);
    const bool reserve_nowhere = !reserve_layers_.empty() && reserve_layers.empty();
    const int elsewhere_rows = reserve_elsewhere_tokens(budget, tokens);
    const std::vector<int> elsewhere =
        elsewhere_rows > 0 ? layers_outside(reserve_layers, model_layers) : std::vector<int>();
    std::vector<NewestQueryReserve> reserves = {{reserve_layers, reserve_nowhere ? 0 : reserve_tokens(budget, tokens)}};
    if (!elsewhere.empty()) reserves.push_back({elsewhere, elsewhere_rows});
    // The rows the rules keep first (window and pins, then both reserves: a reserve reads only
    // which rows are +inf already), so that the MLP scores only the rows still open; layer by
    // layer where there are several groups (policy/rules_then_mlp.hpp, the newest-query layers'
    // keep-sets in the same pass), else step by step.
    if (f.num_groups() > 1) {
      if (budget > 0 && f.size > 0) check_newest_query_layers(f, newest_layers);  // as the step's own check
      const OpenRowScorer mlp(f, inputs_, budget, layout_, params_.data(), score_base_);
      score_rules_then_mlp(f, recent_tokens(budget), pins, reserves, {rescored, budget}, mlp, scores);
      return;
    }
    const std::vector<char> pinned = newest_query_pinned_positions(f, pins.count, pins.guide);
    mark_forced_rows(f, recent_tokens(budget), pinned, rescored, scores);
    reserve_newest_query_rows(f, reserves, scores, rescored);
    mlp_score_open_rows(f, inputs_, budget, layout_, params_.data(), scores, score_base_, rescored);
    if (!newest_layers.empty()) give_layers_to_newest_query(f, budget, newest_layers, scores);
  }

 private:
  // Layer indices sorted, each non-negative and named once (what names them: `what`).
  static std::vector<int> sorted_layer_list(std::vector<int> layers, const char* what) {
    for (int l : layers) DC_CHECK(l >= 0, "mlp policy: ", what, " holds layer ", l);
    std::sort(layers.begin(), layers.end());
    DC_CHECK(std::adjacent_find(layers.begin(), layers.end()) == layers.end(), "mlp policy: ", what,
             " names a layer twice");
    return layers;
  }

  // A checkpoint's list of layer indices under `key` (then checked by the setter).
  static std::vector<int> layer_list_from_json(const nlohmann::json& r, const char* key) {
    DC_CHECK(r.is_array() && !r.empty(), "policy checkpoint: '", key, "' is not a non-empty list of layer indices");
    std::vector<int> layers;
    for (const auto& l : r) {
      DC_CHECK(l.is_number_integer() && l.get<long>() >= 0 && l.get<long>() < (1L << 20), "policy checkpoint: '",
               key, "' holds ", l.dump(), ", not a layer index");
      layers.push_back(l.get<int>());
    }
    return layers;
  }

  // The budget as a fraction of the context: what the reserve schedules and the newest-query
  // limit are keyed on (tokens > 0).
  static double budget_fraction(int budget, int tokens) { return double(budget) / double(tokens); }

  static int scheduled_rows(std::span<const SchedulePoint> schedule, int budget, int tokens) {
    if (schedule.empty() || tokens <= 0) return 0;
    return int(math::schedule_share(schedule, budget_fraction(budget, tokens)) * double(budget));
  }

  // A checkpoint's reserve schedule under `key`: a number (one share) or [[fraction, share], ...]
  // (then checked by the setter).
  static std::vector<SchedulePoint> reserve_schedule_from_json(const nlohmann::json& r, const char* key) {
    std::vector<SchedulePoint> points;
    if (r.is_number()) {
      if (r.get<double>() != 0.0) points.push_back({1.0, r.get<double>()});
      return points;
    }
    DC_CHECK(r.is_array() && !r.empty(), "policy checkpoint: '", key, "' is neither a number nor a list of "
             "[fraction, share] pairs");
    for (const auto& p : r) {
      DC_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number(), "policy checkpoint: '", key,
               "' holds ", p.dump(), ", not a [fraction, share] pair");
      points.push_back({p[0].get<double>(), p[1].get<double>()});
    }
    return points;
  }
  // The other way: one share at every budget as a number, a schedule as pairs.
  static nlohmann::json reserve_schedule_json(std::span<const SchedulePoint> points) {
    if (points.size() == 1 && points[0].fraction == 1.0) return points[0].share;
    nlohmann::json out = nlohmann::json::array();
    for (const SchedulePoint& p : points) out.push_back({p.fraction, p.share});
    return out;
  }

  // Every listed layer inside the model the rules are written for, where its depth is known.
  void check_layer_lists() const {
    const int depth = layer_rules_depth();
    if (depth == 0) return;
    for (const auto* list : {&reserve_layers_, &newest_query_layers_, &pin_layers_})
      DC_CHECK(list->empty() || list->back() < depth, "mlp policy: layer ", list->empty() ? 0 : list->back(),
               " named in rules for a model of ", depth, " layers");
  }

  // The recent window and the reserve are both taken out of the budget before the MLP chooses,
  // and so are the pins, at most (on text many pinned positions are recent rows). All three are
  // checked together only for the layers no budget weight raises (check_pins_with_reserve): the
  // reserve of the others is largest where weights raise their budget (SmolLM2's layers 18-20
  // under 3x weights), so its nominal share overstates what it takes there.
  static void check_forced_share(double recent, double reserve, double pins) {
    DC_CHECK(recent + reserve < 1.0, "mlp policy: recent_fraction ", recent, " plus newest_query_reserve ",
             reserve, " leave nothing of the budget to the MLP (their sum must be below 1)");
    DC_CHECK(recent + pins < 1.0, "mlp policy: recent_fraction ", recent, " plus newest_query_pins ", pins,
             " leave nothing of the budget to the MLP (their sum must be below 1)");
  }
  // Pins with the reserve of the layers whose budget nothing raises (every layer's reserve
  // without reserve layers, else the reserve elsewhere), budget fraction by budget fraction: where
  // window, pins and reserve fill a group's budget, the forced rows outnumber it and select drops
  // some (the newest: ties go to the older slot). Measured: pins of 0.2 with a reserve of 0.3 and
  // a window of 0.5 at 50 % multiplied the training text's KL by four.
  void check_pins_with_reserve(double recent, std::span<const SchedulePoint> pins,
                               std::span<const SchedulePoint> reserve, std::span<const SchedulePoint> elsewhere,
                               bool reserve_everywhere) const {
    if (pins.empty()) return;
    const math::ScheduleSumMax m = math::schedule_sum_max(pins, reserve_everywhere ? reserve : elsewhere);
    DC_CHECK(recent + m.share < 1.0, "mlp policy: recent_fraction ", recent, " plus newest_query_pins and the ",
             reserve_everywhere ? "newest_query_reserve" : "newest_query_reserve_elsewhere", " reach ",
             recent + m.share, " of the budget at budget fraction ", m.fraction,
             ": nothing left to the MLP (their sum must be below 1)");
  }

  std::vector<PolicyInput> inputs_;
  MlpLayout layout_;
  std::vector<float> params_;
  int window_;
  double recent_fraction_ = 0.0;
  std::vector<SchedulePoint> reserve_;
  std::vector<int> newest_query_layers_;
  double newest_query_layers_up_to_ = 1.0;
  std::vector<SchedulePoint> pins_;
  std::vector<int> pin_layers_;
  static constexpr const char* kUpToNeedsLayers =
      "mlp policy: newest_query_layers_up_to below 1 needs newest_query_layers (set it to 1 before removing them)";
  std::vector<int> reserve_layers_;
  std::vector<SchedulePoint> reserve_elsewhere_;
  ScoreBase score_base_ = ScoreBase::none;
  std::vector<double> layer_weights_;
  int layer_rules_depth_ = 0;  // set_layer_rules_depth; the weights' count takes precedence
  bool map_layer_rules_ = true;
  std::string name_;
};

}  // namespace dc
