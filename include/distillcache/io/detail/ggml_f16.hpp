#pragma once
// The fp16 scales that ggml's quantized blocks store, read from unaligned little-endian bytes
// (blocks of 18, 22 or 210 bytes leave their fp16 fields at any alignment).
#include <cstdint>
#include <cstring>

#include "../../core/dtype.hpp"

namespace dc::detail {

inline float load_f16(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return to_float(f16{bits});
}

}  // namespace dc::detail
