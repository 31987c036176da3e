#pragma once
// CUDA umbrella header: everything in distillcache.hpp plus the CUDA backend. Include it from a
// CUDA translation unit (nvcc) before instantiating Transformer<cuda, W>.
#include "distillcache.hpp"

#include "cuda/attention.cuh"
#include "cuda/buffer.cuh"
#include "cuda/check.cuh"
#include "cuda/context.cuh"
#include "cuda/copy.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/gemm.cuh"
#include "cuda/norm.cuh"
#include "cuda/ops.cuh"
#include "cuda/rope.cuh"
#include "decode/in_place_eviction.cuh"
#include "model/weights.cuh"
