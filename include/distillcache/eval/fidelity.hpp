#pragma once
// Fidelity of evicted caches on one context: the full cache (teacher) and every (policy,
// budget) pair (students) are teacher-forced on the same continuation, and every step's
// next-token distributions are compared (eval/metrics.hpp).
//
// The prompt is prefilled once per distinct observation window (and query statistics) and the
// resulting cache copied into each student (EvictingDecoder::adopt_prefill), so adding policies
// costs decode steps, not prefills. Step 0 predicts the first continuation token from the prompt's own logits, which
// eviction after prefill cannot change; later steps see the compressed cache.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "../decode/evicting_decoder.hpp"
#include "../policy/baselines.hpp"
#include "metrics.hpp"

namespace dc {

template <Backend B, class W>
class FidelityEvaluator {
 public:
  // policies, granularities and budgets span the grid; total(p, g, b) accumulates that student
  // (totals() is the same, [policy][granularity][budget] flattened).
  FidelityEvaluator(Transformer<B, W>& model, std::vector<EvictionPolicy*> policies,
                    std::vector<Budget> budgets, EvictionMode mode,
                    std::vector<Granularity> granularities = {Granularity::shared})
      : model_(model), policies_(std::move(policies)), budgets_(std::move(budgets)), mode_(mode),
        granularities_(std::move(granularities)),
        totals_(policies_.size() * granularities_.size() * budgets_.size()) {
    DC_CHECK(!policies_.empty() && !budgets_.empty() && !granularities_.empty(), "fidelity: ",
             policies_.size(), " policies, ", granularities_.size(), " granularities and ",
             budgets_.size(), " budgets; give at least one of each");
    for (std::size_t p = 0; p < policies_.size(); ++p)
      DC_CHECK(policies_[p] != nullptr, "fidelity: policy ", p, " is null");
  }

  // Runs one context: prompt, then the continuation teacher-forced token by token. progress is
  // called before each student with its index.
  template <class Progress>
  void add_context(std::span<const std::int32_t> prompt, std::span<const std::int32_t> continuation,
                   Progress&& progress) {
    const int n = int(prompt.size()), steps = int(continuation.size());
    DC_CHECK(n > 0 && steps > 0, "fidelity: empty prompt or continuation");
    const std::size_t vocab = std::size_t(model_.config().vocab_size);

    // One prefill per (observation start, query statistics) the policies ask for.
    auto key = [&](const EvictionPolicy& p) {
      return std::make_pair(p.observation_start(n), p.query_statistics().from);
    };
    std::map<std::pair<int, int>, std::pair<KVCache<B>, std::vector<float>>> prefilled;
    FullCachePolicy full;
    std::vector<EvictionPolicy*> all = policies_;
    all.push_back(&full);
    for (EvictionPolicy* p : all) {
      if (prefilled.count(key(*p))) continue;
      auto cache = model_.make_cache(n);
      cache.set_observed_from(p->observation_start(n));
      cache.collect_queries(p->query_statistics(), model_.config().rope_theta);
      auto logits = model_.forward(prompt, cache);
      prefilled.emplace(key(*p), std::make_pair(std::move(cache), std::move(logits)));
    }
    auto run = [&](EvictionPolicy& policy, const Budget& budget, Granularity granularity,
                   std::vector<float>& rows, const std::size_t* student) {
      EvictingDecoder<B, W> dec(model_, policy, budget, mode_, n, steps, granularity);
      const auto& [cache, logits] = prefilled.at(key(policy));
      auto out = dec.adopt_prefill(cache, logits);
      if (student && on_compressed_) on_compressed_(*student, dec.cache());
      rows.assign(out.begin(), out.end());
      for (int t = 1; t < steps; ++t) {
        out = dec.step(continuation[std::size_t(t - 1)]);
        rows.insert(rows.end(), out.begin(), out.end());
      }
    };

    std::vector<float> teacher, student;
    run(full, Budget::of_fraction(1.0), Granularity::shared, teacher, nullptr);
    for (std::size_t p = 0; p < policies_.size(); ++p)
      for (std::size_t g = 0; g < granularities_.size(); ++g)
        for (std::size_t b = 0; b < budgets_.size(); ++b) {
          const std::size_t i = index(p, g, b);
          progress(i);
          run(*policies_[p], budgets_[b], granularities_[g], student, &i);
          for (int s = 0; s < steps; ++s)
            totals_[i].add(std::span<const float>(teacher).subspan(std::size_t(s) * vocab, vocab),
                           std::span<const float>(student).subspan(std::size_t(s) * vocab, vocab),
                           continuation[std::size_t(s)]);
        }
    ++contexts_;
  }

  // Called with the student's index (index(p, g, b)) and its cache right after the prompt's
  // compression: lets a caller record the keep-sets (examples/eval --keep-sets).
  void on_compressed(std::function<void(std::size_t, const KVCache<B>&)> observer) {
    on_compressed_ = std::move(observer);
  }

  const std::vector<FidelityTotals>& totals() const { return totals_; }
  const FidelityTotals& total(std::size_t policy, std::size_t granularity, std::size_t budget) const {
    return totals_[index(policy, granularity, budget)];
  }
  std::size_t index(std::size_t policy, std::size_t granularity, std::size_t budget) const {
    DC_CHECK(policy < policies_.size() && granularity < granularities_.size() &&
                 budget < budgets_.size(),
             "fidelity: student (", policy, ", ", granularity, ", ", budget, ") outside the grid");
    return (policy * granularities_.size() + granularity) * budgets_.size() + budget;
  }
  int contexts() const { return contexts_; }

 private:
  Transformer<B, W>& model_;
  std::vector<EvictionPolicy*> policies_;
  std::vector<Budget> budgets_;
  EvictionMode mode_;
  std::vector<Granularity> granularities_;
  std::vector<FidelityTotals> totals_;
  std::function<void(std::size_t, const KVCache<B>&)> on_compressed_;
  int contexts_ = 0;
};

}  // namespace dc
