// model/transformer.hpp alone must be enough to instantiate the CPU model: its ops are overloads
// on Context<cpu> found by argument-dependent lookup at instantiation, so a TU that only includes
// the header (the generated ones) would not notice if cpu/ops.hpp stopped being included.
#include <distillcache/model/transformer.hpp>

template class dc::Transformer<dc::cpu, float>;
template class dc::Transformer<dc::cpu, dc::bf16>;
template class dc::Transformer<dc::cpu, dc::quantized>;
