// examples/eval: how faithful is an evicted KV cache to the full one, on real text?
//
// For every context (L prompt tokens + T continuation tokens from the text), prefills the prompt,
// compresses it to each budget with each policy, teacher-forces the continuation (evicting during
// decoding too in --mode decode) and compares every step with the full-cache run. One CSV row per
// (policy, budget): KL(full || evicted) in nats, top-1 agreement, perplexity ratio.
//
//   eval --model SmolLM2-135M-Instruct.Q4_1.gguf --text /usr/share/vim/vim90/doc
//        --context 1024 --continuation 32 --budget 0.125,0.25,0.5 --policy streaming,h2o --csv out.csv
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <tuple>

#include <distillcache/distillcache.hpp>

#include "../common/cli.hpp"

namespace {

double parse_fraction(const std::string& s) {
  const auto v = dc_examples::detail::to_number(s);
  DC_CHECK(v.has_value(), "--budget: '", s, "' is not a number");
  return *v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Fidelity of evicted KV caches against the full cache (distillcache)."};
  std::string model_path, text_path, csv_path, budgets_arg = "0.125,0.25,0.5",
                                                policies_arg = "random,streaming,h2o,snapkv,tova,knorm",
                                                mode_arg = "decode", dtype = "f32";
  int context = 1024, continuation = 32, max_contexts = 8, chunk = 16, sink = 0, recent = 0, batch = 16;
  std::uint64_t seed = 0;
  app.add_option("--model", model_path, "GGUF model file")->required();
  app.add_option("--text", text_path, "a .txt file or a folder of them")->required();
  app.add_option("--context", context, "prompt tokens L")->check(integer_in(1, 1 << 20));
  app.add_option("--continuation", continuation, "teacher-forced tokens T")->check(integer_in(1, 1 << 16));
  app.add_option("--budget", budgets_arg, "kept fractions of the prompt, e.g. 0.125,0.25,0.5")
      ->check(number_list());
  app.add_option("--policy", policies_arg, "policies: full,random,streaming,h2o,observed,snapkv,tova,knorm,expected,distillcache "
                 "(the shipped learned policy),distillcache=PATH");
  app.add_option("--max-contexts", max_contexts, "contexts to evaluate")->check(integer_in(1, 1 << 20));
  app.add_option("--mode", mode_arg, "prefill: compress once; decode: also evict while decoding")
      ->check(CLI::IsMember({"prefill", "decode"}));
  app.add_option("--chunk", chunk, "decode-mode slack: evict back to B at B + chunk")->check(integer_in(1, 1 << 16));
  app.add_option("--sink", sink, "first tokens always kept")->check(integer_in(0, 1 << 20));
  app.add_option("--recent", recent, "newest tokens always kept")->check(integer_in(0, 1 << 20));
  app.add_option("--seed", seed, "seed of the random policy")->check(unsigned_integer());
  app.add_option("--csv", csv_path, "write the results as CSV here");
  app.add_option("--batch", batch, "decoders stepped as one batch (the teacher counts; each holds a "
                 "KV cache of --context + --continuation tokens)")->check(integer_in(1, 4096));
  std::string granularities_arg = "shared", keep_sets_path;
  app.add_option("--keep-sets", keep_sets_path,
                 "write every student's kept positions after the prompt's compression as CSV "
                 "(policy,granularity,budget,context,layer,kv_head,positions)");
  app.add_option("--granularity", granularities_arg,
                 "keep-sets, comma-separated: shared (one for the cache), layer (one per layer), "
                 "head (one per layer and KV head)");
  app.add_option("--dtype", dtype, "weight storage: f32 or bf16 (faster; teacher and students alike)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  if (const auto status = parse_command_line(app, argc, argv, "eval")) return *status;

  return run_reporting_errors("eval", [&]() -> int {
    const auto policy_names = split_list(policies_arg);
    DC_CHECK(!policy_names.empty(), "--policy: no policy given");
    std::vector<std::unique_ptr<dc::EvictionPolicy>> owned;
    std::vector<dc::EvictionPolicy*> policies;
    for (const auto& name : policy_names) {
      owned.push_back(dc::make_policy(name, seed, DC_SHIPPED_POLICY));
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

    std::error_code ec;
    DC_CHECK(!std::filesystem::is_directory(model_path, ec), "--model: '", model_path,
             "' is a folder; eval needs a .gguf file (it uses the model's tokenizer)");
    model_format(model_path);  // exists, and is a GGUF file
    dc::GgufFile file(model_path);
    dc::HfModel m = dc::load_gguf_model(file);
    const dc::Tokenizer tokenizer(dc::tokenizer_data_from_gguf(file));
    DC_CHECK(context + continuation <= m.config.max_position, "--context + --continuation = ",
             context + continuation, " exceeds the model's context of ", m.config.max_position);
    const auto windows = dc::token_windows(tokenizer, text_path, context + continuation, max_contexts);
    DC_CHECK(!windows.empty(), "no file in ", text_path, " has ", context + continuation, " tokens");

    // The teacher (full cache) and every student run on the same weights, f32 or bf16.
    auto run = [&]<class W>(dc::Weights<dc::cpu, W> weights) -> int {
      dc::Transformer<dc::cpu, W> model(m.config, std::move(weights), 64);
      const auto mode = mode_arg == "prefill" ? dc::EvictionMode::prefill : dc::EvictionMode::decode;
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
      std::ofstream keep_sets;
      std::size_t context_index = 0;
      if (!keep_sets_path.empty()) {
        keep_sets.open(keep_sets_path);
        DC_CHECK(keep_sets, "--keep-sets: cannot write '", keep_sets_path, "'");
        keep_sets << "policy,granularity,budget,context,layer,kv_head,positions\n";
        eval.on_compressed([&](std::size_t i, const dc::KVCache<dc::cpu>& cache) {
          const auto [p, ran_at, b] = name_of(i);
          for (int l = 0; l < cache.num_layers(); ++l)
            for (int h = 0; h < cache.num_kv_heads(); ++h) {
              keep_sets << policy_names[p] << ',' << ran_at << ',' << fractions[b] << ',' << context_index
                        << ',' << l << ',' << h << ',';
              const char* sep = "";
              for (const auto pos : cache.host_positions(l, h)) {
                keep_sets << sep << pos;
                sep = " ";
              }
              keep_sets << '\n';
            }
        });
      }
      for (std::size_t c = 0; c < windows.size(); ++c) {
        context_index = c;
        const std::span<const std::int32_t> w(windows[c]);
        eval.add_context(w.first(std::size_t(context)), w.subspan(std::size_t(context)), [&](std::size_t i) {
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          const std::size_t done = c * per_context + i, total = windows.size() * per_context;
          const double eta = done ? secs * double(total - done) / double(done) : 0.0;
          const auto [p, ran_at, b] = name_of(i);
          std::fprintf(stderr, "\r[context %zu/%zu] %-10s %-6s budget %-6g %6.0f s, ETA %6.0f s ",
                       c + 1, windows.size(), policy_names[p].c_str(), ran_at, fractions[b], secs, eta);
          std::fflush(stderr);
        });
      }
      std::fprintf(stderr, "\n");
      if (keep_sets.is_open()) {
        keep_sets.close();
        DC_CHECK(keep_sets, "--keep-sets: writing '", keep_sets_path, "' failed");
      }

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
    if (dtype == "bf16") return run(dc::convert_host_weights<dc::bf16>(std::move(m.weights)));
    return run(std::move(m.weights));
  });
}
