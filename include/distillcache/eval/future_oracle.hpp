#pragma once
// FutureAttentionOracle ("oracle" in examples/eval): keeps in every group the tokens the
// full-cache model's continuation attends to most, the top-B of eval/future_attention.hpp's
// shares. It reads the continuation, which no deployable policy can: an upper reference that
// says how much any policy scoring tokens one by one could gain, next to the heuristics.
//
// Before each context the evaluator's caller runs prepare() on the prompt and continuation (one
// extra prefill); score_slots then returns the shares of the rows it is asked about. Only the
// eviction right after the prefill sees those rows, so only prefill mode is served: a later
// eviction (decode mode) finds other rows and is refused by name.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../policy/policy.hpp"
#include "future_attention.hpp"

namespace dc {

class FutureAttentionOracle final : public EvictionPolicy {
 public:
  std::string name() const override { return "oracle"; }
  int observation_window() const override { return 0; }

  // The shares of every row at each granularity, for the context about to be evaluated.
  template <Backend B, class W>
  void prepare(Transformer<B, W>& model, std::span<const std::int32_t> prompt,
               std::span<const std::int32_t> continuation, std::span<const Granularity> granularities) {
    auto cache = model.make_cache(int(prompt.size()));
    cache.set_observed_from(observation_start(int(prompt.size())));
    model.forward(prompt, cache);
    prepared_.clear();
    for (Granularity g : granularities) {
      const TokenFeatures f = gather_features(model.context(), cache, granularity_for(g));
      prepared_.push_back({f.granularity, f.position, future_attention_shares(model, cache, f, continuation)});
    }
  }

 protected:
  void score_slots(const TokenFeatures& f, int, std::span<float> scores) override {
    for (const Prepared& p : prepared_) {
      if (p.granularity != f.granularity) continue;
      DC_CHECK(p.position == f.position, "policy 'oracle': asked about other rows than the prompt's "
               "it was prepared for (it serves the eviction right after the prefill: use --mode prefill)");
      for (int i = 0; i < f.size; ++i) scores[std::size_t(i)] = p.shares[std::size_t(i)];
      return;
    }
    DC_FAIL("policy 'oracle': not prepared for ", granularity_name(f.granularity),
            " granularity (call prepare() with the context first)");
  }

 private:
  struct Prepared {
    Granularity granularity;
    std::vector<std::int32_t> position;
    std::vector<float> shares;
  };
  std::vector<Prepared> prepared_;
};

}  // namespace dc
