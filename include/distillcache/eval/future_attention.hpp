#pragma once
// What the full-cache model reads next: for every row of a prompt's features, the share of the
// continuation's attention to the prompt that goes to the row's token.
//
// This is the quantity an eviction policy tries to predict. A token the continuation's queries
// never attend to can go at no cost to the next tokens' distributions; one that draws a tenth of
// their attention cannot. The warm start (rl/trainer.hpp, ReinforceTrainer::warm_start_future)
// fits the policy's scores to it row by row: a dense target, one number per (row, context),
// where REINFORCE sees one reward per keep-set. The reward stays the KL that REINFORCE then
// optimises; this only chooses where it starts.
//
// How: the prefilled cache is copied, the continuation (all but its last token, which the
// teacher never feeds) is run through the copy with statistics on, and the rows' accumulated
// mass after it minus before it is what the continuation's queries paid each (layer, KV head,
// slot), summed as the rows' granularity sums. Shares are per group (they add up to 1 over the
// group's prompt rows): scale-free like the policy inputs.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../cache/features.hpp"
#include "../model/transformer.hpp"

namespace dc {

// prompt_features: gather_features(prefilled, granularity) of the prompt's cache.
// Returns [prompt_features.size]: each row's share of its group's continuation attention.
template <Backend B, class W>
std::vector<float> future_attention_shares(Transformer<B, W>& model, const KVCache<B>& prefilled,
                                           const TokenFeatures& prompt_features,
                                           std::span<const std::int32_t> continuation) {
  DC_CHECK(continuation.size() >= 2, "future attention: a continuation of ", continuation.size(),
           " tokens; the teacher feeds all but the last, so at least 2 are needed");
  const int fed = int(continuation.size()) - 1;
  auto cache = model.make_cache(prefilled.length() + fed);
  cache.copy_from(model.context(), prefilled);
  cache.set_observed_from(prefilled.next_position());  // the continuation's queries only
  model.forward(continuation.first(std::size_t(fed)), cache);
  const TokenFeatures after = gather_features(model.context(), cache, prompt_features.granularity);

  const TokenFeatures& before = prompt_features;
  DC_CHECK(after.num_groups() == before.num_groups(), "future attention: ", after.num_groups(),
           " groups after the continuation, ", before.num_groups(), " before");
  std::vector<float> shares(std::size_t(before.size), 0.0f);
  for (int g = 0; g < before.num_groups(); ++g) {
    const FeatureGroup& b = before.groups[std::size_t(g)];
    const FeatureGroup& a = after.groups[std::size_t(g)];
    DC_CHECK(a.rows() >= b.rows(), "future attention: group ", g, " shrank from ", b.rows(), " to ",
             a.rows(), " rows");
    // Slots keep their order and the continuation appends after them: row i is the same token.
    double total = 0.0;
    for (int i = 0; i < b.rows(); ++i) {
      const std::size_t rb = std::size_t(b.row_begin + i), ra = std::size_t(a.row_begin + i);
      DC_CHECK(before.position[rb] == after.position[ra], "future attention: row ", rb,
               " holds position ", before.position[rb], " before and ", after.position[ra], " after");
      // The difference of two float sums: clamp the rounding of an unattended token at 0.
      const float paid = std::max(0.0f, after.accumulated_mass[ra] - before.accumulated_mass[rb]);
      shares[rb] = paid;
      total += double(paid);
    }
    if (total > 0.0)
      for (int i = b.row_begin; i < b.row_end; ++i) shares[std::size_t(i)] = float(double(shares[std::size_t(i)]) / total);
  }
  return shares;
}

}  // namespace dc
