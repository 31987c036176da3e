#pragma once
// The fp16 scales that ggml's quantized blocks store, read from unaligned little-endian bytes
// (blocks of 18, 22 or 210 bytes leave their fp16 fields at any alignment). The reader lives with
// the block formulas in math/quant_blocks.hpp.
#include "../../math/quant_blocks.hpp"

namespace dc::detail {

inline float load_f16(const std::uint8_t* p) { return math::load_half(p); }

}  // namespace dc::detail
