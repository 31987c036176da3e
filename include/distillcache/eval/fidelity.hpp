#pragma once
// Fidelity of evicted caches on one context: the full cache (teacher) and every (policy,
// budget) pair (students) are teacher-forced on the same continuation, and every step's
// next-token distributions are compared (eval/metrics.hpp).
//
// The prompt is prefilled once per distinct observation window (and query statistics) and the
// resulting cache copied into each student (EvictingDecoder::adopt_prefill), so adding policies
// costs decode steps, not prefills. The teacher and the students decode together in batches of
// at most max_batch (DecoderBatch: the weights stream once per step for a whole batch); on the
// CPU every student's logits are bit for bit those of decoding it alone. Step 0 predicts the
// first continuation token from the prompt's own logits, which eviction after prefill cannot
// change; later steps see the compressed cache.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "../decode/evicting_decoder.hpp"
#include "../policy/baselines.hpp"
#include "metrics.hpp"
#include "shared_prefill.hpp"

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
  // called with each student's index as the batch holding it starts.
  template <class Progress>
  void add_context(std::span<const std::int32_t> prompt, std::span<const std::int32_t> continuation,
                   Progress&& progress) {
    const int n = int(prompt.size()), steps = int(continuation.size());
    DC_CHECK(n > 0 && steps > 0, "fidelity: empty prompt or continuation");
    const std::size_t vocab = std::size_t(model_.config().vocab_size);

    // One prefill per observation window the policies (and the full-cache teacher) ask for.
    FullCachePolicy full;
    std::vector<EvictionPolicy*> all = policies_;
    all.push_back(&full);
    const SharedPrefills<B, W> prefilled(model_, all, prompt);
    // Decoder 0 of the first batch is the teacher (the full cache); the others are students, in
    // index order. Each decoder's rows are its step logits, [steps, vocab].
    const std::size_t students = totals_.size();
    std::vector<float> teacher;
    std::size_t next = 0;  // the next student to run
    bool teacher_done = false;
    while (next < students || !teacher_done) {
      std::vector<std::unique_ptr<EvictingDecoder<B, W>>> decoders;
      std::vector<std::size_t> student_of;  // index(p, g, b) of each decoder, or npos (teacher)
      auto add = [&](EvictionPolicy& policy, const Budget& budget, Granularity granularity,
                     std::size_t student) {
        decoders.push_back(std::make_unique<EvictingDecoder<B, W>>(model_, policy, budget, mode_, n,
                                                                   steps, granularity));
        const auto& [cache, logits] = prefilled.of(policy);
        decoders.back()->adopt_prefill(cache, logits);
        if (student != kTeacher && on_compressed_) on_compressed_(student, decoders.back()->cache());
        student_of.push_back(student);
      };
      if (!teacher_done) add(full, Budget::of_fraction(1.0), Granularity::shared, kTeacher);
      for (; next < students && decoders.size() < max_batch_; ++next) {
        const std::size_t p = next / (granularities_.size() * budgets_.size());
        const std::size_t g = next / budgets_.size() % granularities_.size();
        const std::size_t b = next % budgets_.size();
        progress(next);
        add(*policies_[p], budgets_[b], granularities_[g], next);
      }
      std::vector<std::vector<float>> rows(decoders.size());
      for (std::size_t i = 0; i < decoders.size(); ++i) {
        const auto out = decoders[i]->logits();
        rows[i].assign(out.begin(), out.end());
      }
      std::vector<EvictingDecoder<B, W>*> batch;
      for (auto& d : decoders) batch.push_back(d.get());
      stepper_.teacher_force(batch, continuation.first(std::size_t(steps - 1)), rows);
      for (std::size_t i = 0; i < decoders.size(); ++i) {
        if (student_of[i] == kTeacher) {
          teacher = std::move(rows[i]);
          teacher_done = true;
          continue;
        }
        FidelityTotals& total = totals_[student_of[i]];
        for (int s = 0; s < steps; ++s)
          total.add(std::span<const float>(teacher).subspan(std::size_t(s) * vocab, vocab),
                    std::span<const float>(rows[i]).subspan(std::size_t(s) * vocab, vocab),
                    continuation[std::size_t(s)]);
      }
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

  // Decoders stepped together (the teacher counts as one): more streams the weights fewer times,
  // each costs a KV cache of the prompt plus the continuation.
  void set_max_batch(std::size_t decoders) {
    DC_CHECK(decoders >= 1, "fidelity: a batch of ", decoders, " decoders");
    max_batch_ = decoders;
  }

 private:
  Transformer<B, W>& model_;
  std::vector<EvictionPolicy*> policies_;
  std::vector<Budget> budgets_;
  EvictionMode mode_;
  std::vector<Granularity> granularities_;
  std::vector<FidelityTotals> totals_;
  std::function<void(std::size_t, const KVCache<B>&)> on_compressed_;
  int contexts_ = 0;
  std::size_t max_batch_ = 16;
  DecoderBatch<B, W> stepper_;
  static constexpr std::size_t kTeacher = std::size_t(-1);
};

}  // namespace dc
