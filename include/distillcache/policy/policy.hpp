#pragma once
// The eviction-policy interface: read a TokenFeatures view, write one score per row (higher =
// more worth keeping). A top-B selector (policy/select.hpp) turns scores into one keep-set per
// group (cache/features.hpp).
//
// A small virtual interface rather than a concept: policies are chosen at run time by name
// (examples/eval), held in lists, and the learned policy carries trained parameters; one virtual
// call per eviction (not per token) costs nothing next to the attention that produced the
// features.
#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <string>

#include "../cache/features.hpp"

namespace dc {

// A policy's scores as a rule a backend can evaluate where the cache lives (decode/in_place_eviction.cuh: on
// the device, no statistics copied to the host), at the head granularity.
struct ScoreRule {
  // accumulated_mass: the attention a slot received from the observed queries of its KV head's
  // group (kStatMass; TokenFeatures::accumulated_mass), +inf for the `recent` newest positions
  // (position > latest - recent): H2O.
  enum class Kind { accumulated_mass };
  Kind kind = Kind::accumulated_mass;
  int recent = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string name() const = 0;
  // false: the full cache (never evicts).
  virtual bool evicts() const { return true; }
  // How many of the last prompt queries are observed at prefill; 0 = all of them.
  virtual int observation_window() const { return 32; }
  // First prompt position whose query the policy observes, for a prompt of n tokens.
  int observation_start(int n) const {
    const int window = observation_window();
    return window <= 0 ? 0 : std::max(0, n - window);
  }
  // Query statistics the policy reads (TokenFeatures::expected_attention); none by default.
  virtual QueryStatisticsSpec query_statistics() const { return {}; }
  // The finest keep-set granularity the policy's rule is defined at; a finer request is served
  // at this one (e.g. TOVA averages the newest query's attention over all heads of a layer).
  virtual Granularity finest_granularity() const { return Granularity::head; }
  Granularity granularity_for(Granularity requested) const {
    return int(requested) <= int(finest_granularity()) ? requested : finest_granularity();
  }
  // Relative budget weights per layer (math/layer_budgets.hpp), one per model layer; empty (the
  // default): every layer keeps the budget. Applied at the layer and head granularities (a shared
  // keep-set has one budget for all layers).
  virtual std::span<const double> layer_budget_weights() const { return {}; }
  // The layer count of the model the policy's rules per layer (the weights above and any layer
  // lists) were written for; 0 where it has none. On a model of another depth they apply by
  // relative depth (math/layer_depth.hpp; the decoder maps the weights).
  virtual int layer_rules_depth() const { return int(layer_budget_weights().size()); }
  // Whether the rules per layer apply on a model of another depth (by relative depth: true, the
  // default) or are left out there (false: the policy runs as if it had none; the decoder then
  // keeps the budget in every layer).
  virtual bool maps_layer_rules() const { return true; }
  // The policy's scores at the head granularity as a ScoreRule for a budget of `budget`, where
  // they are one; nullopt (the default) where not. It must give exactly score()'s scores: the
  // decoder then evicts without forming features (decode/in_place_eviction.hpp).
  virtual std::optional<ScoreRule> score_rule(int budget) const {
    (void)budget;
    return std::nullopt;
  }
  // Scores for every row of f (scores.size() == f.size); budget is the number each group keeps.
  // Checks the arguments (consistent, finite features; matching sizes; budget >= 0) and the
  // scores the policy wrote (no NaN; +-inf are fine and mean "always" / "never"), then returns.
  void score(const TokenFeatures& f, int budget, std::span<float> scores) {
    f.validate();
    DC_CHECK(scores.size() == std::size_t(f.size), "policy '", name(), "': ", scores.size(),
             " scores for ", f.size, " slots");
    DC_CHECK(budget >= 0, "policy '", name(), "': negative budget ", budget);
    score_slots(f, budget, scores);
    int nan = 0;  // x != x for NaN alone; an OR over every row vectorises, a check per row does not
    for (const float x : scores) nan |= x != x ? 1 : 0;
    if (nan)
      for (std::size_t i = 0; i < scores.size(); ++i)
        DC_CHECK(!std::isnan(scores[i]), "policy '", name(), "' gave row ", i, " (position ",
                 f.position[i], ") a NaN score");
  }

 protected:
  // What a policy implements: the arguments are already checked.
  virtual void score_slots(const TokenFeatures& f, int budget, std::span<float> scores) = 0;
};

}  // namespace dc
