#pragma once
// LayerBudgetedPolicy: any policy's scores with another policy's sharing of the budget among
// layers (EvictionPolicy::layer_budget_weights). It separates the two parts of a learned policy
// in an ablation: which tokens a layer keeps (the scores) and how many (the weights), e.g. H2O's
// scores with the shipped policy's calibrated budgets ("h2o+layers=PATH" in policy/registry.hpp).
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../math/layer_budgets.hpp"
#include "policy.hpp"

namespace dc {

class LayerBudgetedPolicy final : public EvictionPolicy {
 public:
  // map_layer_rules: whether the weights apply by relative depth on a model of another depth
  // (EvictionPolicy::maps_layer_rules), as the policy they come from says.
  LayerBudgetedPolicy(std::unique_ptr<EvictionPolicy> inner, std::vector<double> weights, std::string name,
                      bool map_layer_rules = true)
      : inner_(std::move(inner)), weights_(std::move(weights)), name_(std::move(name)),
        map_layer_rules_(map_layer_rules) {
    DC_CHECK(inner_ != nullptr, "layer-budgeted policy '", name_, "': no policy to wrap");
    DC_CHECK(!weights_.empty(), "layer-budgeted policy '", name_, "': no layer budget weights");
    check_layer_budget_weights(weights_, "layer-budgeted policy");
  }

  std::string name() const override { return name_; }
  bool evicts() const override { return inner_->evicts(); }
  int observation_window() const override { return inner_->observation_window(); }
  QueryStatisticsSpec query_statistics() const override { return inner_->query_statistics(); }
  Granularity finest_granularity() const override { return inner_->finest_granularity(); }
  std::span<const double> layer_budget_weights() const override { return weights_; }
  bool maps_layer_rules() const override { return map_layer_rules_; }

 protected:
  // Through the inner policy's public score(), which checks the features a second time: this
  // wrapper serves ablations, not the decode path of a shipped policy.
  void score_slots(const TokenFeatures& f, int budget, std::span<float> scores) override {
    inner_->score(f, budget, scores);
  }

 private:
  std::unique_ptr<EvictionPolicy> inner_;
  std::vector<double> weights_;
  std::string name_;
  bool map_layer_rules_;
};

}  // namespace dc
