#pragma once
// One sample of a task as token ids, fitted to a target length with the model's tokenizer.
//
// Length, as RULER's max_seq_length: the prompt plus the task's output budget (max_new_tokens)
// fit within the target, and the haystack is the largest that does (binary search on its size;
// the sample's random stream restarts at every size tried, so the sample depends on the seed,
// task, length and index only).
//
// The prompt comes in two parts for the two protocols:
//   context  - chat template's user prefix, instruction, haystack (what query-agnostic
//              compresses);
//   question - the question, the end of the user turn, the assistant's start and RULER's answer
//              prefix (appended after compression in query-agnostic, compressed with the
//              context in query-aware).
// Each part is tokenized on its own (special tokens such as <|im_start|> matched), and the
// query-aware prompt is by definition their concatenation, so both protocols see the same ids.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../io/tokenizer.hpp"
#include "chat_template.hpp"
#include "ruler_tasks.hpp"

namespace dc::tasks {

struct TaskPrompt {
  std::string task;
  int length = 0, sample = 0;
  std::size_t haystack_size = 0;
  std::string context_text, question_text;
  std::vector<std::int32_t> context, question;
  std::vector<std::string> answers;
  int max_new_tokens = 0;
  Scoring scoring = Scoring::match_all;

  int prompt_tokens() const { return int(context.size() + question.size()); }
  // The query-aware prompt: context then question.
  std::vector<std::int32_t> full_prompt() const {
    std::vector<std::int32_t> ids = context;
    ids.insert(ids.end(), question.begin(), question.end());
    return ids;
  }
};

class TaskPromptBuilder {
 public:
  // The tokenizer and resources must outlive the builder.
  TaskPromptBuilder(const Tokenizer& tokenizer, ChatTemplate chat, TaskResources resources, std::uint64_t seed)
      : tok_(tokenizer), chat_(std::move(chat)), res_(resources), seed_(seed) {}

  TaskPrompt build(const TaskSpec& task, int length, int sample) const {
    DC_CHECK(length > 0, "task ", task.name, ": length ", length, " must be positive");
    DC_CHECK(sample >= 0, "task ", task.name, ": sample ", sample, " must be non-negative");
    const std::string example = task.kind == TaskKind::variable_tracking ? vt_example(sample) : "";
    auto at = [&](std::size_t size) { return render_with(task, length, sample, size, example); };
    auto fits = [&](const TaskPrompt& p) { return p.prompt_tokens() + task.max_new_tokens <= length; };

    std::size_t lo = task.min_size;
    TaskPrompt best = at(lo);
    DC_CHECK(fits(best), "length ", length, " is too short for task ", task.name, ": its smallest prompt is ",
             best.prompt_tokens(), " tokens and it generates up to ", task.max_new_tokens, " (",
             best.prompt_tokens() + task.max_new_tokens, " in all)");
    // Grow until a size does not fit (or the text runs out), then bisect between the two.
    const std::size_t cap = max_size(task);
    std::size_t hi = lo;
    while (hi < cap) {
      hi = std::min(cap, hi * 2);
      TaskPrompt p = at(hi);
      if (!fits(p)) break;
      lo = hi;
      best = std::move(p);
    }
    while (hi > lo + 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      TaskPrompt p = at(mid);
      if (fits(p)) {
        lo = mid;
        best = std::move(p);
      } else {
        hi = mid;
      }
    }
    return best;
  }

  // The sample at a given haystack size, not fitted: for tests and for the search above.
  TaskPrompt render(const TaskSpec& task, int length, int sample, std::size_t size) const {
    return render_with(task, length, sample, size,
                       task.kind == TaskKind::variable_tracking ? vt_example(sample) : "");
  }

 private:
  // `example`: text that goes before the task's own (vt's solved example).
  TaskPrompt render_with(const TaskSpec& task, int length, int sample, std::size_t size,
                         const std::string& example) const {
    TaskRng rng(seed_, task.name, length, sample);
    TaskText text = make_task_text(task, size, length, rng, res_);
    // The context ends in exactly one line break, which the question follows: a tokenizer then
    // splits the whole prompt where the parts meet, so the two parts tokenize as the whole does.
    while (!text.context.empty() && (text.context.back() == '\n' || text.context.back() == ' '))
      text.context.pop_back();
    text.context = example + text.context + "\n";
    TaskPrompt p;
    p.task = task.name;
    p.length = length;
    p.sample = sample;
    p.haystack_size = size;
    p.context_text = chat_.user_prefix() + text.context;
    p.question_text = text.question + chat_.assistant_start(text.answer_prefix);
    p.context = tok_.encode(p.context_text, /*add_special=*/true);
    p.question = tok_.encode(p.question_text, /*add_special=*/false);
    p.answers = std::move(text.answers);
    p.max_new_tokens = task.max_new_tokens;
    p.scoring = task.scoring;
    return p;
  }

  // The largest haystack a task's source allows.
  std::size_t max_size(const TaskSpec& task) const {
    if (task.kind == TaskKind::niah && task.haystack == HaystackType::essay)
      return res_.essay ? res_.essay->words().size() : task.min_size;
    if (task.kind == TaskKind::common_words) return res_.words ? res_.words->size() : task.min_size;
    return std::size_t(1) << 24;  // synthetic text: the length bound stops the search first
  }

  // RULER's vt prompt starts with one solved example: 3-letter variables, its own noise, fitted
  // (with its answer and vt's output budget) to 500 tokens.
  std::string vt_example(int sample) const {
    auto text_at = [&](std::size_t size) {
      TaskRng rng(seed_, "vt-example", 500, sample);
      const TaskText t = detail::vt_text(size, rng, 3);
      return t.context + t.question + t.answer_prefix + detail::join(t.answers, " ") + "\n\n";
    };
    auto fits = [&](const std::string& s) { return int(tok_.encode(s).size()) + 30 <= 500; };
    std::size_t lo = 5, hi = 64;
    std::string best = text_at(lo);
    while (hi > lo + 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      std::string s = text_at(mid);
      if (fits(s)) {
        lo = mid;
        best = std::move(s);
      } else {
        hi = mid;
      }
    }
    return best;
  }

  const Tokenizer& tok_;
  ChatTemplate chat_;
  TaskResources res_;
  std::uint64_t seed_;
};

}  // namespace dc::tasks
