#pragma once
// --dtype and --kv-dtype: how the example programs store the model's matrices on the CPU, and
// the KV cache's keys and values.
#include <string>
#include <utility>
#include <vector>

#include <distillcache/distillcache.hpp>
#include <distillcache/io/gguf_model.hpp>

#include "cli.hpp"

namespace dc_examples {

inline const std::vector<std::string> kWeightDtypes = {"f32", "bf16", "q8_0", "q4_0", "q4_1", "gguf"};

inline constexpr const char* kWeightDtypeHelp =
    "weight storage: f32; bf16 (half the bytes per token); q8_0, q4_0 or q4_1 (every matrix quantized, "
    "8-bit integer dot products); gguf (a GGUF file's own Q8_0/Q4_0/Q4_1 blocks as they are)";

inline const std::vector<std::string> kKvDtypes = {"f32", "bf16"};
inline constexpr const char* kKvDtypeHelp =
    "KV cache storage: f32, or bf16 (half the bytes attention reads per token)";
inline dc::DType kv_dtype(const std::string& name) { return name == "bf16" ? dc::DType::bf16 : dc::DType::f32; }

// A line for reports: "f32 weights", "gguf weights (the file's blocks)".
inline std::string weight_dtype_label(const std::string& dtype) {
  return dtype == "gguf" ? "the GGUF's own quantized weights" : dtype + " weights";
}

// Calls run(dc::Weights<dc::cpu, W>) with model m's matrices stored as `dtype` says (one of
// kWeightDtypes; model_path is what --model named, reopened for gguf). m's fp32 weights are
// given up.
template <class Run>
int with_cpu_weights(const std::string& dtype, const std::string& model_path, dc::HfModel& m, Run&& run) {
  if (dtype == "bf16") return run(dc::convert_host_weights<dc::bf16>(std::move(m.weights)));
  if (dtype == "gguf") {
    DC_CHECK(model_format(model_path) == ModelFormat::gguf, "--dtype gguf: '", model_path,
             "' is not a GGUF file (q8_0, q4_0 or q4_1 quantize any model)");
    m.weights = dc::HostWeights();  // the blocks come from the file, not from the fp32 copy
    return run(dc::load_gguf_quantized_weights(dc::GgufFile(model_path), m.config));
  }
  if (dtype != "f32") {
    auto quantized = dc::quantize_host_weights(m.weights, dc::parse_quant_format(dtype));
    m.weights = dc::HostWeights();
    return run(std::move(quantized));
  }
  return run(std::move(m.weights));
}

}  // namespace dc_examples
