// examples/infer: generation with a learned (or any) eviction policy at a budget, next to the
// full cache: how many bytes the cache saves and how close the model stays.
//
// The prompt (--prompt TEXT, or the first --context tokens of --text FILE) is prefilled; the
// full cache generates the reference continuation greedily. Each policy then
//   - is teacher-forced on that continuation (evicting while decoding): KL(full || evicted),
//     top-1 agreement and perplexity ratio, step by step (eval/fidelity.hpp);
//   - generates greedily on its own: how many tokens match the full cache's before the first
//     difference, and the text.
// and the cache sizes after the prompt's compression are printed side by side.
//
//   infer --model SmolLM2-135M-Instruct.Q4_1.gguf --text /usr/share/vim/vim90/doc/usr_02.txt
//         --budget 0.25 --policy distillcache,h2o
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include <distillcache/distillcache.hpp>

#include "../common/cli.hpp"
#include "../common/weights.hpp"
#include "../generate/generation.hpp"

namespace {

std::string one_line_text(std::string s, std::size_t max_chars = 160) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Generation with an evicting KV-cache policy next to the full cache (distillcache)."};
  std::string model_path, prompt_text, text_path, policies_arg = "distillcache,h2o",
                                                 granularity_arg = "head", dtype = "f32", kv_dtype_arg = "f32";
  int context = 1024, max_new = 64;
  double budget_fraction = 0.25;
  app.add_option("--model", model_path, "GGUF model file")->required();
  app.add_option("--prompt", prompt_text, "the prompt text");
  app.add_option("--text", text_path, "a text file whose first --context tokens are the prompt");
  app.add_option("--context", context, "prompt tokens taken from --text")->check(integer_in(1, 1 << 20));
  app.add_option("--max-new-tokens", max_new, "tokens generated")->check(integer_in(2, 1 << 16));
  app.add_option("--budget", budget_fraction, "fraction of the prompt the cache keeps")
      ->check(finite_number(1e-6, 1.0));
  app.add_option("--policy", policies_arg,
                 "policies, comma-separated: distillcache (the shipped learned policy), "
                 "distillcache=PATH, or a baseline (h2o, snapkv, tova, observed, ...)");
  app.add_option("--granularity", granularity_arg, "keep-sets: shared, layer or head")
      ->check(CLI::IsMember({"shared", "layer", "head"}));
  app.add_option("--dtype", dtype, kWeightDtypeHelp)->check(CLI::IsMember(kWeightDtypes));
  app.add_option("--kv-dtype", kv_dtype_arg, kKvDtypeHelp)->check(CLI::IsMember(kKvDtypes));
  if (const auto status = parse_command_line(app, argc, argv, "infer")) return *status;

  return run_reporting_errors("infer", [&]() -> int {
    DC_CHECK(prompt_text.empty() != text_path.empty(), "give exactly one of --prompt TEXT and --text FILE");
    const auto names = split_list(policies_arg);
    DC_CHECK(!names.empty(), "--policy: no policy given");
    std::vector<std::unique_ptr<dc::EvictionPolicy>> owned;
    std::vector<dc::EvictionPolicy*> policies;
    for (const auto& n : names) {
      owned.push_back(dc::make_policy(n, 0, DC_SHIPPED_POLICY));
      policies.push_back(owned.back().get());
    }
    const dc::Granularity granularity = dc::parse_granularity(granularity_arg);
    model_format(model_path);
    dc::GgufFile file(model_path);
    dc::HfModel m = dc::load_gguf_model(file);
    for (const dc::EvictionPolicy* p : policies) note_layer_rules_depth("infer", *p, m.config.num_layers);
    const dc::Tokenizer tokenizer(dc::tokenizer_data_from_gguf(file));
    std::vector<std::int32_t> prompt;
    if (!text_path.empty()) {
      prompt = tokenizer.encode(dc::read_text_file(text_path));
      DC_CHECK(!prompt.empty(), "--text: '", text_path, "' has no tokens");
      if (int(prompt.size()) > context) prompt.resize(std::size_t(context));
    } else {
      prompt = tokenizer.encode(prompt_text);
      DC_CHECK(!prompt.empty(), "--prompt: the text has no tokens");
    }
    const int n = int(prompt.size());
    DC_CHECK(n + max_new <= m.config.max_position, "prompt (", n, ") + --max-new-tokens (", max_new,
             ") exceed the model's context of ", m.config.max_position);
    dc::Budget budget = dc::Budget::of_fraction(budget_fraction);
    const int budget_tokens = budget.resolve(n);

    auto run = [&]<class W>(dc::Weights<dc::cpu, W> weights) -> int {
      dc::Transformer<dc::cpu, W> model(m.config, std::move(weights), 64);
      model.set_kv_type(kv_dtype(kv_dtype_arg));
      dc::SamplingOptions greedy;
      greedy.temperature = 0.0f;
      dc::FullCachePolicy full;
      const auto reference = generate(model, prompt, max_new, greedy, 0, -1, full,
                                      dc::Budget::of_fraction(1.0));
      std::printf("prompt: %d tokens; budget %.3g = %d tokens; %d tokens generated greedily\n", n,
                  budget_fraction, budget_tokens, int(reference.tokens.size()));
      std::printf("full cache: %s\n\n", one_line_text(tokenizer.decode(reference.tokens)).c_str());

      // Teacher-forced fidelity on the reference continuation, evicting while decoding.
      dc::FidelityEvaluator<dc::cpu, W> eval(model, policies, {budget}, dc::EvictionMode::decode, {granularity});
      // Bytes in use after the prompt's compression, and reserved: the decoder gives the evicted
      // slots' memory back, keeping room for the tokens still to come (decode/evicting_decoder.hpp).
      std::vector<std::size_t> compressed_bytes(policies.size()), reserved_bytes(policies.size());
      eval.on_compressed([&](std::size_t i, const dc::KVCache<dc::cpu>& cache) {
        compressed_bytes[i] = cache.bytes_used();
        reserved_bytes[i] = cache.bytes_reserved();
      });
      eval.add_context(prompt, reference.tokens, [](std::size_t) {});
      const std::size_t slot_bytes = std::size_t(m.config.num_layers) * model.make_cache(1).bytes_per_slot_layer();
      const std::size_t full_bytes = std::size_t(n) * slot_bytes;
      const std::size_t full_reserved = std::size_t(n + int(reference.tokens.size())) * slot_bytes;
      constexpr double kMiB = 1048576.0;

      std::printf("%-22s %-8s %12s %8s %12s %9s %8s %9s %12s\n", "policy", "keep-set", "cache MiB", "saved",
                  "reserved MiB", "KL", "top-1", "ppl ratio", "same tokens");
      std::printf("%-22s %-8s %12.2f %8s %12.2f %9s %8s %9s %12s\n", "full", "-", double(full_bytes) / kMiB, "-",
                  double(full_reserved) / kMiB, "0", "1", "1", "all");
      std::vector<std::string> texts;
      for (std::size_t p = 0; p < policies.size(); ++p) {
        const auto r = generate(model, prompt, max_new, greedy, 0, -1, *policies[p], budget, granularity);
        std::size_t same = 0;
        while (same < r.tokens.size() && same < reference.tokens.size() && r.tokens[same] == reference.tokens[same]) ++same;
        const auto& t = eval.total(p, 0, 0);
        const double saved = 1.0 - double(compressed_bytes[p]) / double(full_bytes);
        char same_text[32];
        std::snprintf(same_text, sizeof same_text, "%zu of %zu", same, reference.tokens.size());
        std::printf("%-22s %-8s %12.2f %7.1f%% %12.2f %9.4f %8.3f %9.3f %12s\n", names[p].c_str(),
                    dc::granularity_name(policies[p]->granularity_for(granularity)),
                    double(compressed_bytes[p]) / kMiB, 100.0 * saved, double(reserved_bytes[p]) / kMiB,
                    t.kl_mean(), t.top1_agreement(), t.ppl_ratio(), same_text);
        texts.push_back(one_line_text(tokenizer.decode(r.tokens)));
      }
      std::printf("\n");
      for (std::size_t p = 0; p < policies.size(); ++p) std::printf("%s: %s\n", names[p].c_str(), texts[p].c_str());
      return 0;
    };
    return with_cpu_weights(dtype, model_path, m, run);
  });
}
