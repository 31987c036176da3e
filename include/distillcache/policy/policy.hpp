#pragma once
// The eviction-policy interface: read a TokenFeatures view, write one score per cached token
// (higher = more worth keeping). A top-B selector (policy/select.hpp) turns scores into the
// keep-set.
//
// A small virtual interface rather than a concept: policies are chosen at run time by name
// (examples/eval), held in lists, and the learned policy carries trained parameters; one virtual
// call per eviction (not per token) costs nothing next to the attention that produced the
// features.
#include <span>
#include <string>

#include "../cache/features.hpp"

namespace dc {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string name() const = 0;
  // false: the full cache (never evicts).
  virtual bool evicts() const { return true; }
  // How many of the last prompt queries are observed at prefill; 0 = all of them.
  virtual int observation_window() const { return 32; }
  // Scores for every slot of f (scores.size() == f.size); budget is the number that will be kept.
  virtual void score(const TokenFeatures& f, int budget, std::span<float> scores) = 0;
};

}  // namespace dc
