#pragma once
// Every CPU op of the forward pass, for generic code that instantiates Transformer<cpu>.
#include "adam.hpp"
#include "attention.hpp"
#include "elementwise.hpp"
#include "gemm.hpp"
#include "kl.hpp"
#include "kv.hpp"
#include "mlp.hpp"
#include "norm.hpp"
#include "parallel.hpp"
#include "rope.hpp"
#include "topk.hpp"
