#pragma once
// EvictingDecoder: runs a transformer with a cache that a policy keeps within a budget.
//
// Two triggers: after prefill (prompt compression to B tokens) and, in decode mode, whenever the
// cache reaches B + chunk tokens (evicted back to B), so it never holds more than B + chunk.
// Statistics: at prefill the policy's observation window of the last W prompt queries is
// observed (W = 0: all of them); every decode query is observed.
//
// Granularity: one keep-set for the whole cache (shared), one per layer, or one per (layer, KV
// head); the policy's own finest granularity caps the request (policy.granularity_for). Every
// group keeps B slots, so the cache holds exactly B (+ chunk) slots per layer and head -- unless
// the policy shares the budget unevenly among layers (EvictionPolicy::layer_budget_weights, at
// the layer and head granularities): layer l then keeps B_l slots per head, the B_l adding up to
// B x (evictable layers) (math/layer_budgets.hpp), fixed at prompt compression for the whole run.
// Weights written for a model of another depth apply by relative depth (math/layer_depth.hpp),
// or not at all where the policy says so (EvictionPolicy::maps_layer_rules).
//
// What the budget counts: the slots of each evictable layer (KVCache::evictable). On a model
// with local sliding-window layers (Gemma 3) those are the global layers; every eviction also
// trims each local layer to its window (exact), so a local layer holds min(tokens, window - 1)
// (+ chunk) slots whatever the budget, and the bytes saved are the global layers' share.
//
// Memory: the cache is reserved for max_prompt + max_new_tokens slots; after the prompt's
// compression it is copied into a reservation of what decoding can still reach (its length +
// max_new_tokens: a step adds one slot per layer and head, an eviction only removes), so the
// slots evicted are memory given back, not only slots unused. S sequences at 25 % of a 32k
// Mistral-7B prompt then hold about S x 1.1 GB where they held S x 4.6 GB: 16 of them fit on
// an 80 GB GPU beside the weights. The next prefill reserves the whole prompt again.
//
// DecoderBatch steps several decoders of one model together (Transformer::forward_batch): the
// weights stream once per step for all of them, and each then evicts on its own schedule.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../model/transformer.hpp"
#include "../policy/layer_lists.hpp"
#include "../policy/policy.hpp"
#include "../policy/select.hpp"
#include "../cache/budget.hpp"
#include "../cache/features.hpp"
#include "../cache/keep_sets.hpp"
#include "../math/layer_budgets.hpp"
#include "in_place_eviction.hpp"

namespace dc {

enum class EvictionMode { prefill, decode };

template <Backend B, class W = float>
class EvictingDecoder {
 public:
  // max_new_tokens bounds decoding, to size the cache once.
  EvictingDecoder(Transformer<B, W>& model, EvictionPolicy& policy, Budget budget,
                  EvictionMode mode, int max_prompt, int max_new_tokens,
                  Granularity granularity = Granularity::shared)
      : model_(model), policy_(policy), budget_(budget), mode_(mode), max_prompt_(max_prompt),
        max_new_tokens_(max_new_tokens), granularity_(policy.granularity_for(granularity)) {
    DC_CHECK(max_prompt > 0 && max_new_tokens >= 0, "EvictingDecoder: max_prompt ", max_prompt,
             " must be positive and max_new_tokens ", max_new_tokens, " non-negative");
    const std::int64_t capacity = std::int64_t(max_prompt) + max_new_tokens;
    DC_CHECK(capacity <= model_.config().max_position, "EvictingDecoder: max_prompt ", max_prompt,
             " + max_new_tokens ", max_new_tokens, " exceed the model's max_position ",
             model_.config().max_position);
    cache_ = model_.make_cache(int(capacity));
    logits_.resize(std::size_t(model_.config().vocab_size));
  }

  // Prefills the prompt (observing the policy's window) and compresses it to the budget.
  // Returns the logits after the last prompt token.
  std::span<const float> prefill(std::span<const std::int32_t> prompt) {
    const int n = int(prompt.size());
    DC_CHECK(n > 0, "EvictingDecoder: empty prompt");
    DC_CHECK(n <= max_prompt_, "EvictingDecoder: prompt of ", n, " tokens exceeds max_prompt ",
             max_prompt_);
    reserve_for_prompt();
    cache_.clear();
    cache_.set_observed_from(policy_.observation_start(n));
    cache_.collect_queries(policy_.query_statistics(), model_.config().rope_theta);
    model_.forward(prompt, cache_, std::span<float>(logits_));
    return compress_prompt(n);
  }

  // The same as prefill() for a prompt already run through the model with this policy's
  // observation window (cache.set_observed_from(policy.observation_start(n)) before the forward):
  // copies that cache and compresses the copy. Lets one prefill serve several policies/budgets.
  std::span<const float> adopt_prefill(const KVCache<B>& prefilled, std::span<const float> logits) {
    const int n = prefilled.next_position();
    DC_CHECK(n > 0 && n <= max_prompt_, "EvictingDecoder: prefilled prompt of ", n,
             " tokens (max_prompt ", max_prompt_, ")");
    DC_CHECK(prefilled.observed_from() == policy_.observation_start(n),
             "EvictingDecoder: the prefilled cache observed queries from position ",
             prefilled.observed_from(), ", policy '", policy_.name(), "' needs ",
             policy_.observation_start(n));
    DC_CHECK(prefilled.query_statistics().spec() == policy_.query_statistics(),
             "EvictingDecoder: the prefilled cache's query statistics (from position ",
             prefilled.query_statistics().spec().from, ") are not what policy '", policy_.name(),
             "' needs (from position ", policy_.query_statistics().from, ")");
    DC_CHECK(logits.size() == logits_.size(), "EvictingDecoder: logits of ", logits.size(),
             " entries, vocabulary ", logits_.size());
    reserve_for_prompt();
    cache_.copy_from(model_.context(), prefilled);
    std::copy(logits.begin(), logits.end(), logits_.begin());
    return compress_prompt(n);
  }

  // Feeds one token; evicts back to the budget when decode-mode eviction is due.
  std::span<const float> step(std::int32_t token) {
    check_can_step();
    model_.forward(std::span<const std::int32_t>(&token, 1), cache_, std::span<float>(logits_));
    evict_if_due();
    return logits_;
  }

  // The logits of the latest prefill or step.
  std::span<const float> logits() const { return logits_; }

  // Chooses keep-sets with `selector` instead of the deterministic top-B (null: the top-B). The
  // selector must outlive the decoder's use of it.
  void set_selector(KeepSetSelector* selector) {
    DC_CHECK(selector == nullptr || layer_budgets_.empty(), "EvictingDecoder: sampled keep-sets with "
             "per-layer budgets are not supported yet");
    selector_ = selector;
  }

  const KVCache<B>& cache() const { return cache_; }
  int budget_tokens() const { return budget_tokens_; }
  // Tokens decoded between decode-time evictions (Budget::chunk_for of the resolved budget).
  int chunk_tokens() const { return chunk_tokens_; }
  // Slots each layer keeps (math/layer_budgets.hpp); empty when every layer keeps budget_tokens().
  const std::vector<int>& layer_budgets() const { return layer_budgets_; }
  int evictions() const { return evictions_; }
  // The granularity keep-sets are chosen at (the request, capped by the policy's rule).
  Granularity granularity() const { return granularity_; }
  // Whether evictions may run where the cache lives (decode/in_place_eviction.hpp; on by
  // default, a no-op on the CPU); off, every eviction gathers the features to the host. The same
  // keep-sets either way: the switch is for tests and measurements.
  void set_in_place_eviction(bool allowed) { in_place_allowed_ = allowed; }
  // Evictions that ran in place so far.
  int in_place_evictions() const { return in_place_evictions_; }

 private:
  template <Backend, class>
  friend class DecoderBatch;

  void check_can_step() const {
    DC_CHECK(budget_tokens_ > 0, "EvictingDecoder: step() before prefill()");
    if (cache_.free_slots() > 0) return;
    int full = 0;  // the first layer with no free slot
    while (cache_.length(full) < cache_.capacity(full)) ++full;
    DC_FAIL("EvictingDecoder: step() past max_new_tokens: the cache is full at ", cache_.capacity(full), " slots",
            cache_.uniform_capacity() ? std::string() : " in layer " + std::to_string(full),
            " (the prompt's, compressed, + max_new_tokens ", max_new_tokens_, ")");
  }
  void evict_if_due() {
    if (mode_ == EvictionMode::decode && policy_.evicts() &&
        std::int64_t(cache_.evictable_length()) >= std::int64_t(largest_budget_) + chunk_tokens_)
      evict();
  }

  std::span<const float> compress_prompt(int n) {
    evictions_ = 0;
    in_place_evictions_ = 0;
    budget_tokens_ = budget_.resolve(n);
    chunk_tokens_ = budget_.chunk_for(budget_tokens_);
    resolve_layer_budgets(n);
    cache_.set_observed_from(0);  // from now on every query is observed
    if (policy_.evicts() && cache_.evictable_length() > budget_tokens_) {
      evict();
      release_unused_slots();
    }
    return logits_;
  }

  // The whole prompt's reservation, for prefill() and adopt_prefill() after a compression gave
  // part of it back.
  void reserve_for_prompt() {
    const std::int64_t full = std::int64_t(max_prompt_) + max_new_tokens_;
    if (cache_.smallest_capacity() < full) cache_ = model_.make_cache(int(full));
  }

  // Copies the compressed cache into a reservation of length(l) + max_new_tokens slots in each
  // layer l, the most decoding can reach there (a step adds one slot to every layer, an eviction
  // only removes), where that frees at least a fifth of the present one (a smaller gain is not
  // worth the copy). Layers kept to different budgets get different capacities: the shipped
  // policy's three-fold budget in three layers no longer sets every layer's reservation. Every
  // slot, position and statistic moves as it is: the same values in a narrower layout.
  void release_unused_slots() {
    const int layers = cache_.num_layers();
    std::vector<int> reachable(std::size_t(layers), 0);
    std::int64_t reachable_slots = 0, reserved_slots = 0;
    for (int l = 0; l < layers; ++l) {
      // (at least one slot: a layer trimmed to a window of 1 holds none, and max_new_tokens may be 0)
      reachable[std::size_t(l)] = int(std::clamp<std::int64_t>(std::int64_t(cache_.length(l)) + max_new_tokens_, 1,
                                                               cache_.capacity(l)));
      reachable_slots += reachable[std::size_t(l)];
      reserved_slots += cache_.capacity(l);
    }
    if (reachable_slots * 5 > reserved_slots * 4) return;
    KVCache<B> smaller = model_.make_cache(std::span<const int>(reachable));
    smaller.copy_from(model_.context(), cache_);
    cache_ = std::move(smaller);
  }

  // layer_budgets_: empty when every layer keeps budget_tokens_.
  void resolve_layer_budgets(int n) {
    layer_budgets_.clear();
    largest_budget_ = budget_tokens_;
    if (policy_.layer_budget_weights().empty() || granularity_ == Granularity::shared || !policy_.evicts()) return;
    const int layers = cache_.num_layers();
    // Written for a model of another depth: each layer takes the weight at its relative depth,
    // unless the policy leaves its rules per layer out there.
    if (int(policy_.layer_budget_weights().size()) != layers && !policy_.maps_layer_rules()) return;
    const std::vector<double> weights = layer_budget_weights_at_depth(policy_.layer_budget_weights(), layers);
    DC_CHECK(selector_ == nullptr, "EvictingDecoder: policy '", policy_.name(), "' shares the budget "
             "unevenly among layers, which sampled keep-sets (the trainer's) do not support yet");
    std::vector<char> evictable(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) evictable[std::size_t(l)] = cache_.evictable(l);
    layer_budgets_ = allocate_layer_budgets(weights, evictable, budget_tokens_, n,
                                            std::max(1, budget_.sink + budget_.recent));
    largest_budget_ = *std::max_element(layer_budgets_.begin(), layer_budgets_.end());
  }

  void evict() {
    if (evict_in_place_if_possible()) {
      ++evictions_;
      ++in_place_evictions_;
      return;
    }
    gather_features_into(features_, model_.context(), cache_, granularity_);
    const TokenFeatures& f = features_;
    scores_.assign(std::size_t(f.size), 0.0f);
    policy_.score(f, budget_tokens_, scores_);  // validates the features and the scores
    const KeepSets keep =
        selector_ ? selector_->select(f, scores_, budget_tokens_, budget_.sink, budget_.recent)
        : layer_budgets_.empty()
            ? select_keep_groups(scores_, f, budget_tokens_, budget_.sink, budget_.recent)
            : select_keep_groups(scores_, f, std::span<const int>(layer_budgets_), budget_.sink, budget_.recent);
    compact_groups(model_.context(), cache_, f, keep);
    ++evictions_;
  }

  bool evict_in_place_if_possible() {
    if (!in_place_allowed_ || selector_ != nullptr || !layer_budgets_.empty() || budget_.sink != 0 ||
        budget_.recent != 0 || granularity_ != Granularity::head)
      return false;
    const std::optional<ScoreRule> rule = policy_.score_rule(budget_tokens_);
    return rule && evict_in_place(model_.context(), cache_, *rule, budget_tokens_, in_place_scratch_);
  }

  Transformer<B, W>& model_;
  EvictionPolicy& policy_;
  Budget budget_;
  EvictionMode mode_;
  int max_prompt_;
  int max_new_tokens_;
  Granularity granularity_;
  KVCache<B> cache_;
  TokenFeatures features_;  // the last eviction's, reused: its columns are not reallocated
  KeepSetSelector* selector_ = nullptr;
  std::vector<float> logits_, scores_;
  int budget_tokens_ = 0;
  int chunk_tokens_ = 0;
  std::vector<int> layer_budgets_;
  int largest_budget_ = 0;  // the most slots a layer keeps after an eviction
  int evictions_ = 0;
  bool in_place_allowed_ = true;
  int in_place_evictions_ = 0;
  InPlaceEvictionScratch<B> in_place_scratch_;
};

// Steps several EvictingDecoders of one model as one batch: step(decoders, tokens) feeds
// tokens[i] to decoders[i] in one Transformer::forward_batch and then lets each evict as its
// step() would. On the CPU the result is bit for bit that of calling step() on each in turn
// (a stateful policy shared by several decoders, such as one RandomPolicy, draws in another
// order: give each decoder its own).
template <Backend B, class W = float>
class DecoderBatch {
 public:
  void step(std::span<EvictingDecoder<B, W>* const> decoders, std::span<const std::int32_t> tokens) {
    DC_CHECK(!decoders.empty() && decoders.size() == tokens.size(), "DecoderBatch: ",
             decoders.size(), " decoders for ", tokens.size(), " tokens");
    Transformer<B, W>& model = decoders[0]->model_;
    caches_.clear();
    for (EvictingDecoder<B, W>* d : decoders) {
      DC_CHECK(d != nullptr, "DecoderBatch: a decoder is null");
      DC_CHECK(&d->model_ == &model, "DecoderBatch: the decoders run different models");
      d->check_can_step();
      caches_.push_back(&d->cache_);
    }
    const std::size_t vocab = std::size_t(model.config().vocab_size);
    logits_.resize(decoders.size() * vocab);
    model.forward_batch(tokens, caches_, logits_);
    for (std::size_t i = 0; i < decoders.size(); ++i) {
      std::copy_n(logits_.begin() + std::ptrdiff_t(i * vocab), vocab, decoders[i]->logits_.begin());
      decoders[i]->evict_if_due();
    }
  }

  // Teacher-forcing: step t feeds tokens[t] to every decoder; rows[i] gets decoder i's logits of
  // every step appended ([tokens.size(), vocab] more floats).
  void teacher_force(std::span<EvictingDecoder<B, W>* const> decoders, std::span<const std::int32_t> tokens,
                     std::vector<std::vector<float>>& rows) {
    DC_CHECK(rows.size() == decoders.size(), "DecoderBatch: ", rows.size(), " row buffers for ",
             decoders.size(), " decoders");
    std::vector<std::int32_t> same(decoders.size());
    for (const std::int32_t token : tokens) {
      std::fill(same.begin(), same.end(), token);
      step(decoders, same);
      for (std::size_t i = 0; i < decoders.size(); ++i) {
        const auto out = decoders[i]->logits();
        rows[i].insert(rows[i].end(), out.begin(), out.end());
      }
    }
  }

 private:
  std::vector<KVCache<B>*> caches_;
  std::vector<float> logits_;  // [decoders, vocab]
};

}  // namespace dc
