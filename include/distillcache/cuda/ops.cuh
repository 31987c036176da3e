#pragma once
// Every CUDA op of the forward pass, for code that instantiates Transformer<cuda, W>.
#include "attention.cuh"
#include "buffer.cuh"
#include "check.cuh"
#include "context.cuh"
#include "copy.cuh"
#include "elementwise.cuh"
#include "gemm.cuh"
#include "kv.cuh"
#include "norm.cuh"
#include "rope.cuh"
