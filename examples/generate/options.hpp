#pragma once
// Parsed command line of examples/generate, and the backend runners it dispatches to.
#include <cstdint>
#include <string>
#include <vector>

#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/io/tokenizer.hpp>
#include <distillcache/model/sampling.hpp>
#include <distillcache/policy/registry.hpp>
#include <distillcache/cache/budget.hpp>
#include <memory>

namespace dc_examples {

struct GenerateOptions {
  std::string model_path;              // Hugging Face folder or .gguf file
  std::vector<std::int32_t> prompt;    // token ids (from --tokens, or --prompt via the tokenizer)
  int max_new_tokens = 16;
  dc::SamplingOptions sampling;
  std::uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype = "f32";     // weight storage (common/weights.hpp: kWeightDtypes)
  std::string kv_dtype = "f32";  // KV cache storage (kKvDtypes)
  int max_chunk = 64;
  std::string policy = "full";  // eviction policy: a baseline, distillcache or distillcache=PATH
  double budget = 1.0;          // fraction of the prompt kept
  dc::Granularity granularity = dc::Granularity::shared;  // keep-set per cache, layer or KV head
};

// The eviction policy and budget the options ask for.
inline std::unique_ptr<dc::EvictionPolicy> make_policy(const GenerateOptions& opt) {
  return dc::make_policy(opt.policy, opt.seed, DC_SHIPPED_POLICY);
}
inline dc::Budget make_budget(const GenerateOptions& opt) { return dc::Budget::of_fraction(opt.budget); }

// Each runs the generation and prints the result (as text when a tokenizer is given);
// returns the process exit status.
int run_cpu(dc::HfModel model, const GenerateOptions& opt, const dc::Tokenizer* tokenizer);
#if defined(DC_WITH_CUDA)
int run_cuda(dc::HfModel model, const GenerateOptions& opt, const dc::Tokenizer* tokenizer);
#endif

}  // namespace dc_examples
