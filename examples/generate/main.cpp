// examples/generate: load a model (a GGUF file, or a Hugging Face folder) and continue a prompt,
// greedily or by sampling, on the CPU or (when built with CUDA) the GPU.
//
//   generate --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt "The capital of France is"
//   generate --model tests/fixtures/tiny_mistral --tokens 1,2,3 --max-new-tokens 8
#include <CLI/CLI.hpp>

#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>

#include <distillcache/distillcache.hpp>

#include "../common/cli.hpp"
#include "../common/weights.hpp"
#include "generation.hpp"
#include "options.hpp"
#include "report.hpp"

namespace dc_examples {

template <class W>
int run_cpu_as(dc::Weights<dc::cpu, W> weights, const dc::ModelConfig& config,
               const GenerateOptions& opt, const dc::Tokenizer* tokenizer) {
  dc::Transformer<dc::cpu, W> transformer(config, std::move(weights), opt.max_chunk);
  transformer.set_kv_type(kv_dtype(opt.kv_dtype));
  const auto policy = make_policy(opt);
  const auto result = generate(transformer, opt.prompt, opt.max_new_tokens, opt.sampling, opt.seed,
                               stop_token(tokenizer), *policy, make_budget(opt),
                               opt.granularity);
  print_result(result, ("cpu (" + weight_dtype_label(opt.dtype) + ")").c_str(), tokenizer);
  return 0;
}

int run_cpu(dc::HfModel model, const GenerateOptions& opt, const dc::Tokenizer* tokenizer) {
  return with_cpu_weights(opt.dtype, opt.model_path, model, [&]<class W>(dc::Weights<dc::cpu, W> weights) {
    return run_cpu_as(std::move(weights), model.config, opt, tokenizer);
  });
}

std::vector<std::int32_t> parse_token_list(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::string item;
  std::stringstream in(text);
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      DC_FAIL("--tokens: '", item, "' is not an integer token id");
    }
    DC_CHECK(used == item.size(), "--tokens: '", item, "' is not an integer token id");
    DC_CHECK(v >= 0 && v <= INT32_MAX, "--tokens: token id ", v, " out of range");
    ids.push_back(static_cast<std::int32_t>(v));
  }
  DC_CHECK(!ids.empty(), "--tokens: the prompt is empty");
  return ids;
}

}  // namespace dc_examples

int main(int argc, char** argv) {
  using namespace dc_examples;
  CLI::App app{"Greedy or sampled generation with a Llama/Mistral model (distillcache)."};
  GenerateOptions opt;
  std::string tokens, prompt_text;
  app.add_option("--model", opt.model_path,
                 "a .gguf file, or a Hugging Face folder (config.json + *.safetensors)")
      ->required();
  auto* prompt_opt = app.add_option("--prompt", prompt_text, "prompt text (GGUF models: uses its tokenizer)");
  auto* tokens_opt = app.add_option("--tokens", tokens, "prompt as comma-separated token ids, e.g. 1,2,3");
  prompt_opt->excludes(tokens_opt);
  app.add_option("--max-new-tokens", opt.max_new_tokens, "tokens to generate")
      ->check(integer_in(1, 1 << 20));
  app.add_option("--temperature", opt.sampling.temperature, "0 = greedy")
      ->check(finite_number(0.0, 100.0));
  app.add_option("--top-k", opt.sampling.top_k, "sample from the k most likely (0 = all)")
      ->check(integer_in(0, std::numeric_limits<int>::max()));
  app.add_option("--seed", opt.seed, "sampling seed")->check(unsigned_integer());
  app.add_option("--device", opt.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", opt.dtype, kWeightDtypeHelp)->check(CLI::IsMember(kWeightDtypes));
  app.add_option("--kv-dtype", opt.kv_dtype, kKvDtypeHelp)->check(CLI::IsMember(kKvDtypes));
  app.add_option("--max-chunk", opt.max_chunk, "prefill chunk size")->check(integer_in(1, 8192));
  std::string granularity = "shared";
  app.add_option("--policy", opt.policy,
                 "KV-cache eviction: full, random, streaming, h2o, observed, snapkv, tova, knorm, expected, "
                 "distillcache (the shipped learned policy) or distillcache=PATH");
  app.add_option("--granularity", granularity,
                 "keep-sets: shared (one for the cache), layer (one per layer) or head (one per "
                 "layer and KV head)")
      ->check(CLI::IsMember({"shared", "layer", "head"}));
  app.add_option("--budget", opt.budget, "fraction of the prompt the cache keeps (with --policy)")
      ->check(number());
  if (const auto status = parse_command_line(app, argc, argv, "generate")) return *status;

  return run_reporting_errors("generate", [&]() -> int {
    // Everything the command line alone can tell is checked before the model loads.
    DC_CHECK(!prompt_text.empty() || !tokens.empty(), "give a prompt: --prompt TEXT or --tokens IDS");
    DC_CHECK(opt.device != "cuda" || opt.dtype == "f32" || opt.dtype == "bf16", "--dtype ", opt.dtype,
             ": quantized weights are CPU only; --device cuda takes f32 or bf16");
#if !defined(DC_WITH_CUDA)
    DC_CHECK(opt.device != "cuda",
             "--device cuda: this build of generate has no CUDA backend (configure with nvcc available)");
#endif
    make_policy(opt);  // an unknown name fails here
    opt.granularity = dc::parse_granularity(granularity);
    if (!tokens.empty()) opt.prompt = parse_token_list(tokens);

    dc::HfModel model;
    std::optional<dc::Tokenizer> tokenizer;
    if (model_format(opt.model_path) == ModelFormat::gguf) {
      dc::GgufFile file(opt.model_path);
      model = dc::load_gguf_model(file);
      tokenizer.emplace(dc::tokenizer_data_from_gguf(file));
    } else {
      model = dc::load_hf_model(opt.model_path);
    }
    note_layer_rules_depth("generate", *make_policy(opt), model.config.num_layers);
    if (!prompt_text.empty()) {
      DC_CHECK(tokenizer.has_value(), "--prompt needs a tokenizer: this model folder has none "
                                      "(use a .gguf model, or --tokens)");
      opt.prompt = tokenizer->encode(prompt_text, /*add_special=*/true);
      DC_CHECK(!opt.prompt.empty(), "--prompt: the text encodes to no tokens");
    }
    const int vocab = model.config.vocab_size;
    for (const auto id : opt.prompt)
      DC_CHECK(id < vocab, "prompt token id ", id, " is outside the model's vocabulary [0, ", vocab, ")");
    const long long needed = static_cast<long long>(opt.prompt.size()) + opt.max_new_tokens;
    DC_CHECK(needed <= model.config.max_position, "the prompt (", opt.prompt.size(),
             " tokens) + --max-new-tokens ", opt.max_new_tokens, " = ", needed,
             " tokens exceed the model's context of ", model.config.max_position);
    make_budget(opt).resolve(static_cast<int>(opt.prompt.size()));  // fail before any output

    const dc::Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
    if (tok) std::printf("%s", prompt_text.c_str());
#if defined(DC_WITH_CUDA)
    if (opt.device == "cuda") return run_cuda(std::move(model), opt, tok);
#endif
    return run_cpu(std::move(model), opt, tok);
  });
}
