#pragma once
// Every CPU op of the forward pass, for generic code that instantiates Transformer<cpu>.
#include "attention.hpp"
#include "elementwise.hpp"
#include "gemm.hpp"
#include "kv.hpp"
#include "norm.hpp"
#include "parallel.hpp"
#include "rope.hpp"
