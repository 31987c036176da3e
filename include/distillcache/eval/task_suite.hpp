#pragma once
// Accuracy of evicted caches on RULER-style tasks (eval/tasks/): for each sample the full cache
// (the teacher) and every (policy, granularity, budget) student answer the question by greedy
// decoding, and each answer is scored against the expected strings.
//
// Two protocols (TaskProtocol):
//   query_aware    - the whole prompt (context and question) is prefilled and compressed, so a
//                    policy that watches the last queries sees the question;
//   query_agnostic - only the context is prefilled and compressed; the question (and the
//                    assistant's start) is then fed token by token, uncompressed, before the
//                    answer is generated (kvpress's default: the cache is built before the
//                    question is known). In EvictionMode::decode the budget keeps applying while
//                    the question is fed and the answer generated.
//
// As in FidelityEvaluator, the prompt is prefilled once per distinct observation window (and
// query statistics) and each student adopts a copy, and the decoders step together in batches of
// at most max_batch (DecoderBatch), the teacher counting as one. Decoding stops at a stop token
// (EOS, <|im_end|>) or the task's output budget; the stop token is not part of the answer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "../decode/evicting_decoder.hpp"
#include "../io/tokenizer.hpp"
#include "../model/sampling.hpp"
#include "../policy/baselines.hpp"
#include "metrics.hpp"
#include "shared_prefill.hpp"
#include "tasks/task_prompt.hpp"

namespace dc {

enum class TaskProtocol { query_aware, query_agnostic };

inline const char* protocol_name(TaskProtocol p) {
  return p == TaskProtocol::query_aware ? "query-aware" : "query-agnostic";
}
inline TaskProtocol parse_protocol(std::string_view s) {
  if (s == "query-aware") return TaskProtocol::query_aware;
  DC_CHECK(s == "query-agnostic", "unknown protocol '", s, "' (known: query-aware, query-agnostic)");
  return TaskProtocol::query_agnostic;
}

// The tokens that end an answer: the tokenizer's EOS and, where the vocabulary has them, ChatML's
// end of turn and <|endoftext|>.
inline std::vector<std::int32_t> answer_stop_tokens(const Tokenizer& tok) {
  std::vector<std::int32_t> stop;
  if (tok.eos() >= 0) stop.push_back(tok.eos());
  for (const char* t : {"<|im_end|>", "<|endoftext|>"})
    if (const std::int32_t id = tok.token_id(t); id >= 0 && id != tok.eos()) stop.push_back(id);
  return stop;
}

// One sample's answers: the teacher's, then each student's in index(p, g, b) order.
struct TaskSampleResult {
  std::string teacher_output;
  double teacher_score = 0.0;
  std::vector<std::string> outputs;
  std::vector<double> scores;
};

template <Backend B, class W>
class TaskSuite {
 public:
  TaskSuite(Transformer<B, W>& model, const Tokenizer& tokenizer, std::vector<EvictionPolicy*> policies,
            std::vector<Budget> budgets, EvictionMode mode, std::vector<Granularity> granularities,
            TaskProtocol protocol)
      : model_(model), tok_(tokenizer), policies_(std::move(policies)), budgets_(std::move(budgets)),
        mode_(mode), granularities_(std::move(granularities)), protocol_(protocol),
        stop_(answer_stop_tokens(tokenizer)) {
    DC_CHECK(!policies_.empty() && !budgets_.empty() && !granularities_.empty(), "task suite: ",
             policies_.size(), " policies, ", granularities_.size(), " granularities and ",
             budgets_.size(), " budgets; give at least one of each");
    for (std::size_t p = 0; p < policies_.size(); ++p)
      DC_CHECK(policies_[p] != nullptr, "task suite: policy ", p, " is null");
  }

  std::size_t students() const { return policies_.size() * granularities_.size() * budgets_.size(); }
  std::size_t index(std::size_t policy, std::size_t granularity, std::size_t budget) const {
    DC_CHECK(policy < policies_.size() && granularity < granularities_.size() && budget < budgets_.size(),
             "task suite: student (", policy, ", ", granularity, ", ", budget, ") outside the grid");
    return (policy * granularities_.size() + granularity) * budgets_.size() + budget;
  }
  void set_max_batch(std::size_t decoders) {
    DC_CHECK(decoders >= 1, "task suite: a batch of ", decoders, " decoders");
    max_batch_ = decoders;
  }
  TaskProtocol protocol() const { return protocol_; }

  // Called with the student's index (index(p, g, b)) and its cache right after the prompt's
  // compression: lets a caller record the keep-sets (examples/eval --keep-sets).
  void on_compressed(std::function<void(std::size_t, const KVCache<B>&)> observer) {
    on_compressed_ = std::move(observer);
  }

  // Runs one sample. progress(i) is called with each student's index as the batch holding it
  // starts.
  template <class Progress>
  TaskSampleResult run(const tasks::TaskPrompt& prompt, Progress&& progress) {
    const bool aware = protocol_ == TaskProtocol::query_aware;
    const std::vector<std::int32_t> compressed = aware ? prompt.full_prompt() : prompt.context;
    const std::vector<std::int32_t> appended = aware ? std::vector<std::int32_t>{} : prompt.question;
    const int n = int(compressed.size());
    DC_CHECK(n > 0 && prompt.max_new_tokens > 0, "task suite: sample ", prompt.sample, " of ", prompt.task,
             " has an empty prompt or no output budget");
    const int extra = int(appended.size()) + prompt.max_new_tokens;
    DC_CHECK(std::int64_t(n) + extra <= model_.config().max_position, "task ", prompt.task, ": prompt of ",
             prompt.prompt_tokens(), " tokens + ", prompt.max_new_tokens, " generated exceed the model's context of ",
             model_.config().max_position);

    // One prefill per observation window the policies (and the full-cache teacher) ask for.
    FullCachePolicy full;
    std::vector<EvictionPolicy*> all = policies_;
    all.push_back(&full);
    const SharedPrefills<B, W> prefilled(model_, all, compressed);

    TaskSampleResult result;
    result.outputs.resize(students());
    result.scores.resize(students());
    std::size_t next = 0;
    bool teacher_done = false;
    while (next < students() || !teacher_done) {
      std::vector<std::unique_ptr<EvictingDecoder<B, W>>> decoders;
      std::vector<std::size_t> student_of;
      auto add = [&](EvictionPolicy& policy, const Budget& budget, Granularity g, std::size_t student) {
        decoders.push_back(std::make_unique<EvictingDecoder<B, W>>(model_, policy, budget, mode_, n, extra, g));
        const auto& [cache, logits] = prefilled.of(policy);
        decoders.back()->adopt_prefill(cache, logits);
        if (student != kTeacher && on_compressed_) on_compressed_(student, decoders.back()->cache());
        student_of.push_back(student);
      };
      if (!teacher_done) add(full, Budget::of_fraction(1.0), Granularity::shared, kTeacher);
      for (; next < students() && decoders.size() < max_batch_; ++next) {
        const std::size_t p = next / (granularities_.size() * budgets_.size());
        const std::size_t g = next / budgets_.size() % granularities_.size();
        progress(next);
        add(*policies_[p], budgets_[next % budgets_.size()], granularities_[g], next);
      }
      const auto answers = answer(decoders, appended, prompt.max_new_tokens);
      for (std::size_t i = 0; i < decoders.size(); ++i) {
        std::string text = tok_.decode(answers[i]);
        const double score = tasks::score_output(text, prompt.answers, prompt.scoring);
        if (student_of[i] == kTeacher) {
          result.teacher_output = std::move(text);
          result.teacher_score = score;
          teacher_done = true;
        } else {
          result.outputs[student_of[i]] = std::move(text);
          result.scores[student_of[i]] = score;
        }
      }
    }
    return result;
  }

 private:
  // Feeds `appended` to every decoder, then decodes greedily until each stops; the answers'
  // token ids, stop token excluded.
  std::vector<std::vector<std::int32_t>> answer(std::vector<std::unique_ptr<EvictingDecoder<B, W>>>& decoders,
                                                const std::vector<std::int32_t>& appended, int max_new_tokens) {
    std::vector<EvictingDecoder<B, W>*> all;
    for (auto& d : decoders) all.push_back(d.get());
    std::vector<std::int32_t> same(all.size());
    for (const std::int32_t t : appended) {
      std::fill(same.begin(), same.end(), t);
      stepper_.step(all, same);
    }
    std::vector<std::vector<std::int32_t>> out(all.size());
    std::vector<char> done(all.size(), 0);
    for (;;) {
      std::vector<EvictingDecoder<B, W>*> active;
      std::vector<std::int32_t> tokens;
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (done[i]) continue;
        const std::int32_t t = argmax(all[i]->logits());
        if (std::find(stop_.begin(), stop_.end(), t) != stop_.end()) {
          done[i] = 1;
          continue;
        }
        out[i].push_back(t);
        if (int(out[i].size()) == max_new_tokens) {
          done[i] = 1;
          continue;
        }
        active.push_back(all[i]);
        tokens.push_back(t);
      }
      if (active.empty()) return out;
      stepper_.step(active, tokens);
    }
  }

  Transformer<B, W>& model_;
  const Tokenizer& tok_;
  std::vector<EvictionPolicy*> policies_;
  std::vector<Budget> budgets_;
  EvictionMode mode_;
  std::vector<Granularity> granularities_;
  TaskProtocol protocol_;
  std::vector<std::int32_t> stop_;
  std::function<void(std::size_t, const KVCache<B>&)> on_compressed_;
  std::size_t max_batch_ = 16;
  DecoderBatch<B, W> stepper_;
  static constexpr std::size_t kTeacher = std::size_t(-1);
};

// Scores summed over the samples of each (task, length): the teacher's and every student's, and
// how close each student's answers came to the teacher's. The method's aim is fidelity to the
// full cache, which a task's accuracy alone does not show: an eviction can score above the full
// cache (on fwe, H2O's eviction of rare words helps the count), and two policies can score alike
// with different answers.
class TaskScores {
 public:
  struct Cell {
    std::string task;
    int length = 0;
    int samples = 0;
    double teacher_sum = 0.0;
    std::int64_t prompt_tokens_sum = 0;
    std::vector<double> student_sum;
    std::vector<int> student_same;        // samples whose answer is the teacher's, byte for byte
    std::vector<double> student_gap_sum;  // |student's score - teacher's score|, summed
  };

  void add(const tasks::TaskPrompt& prompt, const TaskSampleResult& r) {
    Cell* c = nullptr;
    for (auto& cell : cells_)
      if (cell.task == prompt.task && cell.length == prompt.length) c = &cell;
    if (!c) {
      cells_.push_back(Cell{prompt.task, prompt.length, 0, 0.0, 0, std::vector<double>(r.scores.size(), 0.0),
                            std::vector<int>(r.scores.size(), 0), std::vector<double>(r.scores.size(), 0.0)});
      c = &cells_.back();
    }
    DC_CHECK(c->student_sum.size() == r.scores.size(), "task scores: ", r.scores.size(), " students, earlier ",
             c->student_sum.size());
    DC_CHECK(r.outputs.size() == r.scores.size(), "task scores: ", r.outputs.size(), " answers for ",
             r.scores.size(), " scores");
    ++c->samples;
    c->teacher_sum += r.teacher_score;
    c->prompt_tokens_sum += prompt.prompt_tokens();
    for (std::size_t i = 0; i < r.scores.size(); ++i) {
      c->student_sum[i] += r.scores[i];
      c->student_same[i] += r.outputs[i] == r.teacher_output ? 1 : 0;
      c->student_gap_sum[i] += std::abs(r.scores[i] - r.teacher_score);
    }
  }
  const std::vector<Cell>& cells() const { return cells_; }

 private:
  std::vector<Cell> cells_;  // in the order first seen
};

// One line of the report: a student's accuracy on one (task, length), its 95 % Wilson interval,
// and relative to the teacher's accuracy on the same samples (the interval divided by it: the
// teacher is the reference, not a second estimate). relative is NaN when the teacher scored 0.
// Fidelity to the teacher: same_as_full, the share of samples whose answer is the teacher's byte
// for byte (with its Wilson interval), and score_gap, the mean |score - teacher's score| (0 when
// every answer scores as the teacher's, whether it is right or not).
struct TaskReportRow {
  std::string task, policy, granularity;
  int length = 0, samples = 0;
  double budget = 0.0, mean_prompt_tokens = 0.0;
  double accuracy = 0.0, full_accuracy = 0.0;
  Interval interval, relative_interval;
  double relative = 0.0;
  double same_as_full = 0.0, score_gap = 0.0;
  Interval same_interval;
};

// labels[p]: policy p's name; ran_at[p * G + g]: the granularity policy p ran at for request g;
// budgets[b]: the budget's fraction (or token count).
inline std::vector<TaskReportRow> task_report(const TaskScores& scores, const std::vector<std::string>& labels,
                                              const std::vector<std::string>& ran_at,
                                              const std::vector<double>& budgets) {
  std::vector<TaskReportRow> rows;
  const std::size_t G = labels.empty() ? 0 : ran_at.size() / labels.size();
  for (const auto& c : scores.cells()) {
    DC_CHECK(c.student_sum.size() == labels.size() * G * budgets.size(), "task report: ", c.student_sum.size(),
             " students for ", labels.size(), " policies x ", G, " granularities x ", budgets.size(), " budgets");
    const double n = double(c.samples), full = c.teacher_sum / n;
    for (std::size_t p = 0; p < labels.size(); ++p)
      for (std::size_t g = 0; g < G; ++g)
        for (std::size_t b = 0; b < budgets.size(); ++b) {
          TaskReportRow r;
          r.task = c.task;
          r.length = c.length;
          r.samples = c.samples;
          r.policy = labels[p];
          r.granularity = ran_at[p * G + g];
          r.budget = budgets[b];
          r.mean_prompt_tokens = double(c.prompt_tokens_sum) / n;
          const std::size_t s = (p * G + g) * budgets.size() + b;
          const double sum = c.student_sum[s];
          r.accuracy = sum / n;
          r.full_accuracy = full;
          r.interval = wilson_interval(sum, n);
          r.relative = full > 0 ? r.accuracy / full : std::nan("");
          r.relative_interval = full > 0 ? Interval{r.interval.lo / full, r.interval.hi / full}
                                         : Interval{std::nan(""), std::nan("")};
          r.same_as_full = double(c.student_same[s]) / n;
          r.same_interval = wilson_interval(double(c.student_same[s]), n);
          r.score_gap = c.student_gap_sum[s] / n;
          rows.push_back(r);
        }
  }
  return rows;
}

inline void write_task_csv(std::ostream& os, const std::vector<TaskReportRow>& rows, TaskProtocol protocol) {
  os << "task,length,protocol,policy,granularity,budget,samples,mean_prompt_tokens,accuracy,accuracy_lo,"
        "accuracy_hi,full_accuracy,relative,relative_lo,relative_hi,same_as_full,same_as_full_lo,same_as_full_hi,"
        "score_gap\n";
  for (const auto& r : rows)
    os << r.task << ',' << r.length << ',' << protocol_name(protocol) << ',' << r.policy << ',' << r.granularity
       << ',' << r.budget << ',' << r.samples << ',' << r.mean_prompt_tokens << ',' << r.accuracy << ','
       << r.interval.lo << ',' << r.interval.hi << ',' << r.full_accuracy << ',' << r.relative << ','
       << r.relative_interval.lo << ',' << r.relative_interval.hi << ',' << r.same_as_full << ','
       << r.same_interval.lo << ',' << r.same_interval.hi << ',' << r.score_gap << '\n';
}

inline void write_task_markdown(std::ostream& os, const std::vector<TaskReportRow>& rows, TaskProtocol protocol) {
  auto fixed = [](double v, int digits) {
    if (std::isnan(v)) return std::string("n/a");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return std::string(buf);
  };
  os << "| task | length | protocol | policy | granularity | budget | samples | accuracy | 95% CI | full cache | "
        "relative | 95% CI | same answer as full | score gap |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    os << "| " << r.task << " | " << r.length << " | " << protocol_name(protocol) << " | " << r.policy << " | "
       << r.granularity << " | " << r.budget << " | " << r.samples << " | " << fixed(r.accuracy, 3) << " | ["
       << fixed(r.interval.lo, 3) << ", " << fixed(r.interval.hi, 3) << "] | " << fixed(r.full_accuracy, 3) << " | "
       << fixed(r.relative, 3) << " | [" << fixed(r.relative_interval.lo, 3) << ", "
       << fixed(r.relative_interval.hi, 3) << "] | " << fixed(r.same_as_full, 3) << " | " << fixed(r.score_gap, 3)
       << " |\n";
}

}  // namespace dc
