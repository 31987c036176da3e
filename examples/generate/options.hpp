#pragma once
// Parsed command line of examples/generate, and the backend runners it dispatches to.
#include <cstdint>
#include <string>
#include <vector>

#include <distillcache/io/hf_checkpoint.hpp>
#include <distillcache/model/sampling.hpp>

namespace dc_examples {

struct GenerateOptions {
  std::string model_dir;
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 16;
  dc::SamplingOptions sampling;
  std::uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype = "f32";  // weight storage on CUDA: f32 or bf16
  int max_chunk = 64;
};

// Each runs the generation and prints the result; returns the process exit status.
int run_cpu(dc::HfModel model, const GenerateOptions& opt);
#if defined(DC_WITH_CUDA)
int run_cuda(dc::HfModel model, const GenerateOptions& opt);
#endif

}  // namespace dc_examples
