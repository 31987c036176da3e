#pragma once
// Training contexts from RULER-style task samples (eval/tasks/), for a policy that must keep what
// a question asks for as well as what a text continuation reads.
//
// The prompt is the query-aware one (context and question compressed together, as the task
// suite's query-aware protocol compresses it); the continuation is the full-cache model's own
// greedy answer, up to and including its stop token, at most max_tokens. The reward is then the
// KL over the teacher's answer: a student that lost the needle spreads its mass over other digits
// or words, one that kept it agrees. The answer's first token is predicted from the prompt's own
// logits, the same for every student, so it carries no reward (as step 0 of a text window); the
// tokens after it do. Whether the teacher's answer is right does not matter: the students are
// distilled towards the teacher, not towards the expected strings.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../eval/tasks/scoring.hpp"
#include "../eval/tasks/task_prompt.hpp"
#include "../model/sampling.hpp"
#include "../model/transformer.hpp"
#include "trainer.hpp"

namespace dc {

// The teacher's greedy answer to one task prompt, with the full cache: at most max_tokens tokens,
// ending at the first stop token (kept, so the students also learn where the answer ends). An
// answer of one token is extended by the token the teacher predicts after it, so that every
// context has a step whose logits an eviction can change.
template <Backend B, class W>
TrainingContext task_training_context(Transformer<B, W>& model, const tasks::TaskPrompt& prompt,
                                      std::span<const std::int32_t> stop_tokens, int max_tokens) {
  DC_CHECK(max_tokens >= 2, "task training context: ", max_tokens, " answer tokens; need at least 2");
  TrainingContext c;
  c.kind = "task";
  c.prompt = prompt.full_prompt();
  const int n = int(c.prompt.size());
  DC_CHECK(n > 0, "task training context: sample ", prompt.sample, " of ", prompt.task, " has an empty prompt");
  DC_CHECK(std::int64_t(n) + max_tokens <= model.config().max_position, "task ", prompt.task, ": prompt of ", n,
           " tokens + ", max_tokens, " answer tokens exceed the model's context of ", model.config().max_position);
  auto cache = model.make_cache(n + max_tokens);
  cache.disable_statistics();
  std::vector<float> logits = model.forward(c.prompt, cache);
  bool last = false;  // a one-token answer takes one more
  while (int(c.continuation.size()) < max_tokens) {
    const std::int32_t next = argmax(logits);
    c.continuation.push_back(next);
    if (last) break;
    if (std::find(stop_tokens.begin(), stop_tokens.end(), next) != stop_tokens.end()) {
      if (c.continuation.size() >= 2) break;
      last = true;
    }
    if (int(c.continuation.size()) < max_tokens)
      model.forward(std::span<const std::int32_t>(&c.continuation.back(), 1), cache, std::span<float>(logits));
  }
  return c;
}

// The task suite's score of the teacher's answer in a task context (eval/task_suite.hpp scores
// an answer the same way: the ids before the first stop token, decoded, RULER's match). The
// trainer can then keep only the prompts the full cache answers right (examples/train
// --task-solved-only): there the KL towards the teacher also pulls towards the expected answer,
// while on a prompt the teacher gets wrong it rewards keeping whatever misled the teacher.
inline double teacher_answer_score(const Tokenizer& tokenizer, const tasks::TaskPrompt& prompt,
                                   const TrainingContext& context, std::span<const std::int32_t> stop_tokens) {
  const auto& answer = context.continuation;
  const auto end = std::find_first_of(answer.begin(), answer.end(), stop_tokens.begin(), stop_tokens.end());
  const std::string text = tokenizer.decode(std::span<const std::int32_t>(answer.data(), std::size_t(end - answer.begin())));
  return tasks::score_output(text, prompt.answers, prompt.scoring);
}

// Interleaves two lists of contexts one by one (a, b, a, b, ...), the longer one's rest at the
// end: the trainer walks its contexts in order, so every stretch of updates sees both kinds.
inline std::vector<TrainingContext> interleave_contexts(std::vector<TrainingContext> a,
                                                        std::vector<TrainingContext> b) {
  std::vector<TrainingContext> out;
  out.reserve(a.size() + b.size());
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size()) out.push_back(std::move(a[i]));
    if (i < b.size()) out.push_back(std::move(b[i]));
  }
  return out;
}

}  // namespace dc
