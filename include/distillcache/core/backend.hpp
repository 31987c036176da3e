#pragma once
// Backend tags select implementations at compile time, the way Thrust's execution policies do.
// Every op is an overload `op(const Context<B>&, ...)`; generic code (the transformer) is written
// once against Context<B> and instantiated for whichever backends the translation unit includes.
#include <concepts>
#include <string>
#include <string_view>
#include <type_traits>

#include "error.hpp"

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

// Where memory lives: kHostDevice for the CPU backend, the CUDA device ordinal otherwise.
inline constexpr int kHostDevice = -1;

inline std::string device_name(int device) {
  return device == kHostDevice ? std::string("the host") : "CUDA device " + std::to_string(device);
}

// Memory on one device cannot be used by kernels running on another: what (e.g. "the KV cache")
// must live where the model runs.
inline void check_same_device(int model_device, int data_device, std::string_view what) {
  DC_CHECK(model_device == data_device, what, " is on ", device_name(data_device),
           " but the model runs on ", device_name(model_device),
           ": create it with that device current (cudaSetDevice)");
}

template <>
struct Context<cpu> {
  static constexpr int device() noexcept { return kHostDevice; }
};

}  // namespace dc
