// libFuzzer target: safetensors files: dc::SafetensorsFile, read_float and read_i32 of every tensor.
// The logic lives in tests/support/fuzz_entry_points.hpp, shared with the regression test.
#include <cstddef>
#include <cstdint>

#include "../tests/support/fuzz_entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dc_fuzz::safetensors_entry(data, size);
  return 0;
}
