#pragma once
// Every policy by the name a user types: a baseline (policy/baselines.hpp), "distillcache" (the
// learned policy shipped with the library) or "distillcache=PATH" (a learned policy file, e.g.
// one examples/train wrote), each optionally with another file's budgets per layer
// ("h2o+layers=PATH").
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "../io/policy_checkpoint.hpp"
#include "baselines.hpp"
#include "layer_budgeted.hpp"
#include "mlp_policy.hpp"

namespace dc {

inline constexpr const char* kLearnedPolicyName = "distillcache";

// The shipped policy: $DC_POLICY when set, else `fallback` (the examples pass the file in the
// source tree's policies/ folder).
inline std::filesystem::path shipped_policy_path(const std::filesystem::path& fallback) {
  if (const char* p = std::getenv("DC_POLICY"); p && *p) return p;
  return fallback;
}

inline std::unique_ptr<EvictionPolicy> make_policy(const std::string& spec, std::uint64_t seed,
                                                   const std::filesystem::path& shipped) {
  // NAME+layers=PATH: policy NAME with the budget weights per layer of the learned policy file
  // PATH (policy/layer_budgeted.hpp).
  if (const auto plus = spec.find("+layers="); plus != std::string::npos) {
    const std::string path = spec.substr(plus + 8);
    DC_CHECK(!path.empty(), "policy '", spec, "': no file given after '+layers='");
    const MlpPolicy source = MlpPolicy::from_checkpoint(load_policy_checkpoint(path));
    const auto weights = source.layer_budget_weights();
    DC_CHECK(!weights.empty(), "policy '", spec, "': '", path, "' holds no layer budget weights");
    return std::make_unique<LayerBudgetedPolicy>(make_policy(spec.substr(0, plus), seed, shipped),
                                                 std::vector<double>(weights.begin(), weights.end()), spec,
                                                 source.maps_layer_rules());
  }
  const std::string prefix = std::string(kLearnedPolicyName) + "=";
  if (spec == kLearnedPolicyName || spec.rfind(prefix, 0) == 0) {
    const std::filesystem::path path =
        spec == kLearnedPolicyName ? shipped_policy_path(shipped) : std::filesystem::path(spec.substr(prefix.size()));
    DC_CHECK(!path.empty(), "policy '", spec, "': no file given after '='");
    return std::make_unique<MlpPolicy>(MlpPolicy::from_checkpoint(load_policy_checkpoint(path), spec));
  }
  if (!is_baseline_policy_name(spec)) {
    std::string known;
    for (const auto& n : baseline_policy_names()) known += n + ", ";
    known += "h2o:recent=F, ";
    DC_FAIL("unknown policy '", spec, "' (known: ", known, "distillcache, distillcache=PATH; any of them +layers=PATH)");
  }
  return make_baseline_policy(spec, seed);
}

}  // namespace dc
