#pragma once
// Backend tags select implementations at compile time, the way Thrust's execution policies do.
// Every op is an overload `op(const Context<B>&, ...)`; generic code (the transformer) is written
// once against Context<B> and instantiated for whichever backends the translation unit includes.
#include <concepts>
#include <type_traits>

namespace dc {

struct cpu {
  static constexpr const char* name = "cpu";
};
struct cuda {
  static constexpr const char* name = "cuda";
};

template <class B>
concept Backend = std::same_as<B, cpu> || std::same_as<B, cuda>;

// Per-backend execution state (thread settings on the CPU; stream and library handles on CUDA).
// Context<cuda> is defined in cuda/context.cuh so host-only code never sees CUDA types.
template <Backend B>
struct Context;

template <>
struct Context<cpu> {};

}  // namespace dc
