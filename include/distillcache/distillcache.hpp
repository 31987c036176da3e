#pragma once
// Host-safe umbrella header: the core, the shared math, the CPU backend, the model and loaders.
// Include <distillcache/distillcache.cuh> from a CUDA translation unit to add the CUDA backend.
#include "core/backend.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "core/copy.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "cpu/ops.hpp"
#include "cache/kv_cache.hpp"
#include "model/config.hpp"
#include "model/transformer.hpp"
#include "model/weights.hpp"
#include "model/sampling.hpp"
#include "io/safetensors.hpp"
#include "io/hf_config.hpp"
#include "io/hf_checkpoint.hpp"
