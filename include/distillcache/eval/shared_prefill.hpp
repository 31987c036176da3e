#pragma once
// SharedPrefills: one prefill of a prompt per distinct (observation start, query statistics)
// that a set of policies asks for. The full-cache teacher and every student whose policy
// observes the same prompt queries adopt the same prefilled cache (EvictingDecoder::adopt_prefill),
// so an evaluation of P policies x budgets x granularities costs as many prefills as there are
// distinct observation windows, usually two or three. The fidelity evaluator and the task suite
// both start from it.
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "../cache/kv_cache.hpp"
#include "../core/error.hpp"
#include "../model/transformer.hpp"
#include "../policy/policy.hpp"

namespace dc {

template <class B, class W>
class SharedPrefills {
 public:
  using Prefill = std::pair<KVCache<B>, std::vector<float>>;  // the cache, the prompt's last logits

  SharedPrefills(Transformer<B, W>& model, std::span<EvictionPolicy* const> policies,
                 std::span<const std::int32_t> prompt)
      : n_(int(prompt.size())) {
    for (EvictionPolicy* p : policies) {
      if (prefills_.count(key(*p))) continue;
      auto cache = model.make_cache(n_);
      cache.set_observed_from(p->observation_start(n_));
      cache.collect_queries(p->query_statistics(), model.config().rope_theta);
      auto logits = model.forward(prompt, cache);
      prefills_.emplace(key(*p), Prefill(std::move(cache), std::move(logits)));
    }
  }

  // The prefill policy p adopts; p must observe like one of the policies given.
  const Prefill& of(const EvictionPolicy& p) const {
    const auto it = prefills_.find(key(p));
    DC_CHECK(it != prefills_.end(), "shared prefill: no prefill observes like policy '", p.name(), "'");
    return it->second;
  }
  int prefills() const { return int(prefills_.size()); }

 private:
  std::pair<int, int> key(const EvictionPolicy& p) const {
    return {p.observation_start(n_), p.query_statistics().from};
  }

  int n_;
  std::map<std::pair<int, int>, Prefill> prefills_;
};

}  // namespace dc
