// RULER-style tasks (eval/tasks/, eval/task_suite.hpp): prompts are determined by the seed, hold
// their needles, fit their length; scoring follows RULER's definition; the Wilson interval; the
// two protocols' prompt parts; and the whole suite on the tiny model.
//
// Most cases use a byte-level tokenizer (one token per byte, plus ChatML's two special tokens)
// and a small built-in word list and essay, so they need no installed file. The cases marked
// "SmolLM2" use the real tokenizer and chat template when the GGUF is present (label model not
// needed: they skip with a message otherwise).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/eval/task_suite.hpp>

#include "../support/byte_tokenizer.hpp"
#include "../support/smollm2_path.hpp"

namespace {

namespace t = dc::tasks;

using dc_test::byte_tokenizer;

const t::WordList& test_words() {
  static const t::WordList words = t::WordList::from_words(
      {"apple", "river", "stone", "candle", "forest", "window", "garden", "silver", "harbor", "meadow", "pencil",
       "basket", "thunder", "lantern", "marble", "copper", "velvet", "island", "mirror", "saddle", "violin", "anchor",
       "blanket", "canyon", "falcon", "glacier", "hammer", "jacket", "kettle", "lemon", "magnet", "nectar", "orchid",
       "pepper", "quartz", "rocket", "sparrow", "tunnel", "walnut", "zipper", "Proper", "it's", "ox"});
  return words;
}

// 1000 made-up words of three syllables ("bakelo", ...): enough distinct words for cwe's lists.
const t::WordList& many_words() {
  static const t::WordList words = [] {
    const char* syllables[] = {"ba", "ke", "lo", "mi", "ru", "sa", "te", "vo", "ni", "du"};
    std::vector<std::string> w;
    for (const char* a : syllables)
      for (const char* b : syllables)
        for (const char* c : syllables) w.push_back(std::string(a) + b + c);
    return t::WordList::from_words(std::move(w));
  }();
  return words;
}

// A made-up paragraph (about 130 words), repeated: the essay haystack of the tests.
const t::EssayText& test_essay() {
  static const t::EssayText essay = [] {
    const std::string paragraph =
        "A package in the archive is built from its source by the autobuilders. Each upload is checked before it "
        "reaches the mirrors! The maintainer answers the bug reports, and the release team decides what enters the "
        "next stable release. Why does this take so long? Because every architecture has to build the same source, "
        "and a failure on one of them holds the others back. Translators work on the descriptions of packages while "
        "the documentation team keeps the manuals current. Security updates follow their own path to the users. "
        "(Backports are a separate service.) A freeze stops new features, and only fixes for serious problems are "
        "accepted afterwards. ";
    std::string text;
    for (int i = 0; i < 40; ++i) text += paragraph;
    return t::EssayText::from_text(text);
  }();
  return essay;
}

t::TaskResources test_resources() { return {&test_words(), &test_essay()}; }
t::TaskResources many_word_resources() { return {&many_words(), &test_essay()}; }

// The key a NIAH question asks about: between "for " and " mentioned".
std::string queried_key(const t::TaskPrompt& p) {
  const auto at = p.question_text.find(" for ") + 5;
  return p.question_text.substr(at, p.question_text.find(" mentioned") - at);
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("Wilson interval: closed-form values") {
  // 8 of 10: the textbook example, [0.490, 0.943].
  const dc::Interval a = dc::wilson_interval(8, 10);
  CHECK(a.lo == doctest::Approx(0.4902).epsilon(1e-3));
  CHECK(a.hi == doctest::Approx(0.9433).epsilon(1e-3));
  // 0 of n: the interval is [0, z^2 / (n + z^2)]; n of n its mirror image.
  const double z2 = 1.959963984540054 * 1.959963984540054;
  const dc::Interval none = dc::wilson_interval(0, 5), all = dc::wilson_interval(5, 5);
  CHECK(none.lo == doctest::Approx(0.0));
  CHECK(none.hi == doctest::Approx(z2 / (5 + z2)));
  CHECK(all.lo == doctest::Approx(5 / (5 + z2)));
  CHECK(all.hi == doctest::Approx(1.0));
  // Symmetric around 1/2 for half the trials.
  const dc::Interval half = dc::wilson_interval(10, 20);
  CHECK(half.lo + half.hi == doctest::Approx(1.0));
  CHECK_THROWS_WITH_AS(dc::wilson_interval(3, 2), doctest::Contains("3 successes of 2 trials"), dc::Error);
  CHECK_THROWS_AS(dc::wilson_interval(0, 0), dc::Error);
}

TEST_CASE("scoring follows RULER: case-insensitive substrings, control characters, partial credit") {
  using t::Scoring;
  const std::vector<std::string> one{"4829173"};
  CHECK(t::score_output(" 4829173.", one, Scoring::match_all) == 1.0);
  CHECK(t::score_output("482", one, Scoring::match_all) == 0.0);       // a prefix is not the value
  CHECK(t::score_output("", one, Scoring::match_all) == 0.0);
  CHECK(t::score_output("Ancient-HARBOR", {"ancient-harbor"}, Scoring::match_all) == 1.0);
  // A control character becomes a line break (RULER's postprocess_pred): it splits a value...
  CHECK(t::score_output("48\x01" "29173", one, Scoring::match_all) == 0.0);
  // ...and around the answer it is trimmed away.
  CHECK(t::clean_output("\x02 4829173\x1f\n") == "4829173");
  CHECK(t::score_output("\x02" "4829173\x03", one, Scoring::match_all) == 1.0);
  // Several expected strings: string_match_all is the fraction found, string_match_part any.
  const std::vector<std::string> four{"1111111", "2222222", "3333333", "4444444"};
  const std::string two_found = "The numbers are 2222222 and 4444444.";
  CHECK(t::score_output(two_found, four, Scoring::match_all) == 0.5);
  CHECK(t::score_output(two_found, four, Scoring::match_part) == 1.0);
  CHECK(t::score_output("none of them", four, Scoring::match_part) == 0.0);
  CHECK(t::score_output("1111111 2222222 3333333 4444444", four, Scoring::match_all) == 1.0);
}

TEST_CASE("the random streams are portable and keyed by (seed, task, length, sample)") {
  t::TaskRng a(7, "niah_single_1", 1024, 0), b(7, "niah_single_1", 1024, 0), c(7, "niah_single_1", 1024, 1);
  const auto x = a.bits();
  CHECK(x == b.bits());
  CHECK(x != c.bits());
  // below(n) stays in range and reaches every value.
  t::TaskRng r(1);
  std::vector<int> seen(7, 0);
  for (int i = 0; i < 700; ++i) ++seen[std::size_t(r.below(7))];
  for (int s : seen) CHECK(s > 50);
  const auto picks = r.sample(10, 10);
  CHECK(std::set<std::size_t>(picks.begin(), picks.end()).size() == 10);
  // UUIDs are version 4, variant 10xx.
  const std::string u = t::random_uuid(r);
  REQUIRE(u.size() == 36);
  CHECK(u[14] == '4');
  CHECK(std::string("89ab").find(u[19]) != std::string::npos);
  const std::string n = t::random_number(r);
  CHECK(n.size() == 7);
  CHECK(n[0] != '0');
}

TEST_CASE("word list: plain lowercase words only, too few is an error") {
  CHECK(test_words().size() == 40);  // "Proper", "it's" and "ox" are left out
  CHECK(std::is_sorted(test_words().words().begin(), test_words().words().end()));
  CHECK_THROWS_WITH_AS(t::WordList::from_words({"alpha", "beta"}), doctest::Contains("at least 16"), dc::Error);
  CHECK_THROWS_WITH_AS(t::WordList::from_file("/nonexistent/words"), doctest::Contains("cannot be read"), dc::Error);
}

TEST_CASE("chat templates: ChatML recognised with its default system turn, others refused") {
  // SmolLM2-135M-Instruct's tokenizer.chat_template, as its GGUF stores it.
  const std::string smollm2 =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const t::ChatTemplate chat = t::ChatTemplate::from_jinja(smollm2);
  CHECK(chat.format == t::ChatFormat::chatml);
  CHECK(chat.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  CHECK(chat.user_prefix() + "Hi" + chat.assistant_start(" The answer is") ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is");
  // A template that takes the system turn from the messages has no default.
  CHECK(t::ChatTemplate::from_jinja("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
                                    "'<|im_end|>\n'}}{% endfor %}{{ '<|im_start|>assistant\n' }}")
            .default_system.empty());
  const t::ChatTemplate raw;
  CHECK(raw.user_prefix() + "Hi" + raw.assistant_start(" The answer is") == "Hi The answer is");
  CHECK_THROWS_WITH_AS(t::ChatTemplate::from_jinja("{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]"),
                       doctest::Contains("chat template not supported"), dc::Error);
  CHECK_THROWS_WITH_AS(t::ChatTemplate::from_jinja(""), doctest::Contains("--chat-template none"), dc::Error);
}

TEST_CASE("every task: same seed same prompt, fitted to its length, parts concatenate") {
  const dc::Tokenizer tok = byte_tokenizer(true);
  t::ChatTemplate chat;
  chat.format = t::ChatFormat::chatml;
  const t::TaskPromptBuilder builder(tok, chat, many_word_resources(), 42),
      other_seed(tok, chat, many_word_resources(), 43);
  for (const t::TaskSpec& task : t::ruler_tasks()) {
    CAPTURE(task.name);
    const int length = 2048;
    const t::TaskPrompt p = builder.build(task, length, 0);
    CHECK(p.full_prompt() == builder.build(task, length, 0).full_prompt());
    CHECK(p.full_prompt() != other_seed.build(task, length, 0).full_prompt());
    CHECK(p.full_prompt() != builder.build(task, length, 1).full_prompt());
    // Fitted: prompt + output budget within the length, and one more haystack unit is too many.
    CHECK(p.prompt_tokens() + p.max_new_tokens <= length);
    const t::TaskPrompt bigger = builder.render(task, length, 0, p.haystack_size + 1);
    CHECK(bigger.prompt_tokens() + bigger.max_new_tokens > length);
    // The query-aware prompt is the two parts back to back, and decodes to the two texts.
    std::vector<std::int32_t> joined = p.context;
    joined.insert(joined.end(), p.question.begin(), p.question.end());
    CHECK(p.full_prompt() == joined);
    CHECK(tok.decode(p.full_prompt()) == p.context_text + p.question_text);
    CHECK(p.context.front() == tok.token_id("<|im_start|>"));
    CHECK(std::count(p.question.begin(), p.question.end(), tok.token_id("<|im_end|>")) == 1);
    CHECK(p.context_text.find(p.question_text) == std::string::npos);
    CHECK(!p.answers.empty());
    CHECK(p.max_new_tokens == (task.kind == t::TaskKind::niah ? 128
                               : task.kind == t::TaskKind::variable_tracking ? 30
                               : task.kind == t::TaskKind::common_words ? 120 : 50));
  }
}

TEST_CASE("the needles are in the prompt and the answers are their values") {
  const dc::Tokenizer tok = byte_tokenizer(false);
  const t::TaskPromptBuilder builder(tok, t::ChatTemplate{}, test_resources(), 5);
  for (const t::TaskSpec& task : t::ruler_tasks()) {
    if (task.kind != t::TaskKind::niah) continue;
    CAPTURE(task.name);
    for (int sample = 0; sample < 3; ++sample) {
      const t::TaskPrompt p = builder.build(task, 3000, sample);
      const std::string type = t::needle_type_name(task.value_type);
      REQUIRE(p.answers.size() == std::size_t(task.num_values * task.num_queries));
      // Each queried key (several for multiquery: "a, b, c, and d") has its needles, whose values
      // are the expected answers in order.
      std::string keys = queried_key(p);
      std::vector<std::string> split;
      for (std::size_t at; (at = keys.find(", ")) != std::string::npos; keys.erase(0, at + 2))
        split.push_back(keys.substr(0, at));
      if (keys.rfind("and ", 0) == 0) keys.erase(0, 4);
      split.push_back(keys);
      REQUIRE(split.size() == std::size_t(task.num_queries));
      for (std::size_t a = 0; a < p.answers.size(); ++a) {
        const std::string& key = split[a / std::size_t(task.num_values)];
        const std::string needle = "One of the special magic " + type + " for " + key + " is: " + p.answers[a] + ".";
        CHECK_MESSAGE(count_of(p.context_text, needle) == 1, needle);
        CHECK(p.question_text.find(key) != std::string::npos);
      }
      // The distractors of the multi-key tasks are needles for other keys.
      const std::size_t needles = count_of(p.context_text, "One of the special magic " + type + " for ");
      if (task.haystack == t::HaystackType::needle) CHECK(needles > p.answers.size() + 3);
      else CHECK(needles == std::size_t(std::max(task.num_keys, task.num_queries) * task.num_values));
      // The haystack is what the task says it is.
      if (task.haystack == t::HaystackType::noise) CHECK(count_of(p.context_text, "The grass is green.") > 3);
      if (task.haystack == t::HaystackType::essay) CHECK(count_of(p.context_text, "autobuilders") > 0);
    }
  }
}

TEST_CASE("vt, cwe and fwe: the answers are what the text implies") {
  const dc::Tokenizer tok = byte_tokenizer(false);
  const t::TaskPromptBuilder builder(tok, t::ChatTemplate{}, test_resources(), 9);

  // vt: the chain is in the text, starting at the value the question asks about.
  const t::TaskPrompt vt = builder.build(t::find_task("vt"), 3000, 0);
  REQUIRE(vt.answers.size() == 5);
  const auto value_at = vt.question_text.find("value ") + 6;
  const std::string value = vt.question_text.substr(value_at, 5);
  CHECK(count_of(vt.context_text, "VAR " + vt.answers[0] + " = " + value) == 1);
  for (std::size_t i = 1; i < 5; ++i)
    CHECK(count_of(vt.context_text, "VAR " + vt.answers[i] + " = VAR " + vt.answers[i - 1]) == 1);
  CHECK(count_of(vt.context_text, "Memorize and track") == 2);  // the solved example, then the task

  // cwe: in the task's list (after the solved example) each answer is more frequent than any
  // other word.
  const t::TaskPromptBuilder cwe_builder(tok, t::ChatTemplate{}, many_word_resources(), 9);
  const t::TaskPrompt cwe = cwe_builder.build(t::find_task("cwe"), 8192, 0);
  const std::string list = cwe.context_text.substr(cwe.context_text.rfind("appear most often.\n"));
  std::map<std::string, int> counts;
  std::istringstream words(list);
  for (std::string w; words >> w;)
    if (std::binary_search(many_words().words().begin(), many_words().words().end(), w)) ++counts[w];
  REQUIRE(cwe.answers.size() == 10);
  int least_answer = 1 << 30, most_other = 0;
  for (const auto& [w, n] : counts) {
    if (std::find(cwe.answers.begin(), cwe.answers.end(), w) != cwe.answers.end()) least_answer = std::min(least_answer, n);
    else most_other = std::max(most_other, n);
  }
  CHECK(least_answer == 30);  // RULER's freq_cw from 4096 tokens on
  CHECK(most_other == 3);     // freq_ucw

  // fwe: after the "..." noise word the answers are the three most frequent, in order.
  const t::TaskPrompt fwe = builder.build(t::find_task("fwe"), 3000, 0);
  REQUIRE(fwe.answers.size() == 3);
  const std::string coded = fwe.context_text.substr(0, fwe.context_text.find('\n'));
  std::map<std::string, int> freq;
  std::istringstream in(coded.substr(coded.find("coded words. ") + 13));
  for (std::string w; in >> w;) ++freq[w];
  CHECK(freq["..."] > freq[fwe.answers[0]]);
  CHECK(freq[fwe.answers[0]] > freq[fwe.answers[1]]);
  CHECK(freq[fwe.answers[1]] > freq[fwe.answers[2]]);
  for (const auto& [w, n] : freq)
    if (w != "..." && std::find(fwe.answers.begin(), fwe.answers.end(), w) == fwe.answers.end())
      CHECK(n < freq[fwe.answers[2]]);
}

TEST_CASE("bad task input: unknown task, a length too short, protocol names") {
  CHECK_THROWS_WITH_AS(t::find_task("niah_single_9"), doctest::Contains("unknown task 'niah_single_9' (known: "
                                                                        "niah_single_1,"), dc::Error);
  const dc::Tokenizer tok = byte_tokenizer(false);
  const t::TaskPromptBuilder builder(tok, t::ChatTemplate{}, test_resources(), 0);
  CHECK_THROWS_WITH_AS(builder.build(t::find_task("niah_single_1"), 200, 0),
                       doctest::Contains("length 200 is too short for task niah_single_1"), dc::Error);
  CHECK(dc::parse_protocol("query-aware") == dc::TaskProtocol::query_aware);
  CHECK(dc::parse_protocol("query-agnostic") == dc::TaskProtocol::query_agnostic);
  CHECK_THROWS_WITH_AS(dc::parse_protocol("aware"), doctest::Contains("unknown protocol 'aware'"), dc::Error);
  const t::TaskPromptBuilder no_essay(tok, t::ChatTemplate{}, {&test_words(), nullptr}, 0);
  CHECK_THROWS_WITH_AS(no_essay.build(t::find_task("niah_single_2"), 2000, 0), doctest::Contains("no essay text"),
                       dc::Error);
}

TEST_CASE("task report: answers identical to the teacher's and the score gap, per student") {
  // Two students over three samples of one cell, the answers and scores chosen so that the
  // counts differ from the accuracies: student 0 answers as the teacher on samples 0 and 2
  // (scoring as it) and differently on sample 1 with the same score; student 1 never answers as
  // the teacher, scoring 1 where it scored 0 and 0.5 where it scored 1.
  t::TaskPrompt p;
  p.task = "fwe";
  p.length = 1024;
  p.context = {1, 2, 3};
  const std::vector<dc::TaskSampleResult> samples = {
      {"cat dog", 1.0, {"cat dog", "cat"}, {1.0, 0.5}},
      {"emu", 0.0, {"owl", "yak"}, {0.0, 1.0}},
      {"fox", 1.0, {"fox", "Fox"}, {1.0, 0.5}},
  };
  dc::TaskScores scores;
  for (const auto& r : samples) scores.add(p, r);
  const auto rows = dc::task_report(scores, {"a", "b"}, {"head", "head"}, {0.25});
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].accuracy == doctest::Approx(2.0 / 3.0));
  CHECK(rows[1].accuracy == doctest::Approx(2.0 / 3.0));  // as accurate as the first, never the teacher's answer
  CHECK(rows[0].same_as_full == doctest::Approx(2.0 / 3.0));
  CHECK(rows[1].same_as_full == 0.0);
  CHECK(rows[0].score_gap == 0.0);
  CHECK(rows[1].score_gap == doctest::Approx((0.5 + 1.0 + 0.5) / 3.0));
  const dc::Interval w = dc::wilson_interval(2.0, 3.0);
  CHECK(rows[0].same_interval.lo == w.lo);
  CHECK(rows[0].same_interval.hi == w.hi);
  CHECK(rows[1].same_interval.lo == 0.0);
  CHECK(rows[1].same_interval.hi > 0.0);  // Wilson's interval is not empty at 0 of 3
  std::ostringstream csv;
  dc::write_task_csv(csv, rows, dc::TaskProtocol::query_aware);
  const std::string text = csv.str();
  const std::string header = text.substr(0, text.find('\n'));
  const std::string added = "same_as_full,same_as_full_lo,same_as_full_hi,score_gap";
  CHECK(header.substr(header.size() - added.size()) == added);
  // The second row ends with student 1's share (0), its interval and its gap.
  const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  CHECK(last.find(",0,0,") != std::string::npos);
  dc::TaskSampleResult short_answers = samples[0];
  short_answers.outputs.pop_back();
  CHECK_THROWS_WITH_AS(scores.add(p, short_answers), doctest::Contains("1 answers for 2 scores"), dc::Error);
}

TEST_CASE("the suite on the tiny model: the full-cache student answers as the teacher") {
  dc::HfModel m = dc::load_hf_model(std::string(DC_FIXTURE_DIR) + "/tiny_mistral");
  m.config.max_position = 2048;  // random weights and RoPE: any position works; bytes need room
  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  const dc::Tokenizer tok = byte_tokenizer(false);  // 256 ids, the tiny model's vocabulary
  const t::TaskPromptBuilder builder(tok, t::ChatTemplate{}, test_resources(), 3);
  auto full = dc::make_baseline_policy("full"), streaming = dc::make_baseline_policy("streaming"),
       h2o = dc::make_baseline_policy("h2o");
  for (const auto protocol : {dc::TaskProtocol::query_aware, dc::TaskProtocol::query_agnostic}) {
    CAPTURE(dc::protocol_name(protocol));
    dc::TaskSuite<dc::cpu, float> suite(model, tok, {full.get(), streaming.get(), h2o.get()},
                                        {dc::Budget::of_fraction(0.5)}, dc::EvictionMode::prefill,
                                        {dc::Granularity::shared, dc::Granularity::head}, protocol);
    suite.set_max_batch(4);  // the teacher and 6 students run in two batches
    dc::TaskScores scores;
    std::vector<std::size_t> started;
    std::map<std::size_t, std::size_t> kept;  // student -> rows its layer 0, KV head 0 kept (eval --keep-sets)
    suite.on_compressed([&](std::size_t s, const dc::KVCache<dc::cpu>& cache) {
      CHECK(kept.count(s) == 0);
      kept[s] = cache.host_positions(0, 0).size();
    });
    for (int sample = 0; sample < 1; ++sample) {
      t::TaskPrompt p = builder.build(t::find_task("niah_single_1"), 640, sample);
      // 24 answer tokens instead of 128: the suite's logic is the same, and every decode step of
      // 7 decoders costs OpenMP barriers that a loaded 2-core machine (or ASan) makes slow.
      p.max_new_tokens = 24;
      const dc::TaskSampleResult r = suite.run(p, [&](std::size_t i) { started.push_back(i); });
      REQUIRE(r.outputs.size() == 6);
      // Every student's cache was shown once, compressed: the full cache keeps the whole
      // compressed prompt, the others the budget's half of it.
      const std::size_t compressed =
          protocol == dc::TaskProtocol::query_aware ? p.full_prompt().size() : p.context.size();
      const std::size_t half = std::size_t(dc::Budget::of_fraction(0.5).resolve(int(compressed)));
      CHECK(half < compressed);
      REQUIRE(kept.size() == 6);
      for (std::size_t g = 0; g < 2; ++g) {
        CHECK(kept[suite.index(0, g, 0)] == compressed);
        for (std::size_t pol = 1; pol < 3; ++pol) CHECK(kept[suite.index(pol, g, 0)] == half);
      }
      for (std::size_t g = 0; g < 2; ++g) {
        CHECK(r.outputs[suite.index(0, g, 0)] == r.teacher_output);
        CHECK(r.scores[suite.index(0, g, 0)] == r.teacher_score);
      }
      // Nothing stops the random model early: every answer is the output budget long (one byte a
      // token).
      CHECK(r.teacher_output.size() == 24);
      for (double s : r.scores) CHECK((s >= 0.0 && s <= 1.0));
      scores.add(p, r);
    }
    CHECK(started.size() == 6);
    REQUIRE(scores.cells().size() == 1);
    CHECK(scores.cells()[0].samples == 1);
    const auto rows = dc::task_report(scores, {"full", "streaming", "h2o"},
                                      {"shared", "head", "shared", "head", "shared", "head"}, {0.5});
    REQUIRE(rows.size() == 6);
    CHECK(rows[0].accuracy == rows[0].full_accuracy);
    for (std::size_t g = 0; g < 2; ++g) {  // the full cache's students answer as the teacher
      CHECK(rows[g].same_as_full == 1.0);
      CHECK(rows[g].score_gap == 0.0);
    }
    std::ostringstream csv, md;
    dc::write_task_csv(csv, rows, protocol);
    dc::write_task_markdown(md, rows, protocol);
    CHECK(count_of(csv.str(), "\n") == 7);
    CHECK(count_of(md.str(), "\n") == 8);
  }
}

TEST_CASE("SmolLM2: ChatML from the GGUF, prompts fitted with its tokenizer") {
  const auto path = dc_test::smollm2_gguf_path();
  if (!std::filesystem::exists(path)) {
    MESSAGE("skipped: no SmolLM2 GGUF at ", path.string(), " (set DC_SMOLLM2_GGUF or run scripts/fetch_model.sh)");
    return;
  }
  const dc::GgufFile file(path);
  const dc::Tokenizer tok(dc::tokenizer_data_from_gguf(file));
  const t::ChatTemplate chat = t::ChatTemplate::from_choice("auto", file);
  CHECK(chat.format == t::ChatFormat::chatml);
  CHECK(chat.default_system.find("SmolLM") != std::string::npos);
  const t::TaskPromptBuilder builder(tok, chat, test_resources(), 0);
  for (const std::string name : {"niah_single_1", "niah_multikey_3", "vt", "fwe"}) {
    CAPTURE(name);
    for (const int length : {1024, 2048}) {
      const t::TaskPrompt p = builder.build(t::find_task(name), length, 0);
      CHECK(p.prompt_tokens() + p.max_new_tokens <= length);
      // ...and not much shorter: within two haystack units (a UUID needle is about 60 tokens).
      CHECK(p.prompt_tokens() + p.max_new_tokens > length - 128);
      // The parts split at a line break, so they tokenize as the whole text does.
      const auto whole = tok.encode(p.context_text + p.question_text);
      CHECK(whole == p.full_prompt());
      if (whole != p.full_prompt()) {
        std::size_t i = 0;
        while (i < whole.size() && whole[i] == p.full_prompt()[i]) ++i;
        MESSAGE("first difference at ", i, " of ", whole.size(), ": ", tok.decode(std::span(whole).subspan(i > 3 ? i - 3 : 0, 6)), " | context ", p.context.size(), " size ", p.haystack_size);
      }
    }
  }
}
