// examples/eval: how faithful is an evicted KV cache to the full one, on real text?
//
// For every context (L prompt tokens + T continuation tokens from the text), prefills the prompt,
// compresses it to each budget with each policy, teacher-forces the continuation (evicting during
// decoding too in --mode decode) and compares every step with the full-cache run. One CSV row per
// (policy, budget): KL(full || evicted) in nats, top-1 agreement, perplexity ratio.
//
//   eval --model SmolLM2-135M-Instruct.Q4_1.gguf --text /usr/share/vim/vim90/doc
//        --context 1024 --continuation 32 --budget 0.125,0.25,0.5 --policy streaming,h2o --csv out.csv
//
// With --task, accuracy on RULER-style tasks instead (eval/task_suite.hpp): every sample's
// prompt is prefilled once, compressed for each student, answered greedily and scored; one row
// per (task, length, policy, granularity, budget) with its accuracy, the full cache's, and the
// ratio, with 95 % Wilson intervals (markdown on stdout, --csv, --answers for every answer,
// --task-prompts for every prompt's token ids, expected answers, output budget and stop tokens).
//
//   eval --model SmolLM2-135M-Instruct.Q4_1.gguf --task niah_single_1,vt --lengths 1024,2048
//        --samples 5 --policy full,h2o,snapkv,streaming --budget 0.25 --mode prefill
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>

#include <distillcache/distillcache.hpp>

#include "../common/cli.hpp"
#include "../common/weights.hpp"

namespace {

// --keep-sets: every student's kept positions right after the prompt's compression, one row per
// (student, context, layer, KV head). With --text a context is a window; with --task it is a
// prompt, numbered in the order of --task-prompts.
class KeepSetCsv {
 public:
  explicit KeepSetCsv(const std::string& path) : path_(path) {
    if (path.empty()) return;
    out_.open(path);
    DC_CHECK(out_, "--keep-sets: cannot write '", path, "'");
    out_ << "policy,granularity,budget,context,layer,kv_head,positions\n";
  }
  bool enabled() const { return out_.is_open(); }
  void write(const std::string& policy, std::string_view granularity, double budget, std::size_t context,
             const dc::KVCache<dc::cpu>& cache) {
    for (int l = 0; l < cache.num_layers(); ++l)
      for (int h = 0; h < cache.num_kv_heads(); ++h) {
        out_ << policy << ',' << granularity << ',' << budget << ',' << context << ',' << l << ',' << h << ',';
        const char* sep = "";
        for (const auto pos : cache.host_positions(l, h)) {
          out_ << sep << pos;
          sep = " ";
        }
        out_ << '\n';
      }
  }
  void close() {
    if (!out_.is_open()) return;
    out_.close();
    DC_CHECK(out_, "--keep-sets: writing '", path_, "' failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

double parse_fraction(const std::string& s) {
  const auto v = dc_examples::detail::to_number(s);
  DC_CHECK(v.has_value(), "--budget: '", s, "' is not a number");
  return *v;
}

// --task: the RULER-style suite. Every prompt is built (and so every task, length and input file
// checked) before the first model call.
template <class W>
int run_tasks(dc::Transformer<dc::cpu, W>& model, const dc::Tokenizer& tokenizer, const dc::GgufFile& file,
              const std::vector<std::string>& task_names, const std::vector<int>& lengths, int samples,
              const std::vector<std::string>& policy_names, const std::vector<dc::EvictionPolicy*>& policies,
              const std::vector<dc::Budget>& budgets, const std::vector<double>& fractions,
              const std::vector<dc::Granularity>& granularities, dc::EvictionMode mode, dc::TaskProtocol protocol,
              const std::string& chat_choice, const std::string& words_path, const std::string& haystack_path,
              std::uint64_t seed, int batch, const std::string& csv_path, const std::string& answers_path,
              const std::string& prompts_path, const std::string& keep_sets_path) {
  using namespace dc_examples;
  namespace t = dc::tasks;
  std::vector<const t::TaskSpec*> tasks;
  bool needs_essay = false, needs_words = false;
  for (const auto& name : task_names) {
    tasks.push_back(&t::find_task(name));
    needs_essay |= tasks.back()->kind == t::TaskKind::niah && tasks.back()->haystack == t::HaystackType::essay;
    needs_words |= tasks.back()->kind == t::TaskKind::niah || tasks.back()->kind == t::TaskKind::common_words;
  }
  for (const int length : lengths)
    DC_CHECK(length <= model.config().max_position, "--lengths: ", length, " exceeds the model's context of ",
             model.config().max_position);
  const t::ChatTemplate chat = t::ChatTemplate::from_choice(chat_choice, file);
  std::optional<t::WordList> words;
  std::optional<t::EssayText> essay;
  if (needs_words) words = t::WordList::from_file(words_path);
  if (needs_essay) essay = t::EssayText::from_path(haystack_path);
  const t::TaskPromptBuilder builder(tokenizer, chat, {words ? &*words : nullptr, essay ? &*essay : nullptr}, seed);
  // No progress line while building: a bad length must leave its error alone on stderr.
  const auto built_from = std::chrono::steady_clock::now();
  std::vector<t::TaskPrompt> prompts;
  for (const auto* task : tasks)
    for (const int length : lengths)
      for (int s = 0; s < samples; ++s) prompts.push_back(builder.build(*task, length, s));
  std::fprintf(stderr, "%zu prompts built in %.1f s (chat template: %s)\n", prompts.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - built_from).count(), chat.name());
  if (!csv_path.empty()) check_writable(csv_path, "--csv");
  auto quoted = [](const std::string& s) {  // a CSV field: quotes doubled, line breaks kept
    std::string q = "\"";
    for (const char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  if (!prompts_path.empty()) {  // what a peer needs to answer the same prompts (bench/peers/kvpress_tasks.py)
    std::ofstream out(prompts_path);
    DC_CHECK(out, "--task-prompts: cannot write '", prompts_path, "'");
    out << "task,length,sample,scoring,max_new_tokens,stop_ids,context_tokens,answers,prompt_ids\n";
    std::string stop;
    for (const std::int32_t id : dc::answer_stop_tokens(tokenizer))
      stop += (stop.empty() ? "" : " ") + std::to_string(id);
    for (const auto& p : prompts) {
      std::string answers;  // '|'-separated
      for (const auto& a : p.answers) {
        DC_CHECK(a.find('|') == std::string::npos, "--task-prompts: answer '", a, "' of ", p.task, " contains '|'");
        answers += (answers.empty() ? "" : "|") + a;
      }
      out << p.task << ',' << p.length << ',' << p.sample << ',' << t::scoring_name(p.scoring) << ','
          << p.max_new_tokens << ',' << stop << ',' << p.context.size() << ',' << quoted(answers) << ',';
      const char* sep = "";
      for (const std::int32_t id : p.full_prompt()) {
        out << sep << id;
        sep = " ";
      }
      out << '\n';
    }
    out.close();
    DC_CHECK(out, "--task-prompts: writing '", prompts_path, "' failed");
  }

  dc::TaskSuite<dc::cpu, W> suite(model, tokenizer, policies, budgets, mode, granularities, protocol);
  suite.set_max_batch(std::size_t(batch));
  std::vector<std::string> ran_at;  // [policy][granularity]
  for (auto* p : policies)
    for (const auto g : granularities) ran_at.push_back(dc::granularity_name(p->granularity_for(g)));
  KeepSetCsv keep_sets(keep_sets_path);
  std::size_t prompt_index = 0;
  if (keep_sets.enabled())
    suite.on_compressed([&](std::size_t s, const dc::KVCache<dc::cpu>& cache) {
      const std::size_t pol = s / (granularities.size() * budgets.size());
      const std::size_t g = s / budgets.size() % granularities.size();
      keep_sets.write(policy_names[pol], ran_at[pol * granularities.size() + g], fractions[s % budgets.size()],
                      prompt_index, cache);
    });
  // The answers file holds what each policy generated, made valid UTF-8 (dc::valid_utf8: a
  // generation cut at its token limit can end inside a character); the scores were taken on the
  // model's own bytes.
  std::ofstream answers;
  if (!answers_path.empty()) {
    answers.open(answers_path);
    DC_CHECK(answers, "--answers: cannot write '", answers_path, "'");
    answers << "task,length,sample,policy,granularity,budget,score,expected,output\n";
  }
  dc::TaskScores scores;
  const auto start = std::chrono::steady_clock::now();
  const std::size_t per_sample = suite.students();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const t::TaskPrompt& p = prompts[i];
    prompt_index = i;
    const dc::TaskSampleResult r = suite.run(p, [&](std::size_t student) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::size_t done = i * per_sample + student, total = prompts.size() * per_sample;
      const double eta = done ? secs * double(total - done) / double(done) : 0.0;
      const std::size_t pol = student / (granularities.size() * budgets.size());
      std::fprintf(stderr, "\r[%s L=%d sample %d/%d] %-10s budget %-6g %6.0f s, ETA %6.0f s ", p.task.c_str(),
                   p.length, p.sample + 1, samples, policy_names[pol].c_str(), fractions[student % budgets.size()],
                   secs, eta);
      std::fflush(stderr);
    });
    scores.add(p, r);
    if (answers.is_open()) {
      std::string expected;
      for (const auto& a : p.answers) expected += (expected.empty() ? "" : " ") + a;
      answers << p.task << ',' << p.length << ',' << p.sample << ",full cache,shared,1," << r.teacher_score << ','
              << quoted(expected) << ',' << quoted(dc::valid_utf8(r.teacher_output)) << '\n';
      for (std::size_t s = 0; s < per_sample; ++s) {
        const std::size_t pol = s / (granularities.size() * budgets.size());
        const std::size_t g = s / budgets.size() % granularities.size();
        answers << p.task << ',' << p.length << ',' << p.sample << ',' << policy_names[pol] << ','
                << ran_at[pol * granularities.size() + g] << ',' << fractions[s % budgets.size()] << ','
                << r.scores[s] << ',' << quoted(expected) << ',' << quoted(dc::valid_utf8(r.outputs[s])) << '\n';
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "\n%zu samples in %.0f s\n", prompts.size(), secs);
  if (answers.is_open()) {
    answers.close();
    DC_CHECK(answers, "--answers: writing '", answers_path, "' failed");
  }
  keep_sets.close();
  const auto rows = dc::task_report(scores, policy_names, ran_at, fractions);
  dc::write_task_markdown(std::cout, rows, protocol);
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    DC_CHECK(csv, "--csv: cannot write '", csv_path, "'");
    dc::write_task_csv(csv, rows, protocol);
    csv.close();
    DC_CHECK(csv, "--csv: writing '", csv_path, "' failed");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Fidelity of evicted KV caches against the full cache (distillcache)."};
  std::string model_path, text_path, csv_path, budgets_arg = "0.125,0.25,0.5",
                                                policies_arg = "random,streaming,h2o,snapkv,tova,knorm",
                                                mode_arg = "decode", dtype = "f32", kv_dtype_arg = "f32";
  int context = 1024, continuation = 32, max_contexts = 8, chunk = 0, sink = 0, recent = 0, batch = 16;
  std::uint64_t seed = 0;
  app.add_option("--model", model_path, "GGUF model file")->required();
  app.add_option("--text", text_path, "a .txt file or a folder of them (not with --task)");
  app.add_option("--context", context, "prompt tokens L")->check(integer_in(1, 1 << 20));
  app.add_option("--continuation", continuation, "teacher-forced tokens T")->check(integer_in(1, 1 << 16));
  app.add_option("--budget", budgets_arg, "kept fractions of the prompt, e.g. 0.125,0.25,0.5")
      ->check(number_list());
  app.add_option("--policy", policies_arg, "policies: full,random,streaming,h2o,observed,snapkv,tova,knorm,expected,distillcache "
                 "(the shipped learned policy),distillcache=PATH,oracle (the top-B of the continuation's own attention: "
                 "an upper reference, prefill mode only); NAME+layers=PATH gives NAME the per-layer budget weights of "
                 "the policy file PATH");
  app.add_option("--max-contexts", max_contexts, "contexts to evaluate")->check(integer_in(1, 1 << 20));
  app.add_option("--mode", mode_arg, "prefill: compress once; decode: also evict while decoding")
      ->check(CLI::IsMember({"prefill", "decode"}));
  app.add_option("--chunk", chunk, "decode-mode slack: evict back to B at B + chunk (default: B / 64, at least 16)")
      ->check(integer_in(1, 1 << 16))
      ->default_str("B/64, >= 16");
  app.add_option("--sink", sink, "first tokens always kept")->check(integer_in(0, 1 << 20));
  app.add_option("--recent", recent, "newest tokens always kept")->check(integer_in(0, 1 << 20));
  app.add_option("--seed", seed, "seed of the random policy")->check(unsigned_integer());
  app.add_option("--csv", csv_path, "write the results as CSV here");
  app.add_option("--batch", batch, "decoders stepped as one batch (the teacher counts; each holds a "
                 "KV cache of --context + --continuation tokens)")->check(integer_in(1, 4096));
  std::string granularities_arg = "shared", keep_sets_path, per_context_path;
  app.add_option("--per-context", per_context_path,
                 "write every student's KL, top-1 agreement and perplexity ratio on each context as CSV "
                 "(policy,granularity,budget,context,kl_mean,top1_agreement,ppl_ratio,n_steps): paired "
                 "comparisons between policies on the same contexts (bench/paired_kl.py)");
  app.add_option("--keep-sets", keep_sets_path,
                 "write every student's kept positions after the prompt's compression as CSV "
                 "(policy,granularity,budget,context,layer,kv_head,positions; with --task a context is a prompt, numbered "
                 "in --task-prompts order)");
  app.add_option("--granularity", granularities_arg,
                 "keep-sets, comma-separated: shared (one for the cache), layer (one per layer), "
                 "head (one per layer and KV head)");
  app.add_option("--dtype", dtype, std::string(kWeightDtypeHelp) + " (teacher and students alike)")
      ->check(CLI::IsMember(kWeightDtypes));
  app.add_option("--kv-dtype", kv_dtype_arg, std::string(kKvDtypeHelp) + " (teacher and students alike)")
      ->check(CLI::IsMember(kKvDtypes));
  std::string tasks_arg, lengths_arg = "1024", protocol_arg = "query-agnostic", chat_arg = "auto",
              words_path = dc::tasks::WordList::kDefaultPath, haystack_path = dc::tasks::kDefaultEssayPath,
              answers_path, prompts_path;
  int samples = 10;
  app.add_option("--task", tasks_arg, "RULER-style tasks instead of --text, comma-separated: niah_single_1..3, "
                 "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe");
  app.add_option("--samples", samples, "--task: samples per task and length")->check(integer_in(1, 1 << 20));
  app.add_option("--lengths", lengths_arg, "--task: prompt + answer lengths in tokens, e.g. 1024,2048,4096");
  app.add_option("--protocol", protocol_arg, "--task: query-aware (the question is compressed with the context) or "
                 "query-agnostic (compressed before the question arrives)")
      ->check(CLI::IsMember({"query-aware", "query-agnostic"}));
  app.add_option("--chat-template", chat_arg, "--task: auto (the model's tokenizer.chat_template), chatml or none")
      ->check(CLI::IsMember({"auto", "chatml", "none"}));
  app.add_option("--words", words_path, "--task: word list for keys and cwe (one word a line)");
  app.add_option("--haystack", haystack_path, "--task: essay haystack text, a file or folder");
  app.add_option("--answers", answers_path, "--task: write every sample's answers as CSV here (each output as valid UTF-8: a byte outside a character reads U+FFFD)");
  app.add_option("--task-prompts", prompts_path, "--task: write every prompt as CSV here (token ids, expected "
                 "answers, output budget, stop tokens), before the first model call");
  if (const auto status = parse_command_line(app, argc, argv, "eval")) return *status;
  if (tasks_arg.empty() && text_path.empty()) {  // as CLI11 says it for a required option
    print_error("eval", "--text is required (see --help)");
    return exit_usage;
  }

  return run_reporting_errors("eval", [&]() -> int {
    const auto policy_names = split_list(policies_arg);
    DC_CHECK(!policy_names.empty(), "--policy: no policy given");
    std::vector<std::unique_ptr<dc::EvictionPolicy>> owned;
    std::vector<dc::EvictionPolicy*> policies;
    dc::FutureAttentionOracle* oracle = nullptr;  // prepared with each context's continuation
    for (const auto& name : policy_names) {
      if (name == "oracle") {
        DC_CHECK(oracle == nullptr, "--policy: 'oracle' given twice");
        auto o = std::make_unique<dc::FutureAttentionOracle>();
        oracle = o.get();
        owned.push_back(std::move(o));
      } else {
        owned.push_back(dc::make_policy(name, seed, DC_SHIPPED_POLICY));
      }
      policies.push_back(owned.back().get());
    }
    std::vector<dc::Granularity> granularities;
    for (const auto& g : split_list(granularities_arg)) granularities.push_back(dc::parse_granularity(g));
    DC_CHECK(!granularities.empty(), "--granularity: none given");
    std::vector<double> fractions;
    std::vector<dc::Budget> budgets;
    for (const auto& s : split_list(budgets_arg)) {
      dc::Budget b = dc::Budget::of_fraction(parse_fraction(s));
      b.chunk = chunk;
      b.sink = sink;
      b.recent = recent;
      b.resolve(context);  // reject impossible budgets before any work
      fractions.push_back(b.fraction);
      budgets.push_back(b);
    }
    DC_CHECK(!budgets.empty(), "--budget: no budget given");

    // An unwritable --csv fails now, not after the evaluation: a probe that neither truncates an
    // existing file nor leaves a new one behind.
    if (!csv_path.empty()) check_writable(csv_path, "--csv");
    if (!keep_sets_path.empty()) check_writable(keep_sets_path, "--keep-sets");
    if (!per_context_path.empty()) check_writable(per_context_path, "--per-context");
    DC_CHECK(!tasks_arg.empty() || (answers_path.empty() && prompts_path.empty()),
             "--answers and --task-prompts write task answers and prompts: they need --task");
    DC_CHECK(tasks_arg.empty() || per_context_path.empty(),
             "--per-context writes the contexts of --text: with --task, --answers has every sample");
    if (!answers_path.empty()) check_writable(answers_path, "--answers");
    if (!prompts_path.empty()) check_writable(prompts_path, "--task-prompts");

    std::error_code ec;
    DC_CHECK(!std::filesystem::is_directory(model_path, ec), "--model: '", model_path,
             "' is a folder; eval needs a .gguf file (it uses the model's tokenizer)");
    model_format(model_path);  // exists, and is a GGUF file
    dc::GgufFile file(model_path);
    dc::HfModel m = dc::load_gguf_model(file);
    for (const dc::EvictionPolicy* p : policies) note_layer_rules_depth("eval", *p, m.config.num_layers);
    const dc::Tokenizer tokenizer(dc::tokenizer_data_from_gguf(file));
    const auto mode = mode_arg == "prefill" ? dc::EvictionMode::prefill : dc::EvictionMode::decode;
    DC_CHECK(!oracle || (mode == dc::EvictionMode::prefill && tasks_arg.empty()), "--policy oracle: "
             "the oracle reads the continuation it is scored on, so it runs only on --text in --mode prefill");
    if (!tasks_arg.empty()) {
      const auto task_names = split_list(tasks_arg);
      DC_CHECK(!task_names.empty(), "--task: no task given");
      for (const auto& name : task_names) dc::tasks::find_task(name);  // unknown names fail before the weights load
      std::vector<int> lengths;
      for (const auto& s : split_list(lengths_arg)) {
        const auto v = detail::to_integer(s);
        DC_CHECK(v && *v > 0 && *v <= (1 << 20), "--lengths: '", s, "' is not a positive token count");
        lengths.push_back(int(*v));
      }
      DC_CHECK(!lengths.empty(), "--lengths: no length given");
      auto run = [&]<class W>(dc::Weights<dc::cpu, W> weights) -> int {
        dc::Transformer<dc::cpu, W> model(m.config, std::move(weights), 64);
        model.set_kv_type(kv_dtype(kv_dtype_arg));
        return run_tasks(model, tokenizer, file, task_names, lengths, samples, policy_names, policies, budgets,
                         fractions, granularities, mode, dc::parse_protocol(protocol_arg), chat_arg, words_path,
                         haystack_path, seed, batch, csv_path, answers_path, prompts_path, keep_sets_path);
      };
      return with_cpu_weights(dtype, model_path, m, run);
    }
    DC_CHECK(context + continuation <= m.config.max_position, "--context + --continuation = ",
             context + continuation, " exceeds the model's context of ", m.config.max_position);
    const auto windows = dc::token_windows(tokenizer, text_path, context + continuation, max_contexts);
    DC_CHECK(!windows.empty(), "no file in ", text_path, " has ", context + continuation, " tokens");

    // The teacher (full cache) and every student run on the same weights (--dtype).
    auto run = [&]<class W>(dc::Weights<dc::cpu, W> weights) -> int {
      dc::Transformer<dc::cpu, W> model(m.config, std::move(weights), 64);
      model.set_kv_type(kv_dtype(kv_dtype_arg));
      dc::FidelityEvaluator<dc::cpu, W> eval(model, policies, budgets, mode, granularities);
      eval.set_max_batch(std::size_t(batch));
      const auto start = std::chrono::steady_clock::now();
      const std::size_t per_context = policies.size() * granularities.size() * budgets.size();
      auto name_of = [&](std::size_t i) {  // (policy, granularity it ran at, budget) of student i
        const std::size_t p = i / (granularities.size() * budgets.size());
        const std::size_t g = i / budgets.size() % granularities.size();
        return std::make_tuple(p, dc::granularity_name(policies[p]->granularity_for(granularities[g])),
                               i % budgets.size());
      };
      KeepSetCsv keep_sets(keep_sets_path);
      std::size_t context_index = 0;
      if (keep_sets.enabled())
        eval.on_compressed([&](std::size_t i, const dc::KVCache<dc::cpu>& cache) {
          const auto [p, ran_at, b] = name_of(i);
          keep_sets.write(policy_names[p], ran_at, fractions[b], context_index, cache);
        });
      std::ofstream per_context_csv;
      if (!per_context_path.empty()) {
        per_context_csv.open(per_context_path);
        DC_CHECK(per_context_csv, "--per-context: cannot write '", per_context_path, "'");
        per_context_csv << "policy,granularity,budget,context,kl_mean,top1_agreement,ppl_ratio,n_steps\n";
      }
      for (std::size_t c = 0; c < windows.size(); ++c) {
        context_index = c;
        const std::vector<dc::FidelityTotals> before = eval.totals();  // this context's = after - before
        const std::span<const std::int32_t> w(windows[c]);
        if (oracle) oracle->prepare(model, w.first(std::size_t(context)), w.subspan(std::size_t(context)), granularities);
        eval.add_context(w.first(std::size_t(context)), w.subspan(std::size_t(context)), [&](std::size_t i) {
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          const std::size_t done = c * per_context + i, total = windows.size() * per_context;
          const double eta = done ? secs * double(total - done) / double(done) : 0.0;
          const auto [p, ran_at, b] = name_of(i);
          std::fprintf(stderr, "\r[context %zu/%zu] %-10s %-6s budget %-6g %6.0f s, ETA %6.0f s ",
                       c + 1, windows.size(), policy_names[p].c_str(), ran_at, fractions[b], secs, eta);
          std::fflush(stderr);
        });
        if (per_context_csv.is_open()) {
          const auto& after = eval.totals();
          for (std::size_t i = 0; i < after.size(); ++i) {
            const dc::FidelityTotals t = dc::difference(after[i], before[i]);
            const auto [p, ran_at, b] = name_of(i);
            per_context_csv << policy_names[p] << ',' << ran_at << ',' << fractions[b] << ',' << c << ','
                            << t.kl_mean() << ',' << t.top1_agreement() << ',' << t.ppl_ratio() << ',' << t.steps
                            << '\n';
          }
          per_context_csv.flush();  // a long run's finished contexts are on disk as it goes
        }
      }
      std::fprintf(stderr, "\n");
      if (per_context_csv.is_open()) {
        per_context_csv.close();
        DC_CHECK(per_context_csv, "--per-context: writing '", per_context_path, "' failed");
      }
      keep_sets.close();

      std::ofstream csv;
      if (!csv_path.empty()) {
        csv.open(csv_path);
        DC_CHECK(csv, "--csv: cannot write '", csv_path, "'");
        csv << "policy,granularity,budget,kl_mean,top1_agreement,ppl_ratio,n_contexts,n_steps\n";
      }
      std::printf("%-10s %-11s %7s %10s %8s %9s %9s %8s\n", "policy", "granularity", "budget", "kl_mean",
                  "top1", "ppl_ratio", "contexts", "steps");
      for (std::size_t p = 0; p < policies.size(); ++p)
        for (std::size_t g = 0; g < granularities.size(); ++g)
          for (std::size_t b = 0; b < budgets.size(); ++b) {
            const auto& t = eval.total(p, g, b);
            // The granularity the policy ran at: a request finer than its rule is capped (tova).
            const char* ran_at = dc::granularity_name(policies[p]->granularity_for(granularities[g]));
            std::printf("%-10s %-11s %7.4g %10.5f %8.4f %9.4f %9d %8lld\n", policy_names[p].c_str(), ran_at,
                        fractions[b], t.kl_mean(), t.top1_agreement(), t.ppl_ratio(), eval.contexts(),
                        (long long)t.steps);
            if (csv.is_open())
              csv << policy_names[p] << ',' << ran_at << ',' << fractions[b] << ',' << t.kl_mean() << ','
                  << t.top1_agreement() << ',' << t.ppl_ratio() << ',' << eval.contexts() << ',' << t.steps
                  << '\n';
          }
      if (csv.is_open()) {
        csv.close();
        DC_CHECK(csv, "--csv: writing '", csv_path, "' failed");
      }
      return 0;
    };
    return with_cpu_weights(dtype, model_path, m, run);
  });
}
