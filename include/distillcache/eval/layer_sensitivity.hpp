#pragma once
// What evicting each layer alone costs: for every evictable layer l, the KL(full || student) of
// a student whose prompt is compressed to `budget` slots per group in layer l only (a policy's
// scores, at the layer or head granularity), every other layer keeping the whole prompt; the
// continuation teacher-forced as in the fidelity evaluator (prefill mode, mean over its steps,
// step 0 included with its KL of 0).
//
// It is the measurement a policy's budget weights per layer (math/layer_budgets.hpp) could be
// calibrated from (layers whose eviction costs little giving slots to those whose eviction costs
// most); on SmolLM2 no static allocation built from it beat the uniform budget (1.5x for the
// retrieval layers 18-20, chosen otherwise, did)
// (bench/results/README.md, "Budgets per layer"). One prefill per context serves the teacher and every student; students
// decode in batches of at most max_batch caches (Transformer::forward_batch).
#include <cstdint>
#include <span>
#include <vector>

#include "../cache/features.hpp"
#include "../cache/keep_sets.hpp"
#include "../model/transformer.hpp"
#include "../policy/policy.hpp"
#include "../policy/select.hpp"
#include "metrics.hpp"
#include "shared_prefill.hpp"

namespace dc {

// Compresses cache once: layer l keeps layer_budgets[l] slots per group, chosen by the top
// scores of policy at granularity (layer or head).
template <Backend B>
void compress_to_layer_budgets(const Context<B>& ctx, KVCache<B>& cache, EvictionPolicy& policy,
                               Granularity granularity, std::span<const int> layer_budgets, int score_budget) {
  const TokenFeatures f = gather_features(ctx, cache, granularity);
  std::vector<float> scores(std::size_t(f.size));
  policy.score(f, score_budget, scores);
  compact_groups(ctx, cache, f, select_keep_groups(scores, f, layer_budgets));
}

// Returns one mean KL per model layer (0 for layers that are not evictable).
template <Backend B, class W>
std::vector<double> layer_sensitivity(Transformer<B, W>& model, EvictionPolicy& policy,
                                      std::span<const std::int32_t> prompt,
                                      std::span<const std::int32_t> continuation, int budget,
                                      Granularity granularity, std::size_t max_batch = 16) {
  const int n = int(prompt.size()), steps = int(continuation.size());
  DC_CHECK(n > 0 && steps > 0, "layer sensitivity: empty prompt or continuation");
  DC_CHECK(budget > 0 && budget <= n, "layer sensitivity: a budget of ", budget, " slots for a prompt of ", n);
  DC_CHECK(granularity != Granularity::shared, "layer sensitivity: a shared keep-set spans every layer; "
           "use the layer or head granularity");
  DC_CHECK(policy.granularity_for(granularity) == granularity, "layer sensitivity: policy '", policy.name(),
           "' is not defined at the ", granularity_name(granularity), " granularity");
  DC_CHECK(max_batch >= 2, "layer sensitivity: a batch of ", max_batch, " caches (the teacher and a student at least)");
  EvictionPolicy* observed[] = {&policy};
  const SharedPrefills<B, W> prefilled(model, observed, prompt);
  const KVCache<B>& base = prefilled.of(policy).first;
  const int layers = base.num_layers();
  std::vector<int> evictable;
  for (int l = 0; l < layers; ++l)
    if (base.evictable(l)) evictable.push_back(l);
  const std::size_t vocab = std::size_t(model.config().vocab_size);
  const int capacity = n + steps;

  std::vector<double> kl(std::size_t(layers), 0.0);
  for (std::size_t next = 0; next < evictable.size();) {
    // caches[0] is the teacher (the full cache); then one student per layer.
    std::vector<KVCache<B>> caches;
    std::vector<int> student_layer;
    caches.push_back(model.make_cache(capacity));
    caches.back().copy_from(model.context(), base);
    for (; next < evictable.size() && caches.size() < max_batch; ++next) {
      const int l = evictable[next];
      caches.push_back(model.make_cache(capacity));
      KVCache<B>& c = caches.back();
      c.copy_from(model.context(), base);
      c.set_observed_from(0);
      std::vector<int> layer_budgets(std::size_t(layers), n);
      layer_budgets[std::size_t(l)] = budget;
      compress_to_layer_budgets(model.context(), c, policy, granularity, layer_budgets, budget);
      student_layer.push_back(l);
    }
    std::vector<KVCache<B>*> batch;
    for (auto& c : caches) batch.push_back(&c);
    std::vector<float> logits(batch.size() * vocab);
    std::vector<std::int32_t> tokens(batch.size());
    for (int s = 0; s + 1 < steps; ++s) {
      std::fill(tokens.begin(), tokens.end(), continuation[std::size_t(s)]);
      model.forward_batch(tokens, batch, logits);
      const std::span<const float> full(logits.data(), vocab);
      for (std::size_t i = 1; i < batch.size(); ++i)
        kl[std::size_t(student_layer[i - 1])] +=
            kl_divergence(full, std::span<const float>(logits).subspan(i * vocab, vocab));
    }
  }
  for (double& v : kl) v /= double(steps);
  return kl;
}

}  // namespace dc
