#pragma once
// RULER's synthetic tasks (Hsieh et al. 2024, github.com/NVIDIA/RULER, scripts/synthetic.yaml and
// scripts/data/synthetic/*.py), written again from their definitions: the text of one sample at
// a given haystack size, before any chat template or tokenizer. task_prompt.hpp fits the size
// to a token length.
//
// Every task's text is (instruction and context) + (question) + (answer prefix): the split that
// the query-agnostic protocol needs (the question and answer prefix arrive after compression).
//
// Differences from RULER, all deliberate: the essay haystack is Debian's license texts
// (haystack.hpp), word keys are two dictionary words (needles.hpp), sentences are split by a
// simple rule instead of NLTK, every random choice (needle order included, which RULER shuffles
// with a fixed seed) comes from the sample's own stream, the vt in-context example is one per
// sample, and "assgined" in vt's answer prefix is spelt "assigned".
#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/error.hpp"
#include "haystack.hpp"
#include "needles.hpp"
#include "rng.hpp"
#include "scoring.hpp"

namespace dc::tasks {

enum class TaskKind { niah, variable_tracking, common_words, frequent_words };
enum class HaystackType { noise, essay, needle };

struct TaskSpec {
  std::string name;
  TaskKind kind = TaskKind::niah;
  // niah (RULER's type_haystack, type_needle_k/v, num_needle_k/v/q)
  HaystackType haystack = HaystackType::noise;
  NeedleType key_type = NeedleType::words, value_type = NeedleType::numbers;
  int num_keys = 1, num_values = 1, num_queries = 1;
  int max_new_tokens = 128;  // RULER's tokens_to_generate
  Scoring scoring = Scoring::match_all;
  // The haystack size the search starts from: noise groups, essay words, distractor needles,
  // listed words or coded words.
  std::size_t min_size = 1;
};

// The tasks of RULER's synthetic.yaml that need no external data set (qa_1/qa_2 need SQuAD and
// HotpotQA). tokens_to_generate as RULER's constants.py: niah 128, vt 30, cwe 120, fwe 50.
inline const std::vector<TaskSpec>& ruler_tasks() {
  static const std::vector<TaskSpec> tasks = [] {
    using H = HaystackType;
    using N = NeedleType;
    auto niah = [](const char* name, H h, N k, N v, int nk, int nv, int nq) {
      TaskSpec s;
      s.name = name;
      s.haystack = h;
      s.key_type = k;
      s.value_type = v;
      s.num_keys = nk;
      s.num_values = nv;
      s.num_queries = nq;
      s.min_size = h == H::essay ? 16 : 1;
      return s;
    };
    std::vector<TaskSpec> t{
        niah("niah_single_1", H::noise, N::words, N::numbers, 1, 1, 1),
        niah("niah_single_2", H::essay, N::words, N::numbers, 1, 1, 1),
        niah("niah_single_3", H::essay, N::words, N::uuids, 1, 1, 1),
        niah("niah_multikey_1", H::essay, N::words, N::numbers, 4, 1, 1),
        niah("niah_multikey_2", H::needle, N::words, N::numbers, 1, 1, 1),
        niah("niah_multikey_3", H::needle, N::uuids, N::uuids, 1, 1, 1),
        niah("niah_multivalue", H::essay, N::words, N::numbers, 1, 4, 1),
        niah("niah_multiquery", H::essay, N::words, N::numbers, 1, 1, 4),
    };
    TaskSpec vt;
    vt.name = "vt";
    vt.kind = TaskKind::variable_tracking;
    vt.max_new_tokens = 30;
    vt.min_size = 5;  // one noise group per chain statement at least (num_hops 4 + 1)
    TaskSpec cwe;
    cwe.name = "cwe";
    cwe.kind = TaskKind::common_words;
    cwe.max_new_tokens = 120;
    cwe.min_size = 11;  // the 10 common words and at least one uncommon one
    TaskSpec fwe;
    fwe.name = "fwe";
    fwe.kind = TaskKind::frequent_words;
    fwe.max_new_tokens = 50;
    fwe.min_size = 64;  // enough coded words that the 4th most frequent appears at least twice
    t.push_back(vt);
    t.push_back(cwe);
    t.push_back(fwe);
    return t;
  }();
  return tasks;
}

inline const TaskSpec& find_task(std::string_view name) {
  std::string known;
  for (const auto& t : ruler_tasks()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  DC_FAIL("unknown task '", name, "' (known: ", known, ")");
}

// One sample's text. context ends where the question begins (a line break); the prompt is
// context + question + answer prefix.
struct TaskText {
  std::string context;        // instruction, in-context example if any, haystack
  std::string question;       // what is asked
  std::string answer_prefix;  // the start of the answer RULER writes for the model
  std::vector<std::string> answers;
};

// What the generators draw from. essay is needed by the essay-haystack tasks only.
struct TaskResources {
  const WordList* words = nullptr;
  const EssayText* essay = nullptr;
};

namespace detail {

inline std::string niah_needle(NeedleType value_type, const std::string& key, const std::string& value) {
  return std::string("One of the special magic ") + needle_type_name(value_type) + " for " + key + " is: " + value + ".";
}

// "a", "a and b" is never used: RULER writes "a, b, and c" for several keys.
inline std::string join_queries(const std::vector<std::string>& q) {
  if (q.size() == 1) return q[0];
  std::string s;
  for (std::size_t i = 0; i + 1 < q.size(); ++i) s += q[i] + ", ";
  return s + "and " + q.back();
}

// Inserts items into lines at distinct random line indices (each index names the line an item
// goes before; drawn from [0, lines.size()), applied from the largest down so earlier indices
// stay valid), as RULER's repeat/needle haystacks.
inline void insert_at_random_lines(std::vector<std::string>& lines, const std::vector<std::string>& items,
                                   TaskRng& rng) {
  auto at = rng.sample(lines.size(), items.size());
  std::sort(at.begin(), at.end(), std::greater<>());
  for (std::size_t i = 0; i < items.size(); ++i)
    lines.insert(lines.begin() + std::ptrdiff_t(at[i]), items[i]);
}

inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) s += sep;
    s += parts[i];
  }
  return s;
}

inline TaskText niah_text(const TaskSpec& t, std::size_t size, TaskRng& rng, const TaskResources& res) {
  DC_CHECK(res.words != nullptr, "task ", t.name, ": no word list");
  const int num_keys = std::max(t.num_keys, t.num_queries);
  std::vector<std::string> keys, needles;
  std::vector<std::vector<std::string>> values;
  for (int k = 0; k < num_keys; ++k) {
    keys.push_back(random_needle(t.key_type, rng, *res.words));
    values.emplace_back();
    for (int v = 0; v < t.num_values; ++v) {
      values.back().push_back(random_needle(t.value_type, rng, *res.words));
      needles.push_back(niah_needle(t.value_type, keys.back(), values.back().back()));
    }
  }
  rng.shuffle(needles);

  std::string context;
  if (t.haystack == HaystackType::essay) {
    DC_CHECK(res.essay != nullptr, "task ", t.name, ": no essay text for its haystack");
    const auto sentences = split_sentences(res.essay->words(), size);
    // Depths: 40 evenly spaced percentages 0..100, rounded (RULER's DEPTHS); one per needle.
    std::vector<std::size_t> cut;
    for (const std::size_t d : rng.sample(40, needles.size())) {
      const long depth = std::lround(100.0 * double(d) / 39.0);
      cut.push_back(std::size_t(double(sentences.size()) * double(depth) / 100.0));
    }
    std::sort(cut.begin(), cut.end());
    std::vector<std::string> pieces;
    std::size_t from = 0;
    for (std::size_t i = 0; i <= needles.size(); ++i) {
      const std::size_t to = i < needles.size() ? cut[i] : sentences.size();
      std::vector<std::string> span(sentences.begin() + std::ptrdiff_t(from), sentences.begin() + std::ptrdiff_t(to));
      if (!span.empty()) pieces.push_back(join(span, " "));
      if (i < needles.size()) pieces.push_back(needles[i]);
      from = to;
    }
    context = join(pieces, " ");
  } else {
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < size; ++i)
      lines.push_back(t.haystack == HaystackType::noise
                          ? std::string(kNoiseSentences)
                          : niah_needle(t.value_type, random_needle(t.key_type, rng, *res.words),
                                        random_needle(t.value_type, rng, *res.words)));
    insert_at_random_lines(lines, needles, rng);
    context = join(lines, "\n");
  }

  TaskText out;
  std::vector<std::string> queries;
  for (const std::size_t k : rng.sample(std::size_t(num_keys), std::size_t(t.num_queries))) {
    queries.push_back(keys[k]);
    out.answers.insert(out.answers.end(), values[k].begin(), values[k].end());
  }
  const std::string query = join_queries(queries);
  std::string plural = needle_type_name(t.value_type);
  if (t.num_queries * t.num_values == 1) {  // RULER's singular wording for one expected value
    const std::string one = plural.substr(0, plural.size() - 1);
    out.context = "A special magic " + one + " is hidden within the following text. Make sure to memorize it. "
                  "I will quiz you about the " + one + " afterwards.\n" + context + "\n";
    out.question = "What is the special magic " + one + " for " + query + " mentioned in the provided text?";
    out.answer_prefix = " The special magic " + one + " for " + query + " mentioned in the provided text is";
  } else {
    out.context = "Some special magic " + plural + " are hidden within the following text. Make sure to memorize "
                  "it. I will quiz you about the " + plural + " afterwards.\n" + context + "\n";
    out.question = "What are all the special magic " + plural + " for " + query + " mentioned in the provided text?";
    out.answer_prefix = " The special magic " + plural + " for " + query + " mentioned in the provided text are";
  }
  return out;
}

// Variable tracking: one chain "VAR A = 12345", "VAR B = VAR A", ... (4 hops) hidden among
// `size` noise groups; the answer is every variable of the chain.
inline TaskText vt_text(std::size_t size, TaskRng& rng, int name_letters) {
  constexpr int hops = 4;
  std::vector<std::string> names;
  while (names.size() < std::size_t(hops + 1)) {
    std::string v;
    for (int i = 0; i < name_letters; ++i) v += char('A' + rng.below(26));
    if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(v);
  }
  const std::string value = std::to_string(rng.between(10000, 99998));
  std::vector<std::string> chain{"VAR " + names[0] + " = " + value};
  for (int j = 0; j < hops; ++j) chain.push_back("VAR " + names[std::size_t(j) + 1] + " = VAR " + names[std::size_t(j)]);
  std::vector<std::string> lines(size, std::string(kNoiseSentences) + "\n");
  // Positions drawn among the noise groups, in chain order (so the chain reads top to bottom).
  auto at = rng.sample(lines.size(), chain.size());
  std::sort(at.begin(), at.end());
  for (std::size_t j = 0; j < chain.size(); ++j) lines.insert(lines.begin() + std::ptrdiff_t(at[j] + j), chain[j]);
  TaskText out;
  out.context = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n" +
                join(lines, " ") + "\n";
  out.question = "Question: Find all variables that are assigned the value " + value + " in the text above.";
  out.answer_prefix = " Answer: According to the chain(s) of variable assignment in the text above, " +
                      std::to_string(hops + 1) + " variables are assigned the value " + value + ", they are: ";
  out.answers = names;
  return out;
}

// Common words: a numbered list of `size` distinct words, the first 10 repeated `common` times,
// the others `rare` times, shuffled.
inline std::pair<std::string, std::vector<std::string>> cwe_list(std::size_t size, int common, int rare,
                                                                 TaskRng& rng, const WordList& words) {
  const auto picked = rng.sample(words.size(), size);
  std::vector<std::string> list, answers;
  for (std::size_t i = 0; i < picked.size(); ++i) {
    const std::string& w = words.words()[picked[i]];
    if (i < 10) answers.push_back(w);
    for (int r = 0; r < (i < 10 ? common : rare); ++r) list.push_back(w);
  }
  rng.shuffle(list);
  std::string text;
  // Appended piece by piece: GCC 12 reports a false -Wrestrict in `"literal" + std::string&&`
  // (operator+ inserts at 0) when it inlines it, which depends on what else the TU includes.
  for (std::size_t i = 0; i < list.size(); ++i) {
    text += i ? " " : "";
    text += std::to_string(i + 1);
    text += ". ";
    text += list[i];
  }
  return {text, answers};
}

inline TaskText cwe_text(std::size_t size, int length, TaskRng& rng, const TaskResources& res) {
  DC_CHECK(res.words != nullptr, "task cwe: no word list");
  DC_CHECK(size <= res.words->size(), "task cwe: ", size, " distinct words asked, the word list has ",
           res.words->size());
  // RULER's frequencies: below 4096 tokens the example repeats 3/1 and the task 6/1 times, from
  // 4096 on 10/3 and 30/3 (freq_cw, freq_ucw).
  const bool short_prompt = length < 4096;
  const auto [example, example_answers] = cwe_list(short_prompt ? 20 : 40, short_prompt ? 3 : 10,
                                                   short_prompt ? 1 : 3, rng, *res.words);
  const auto [list, answers] = cwe_list(size, short_prompt ? 6 : 30, short_prompt ? 1 : 3, rng, *res.words);
  const std::string intro = "Below is a numbered list of words. In these words, some appear more often than "
                            "others. Memorize the ones that appear most often.\n";
  const std::string question = "Question: What are the 10 most common words in the above list?";
  const std::string prefix = " Answer: The top 10 words that appear most often in the list are:";
  std::string solved;
  for (std::size_t i = 0; i < example_answers.size(); ++i) {  // piece by piece: see cwe_list
    solved += " ";
    solved += std::to_string(i + 1);
    solved += ". ";
    solved += example_answers[i];
  }
  TaskText out;
  out.context = intro + example + "\n" + question + prefix + solved + "\n" + intro + list + "\n";
  out.question = question;
  out.answer_prefix = prefix;
  out.answers = answers;
  return out;
}

// Frequent words: `size` coded words drawn with Zipf frequencies (exponent 2) over a made-up
// vocabulary of 6-letter words; the most frequent is replaced by "..." (noise) and the answer
// is the next three.
inline TaskText fwe_text(std::size_t size, int length, TaskRng& rng) {
  const std::size_t vocab_size = std::size_t(std::max(length / 50, 8));  // RULER: max_seq_length // 50
  std::vector<std::string> vocab;
  while (vocab.size() < vocab_size) {
    std::string w;
    for (int i = 0; i < 6; ++i) w += char('a' + rng.below(26));
    if (std::find(vocab.begin(), vocab.end(), w) == vocab.end()) vocab.push_back(w);
  }
  vocab[0] = "...";
  const double zeta2 = std::numbers::pi * std::numbers::pi / 6.0;  // zeta(2)
  std::vector<std::string> text_words;
  for (std::size_t k = 1; k <= vocab.size(); ++k) {
    const auto count = std::size_t(double(size) / (double(k) * double(k)) / zeta2);
    for (std::size_t c = 0; c < count; ++c) text_words.push_back(vocab[k - 1]);
  }
  rng.shuffle(text_words);
  TaskText out;
  out.context = "Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. " + join(text_words, " ") + "\n";
  out.question = "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                 "most frequently appeared words in the above coded text?";
  out.answer_prefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
  out.answers = {vocab[1], vocab[2], vocab[3]};
  return out;
}

}  // namespace detail

// The text of one sample of `task` with a haystack of `size`, for a target of `length` tokens
// (cwe and fwe scale their word frequencies and vocabulary with it, as RULER does).
inline TaskText make_task_text(const TaskSpec& task, std::size_t size, int length, TaskRng& rng,
                               const TaskResources& res) {
  switch (task.kind) {
    case TaskKind::niah: return detail::niah_text(task, size, rng, res);
    case TaskKind::variable_tracking: return detail::vt_text(size, rng, 5);
    case TaskKind::common_words: return detail::cwe_text(size, length, rng, res);
    case TaskKind::frequent_words: return detail::fwe_text(size, length, rng);
  }
  DC_FAIL("task ", task.name, ": unknown kind");
}

}  // namespace dc::tasks
