// examples/generate: load a Hugging Face model folder and continue a prompt of token ids,
// greedily or by sampling, on the CPU or (when built with CUDA) the GPU.
//
//   generate --model tests/fixtures/tiny_mistral --tokens 1,2,3 --max-new-tokens 8
#include <CLI/CLI.hpp>

#include <cstdio>
#include <sstream>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/hf_checkpoint.hpp>

#include "generation.hpp"
#include "options.hpp"
#include "report.hpp"

namespace dc_examples {

int run_cpu(dc::HfModel model, const GenerateOptions& opt) {
  DC_CHECK(opt.dtype == "f32", "the CPU backend computes in f32; --dtype ", opt.dtype,
           " is for --device cuda");
  dc::Transformer<dc::cpu> transformer(model.config, std::move(model.weights), opt.max_chunk);
  const auto result = generate(transformer, opt.prompt, opt.max_new_tokens, opt.sampling, opt.seed);
  print_result(result, "cpu");
  return 0;
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
  std::string tokens;
  app.add_option("--model", opt.model_dir, "Hugging Face model folder (config.json + *.safetensors)")
      ->required();
  app.add_option("--tokens", tokens, "prompt as comma-separated token ids, e.g. 1,2,3")->required();
  app.add_option("--max-new-tokens", opt.max_new_tokens, "tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", opt.sampling.temperature, "0 = greedy")
      ->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-k", opt.sampling.top_k, "sample from the k most likely (0 = all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", opt.seed, "sampling seed");
  app.add_option("--device", opt.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", opt.dtype, "weight storage on cuda: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--max-chunk", opt.max_chunk, "prefill chunk size")->check(CLI::Range(1, 8192));
  CLI11_PARSE(app, argc, argv);

  try {
    opt.prompt = parse_token_list(tokens);
    dc::HfModel model = dc::load_hf_model(opt.model_dir);
    if (opt.device == "cuda") {
#if defined(DC_WITH_CUDA)
      return run_cuda(std::move(model), opt);
#else
      DC_FAIL("this build of generate has no CUDA backend (configure with nvcc available)");
#endif
    }
    return run_cpu(std::move(model), opt);
  } catch (const dc::Error& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.what());
    return 1;
  }
}
