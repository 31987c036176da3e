// The CUDA half of examples/generate: uploads the weights (f32 or bf16) and runs the same loop.
#include <distillcache/distillcache.cuh>

#include "generation.hpp"
#include "options.hpp"
#include "report.hpp"

namespace dc_examples {

template <class W>
static int run_cuda_as(dc::HfModel& model, const GenerateOptions& opt,
                      const dc::Tokenizer* tokenizer) {
  dc::Context<dc::cuda> upload_ctx;
  auto weights = dc::upload_weights<W>(model.weights, upload_ctx);
  dc::synchronize(upload_ctx);
  dc::Transformer<dc::cuda, W> transformer(model.config, std::move(weights), opt.max_chunk);
  const auto policy = make_policy(opt);
  const auto result = generate(transformer, opt.prompt, opt.max_new_tokens, opt.sampling, opt.seed,
                               stop_token(tokenizer), *policy, make_budget(opt),
                               opt.granularity);
  print_result(result, opt.dtype == "bf16" ? "cuda (bf16 weights)" : "cuda (f32 weights)",
               tokenizer);
  return 0;
}

int run_cuda(dc::HfModel model, const GenerateOptions& opt, const dc::Tokenizer* tokenizer) {
  // No GPU (or no driver) is a user-facing condition, not a failed CUDA call: say so plainly.
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  DC_CHECK(status == cudaSuccess && devices > 0, "--device cuda: no usable CUDA device (",
           status == cudaSuccess ? "none found" : cudaGetErrorString(status), ")");
  if (opt.dtype == "bf16") return run_cuda_as<dc::bf16>(model, opt, tokenizer);
  return run_cuda_as<float>(model, opt, tokenizer);
}

}  // namespace dc_examples
