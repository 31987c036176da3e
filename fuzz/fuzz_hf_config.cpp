// libFuzzer target: Hugging Face config.json text: dc::load_hf_config (JSON parsing included).
// The logic lives in tests/support/fuzz_entry_points.hpp, shared with the regression test.
#include <cstddef>
#include <cstdint>

#include "../tests/support/fuzz_entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dc_fuzz::hf_config_entry(data, size);
  return 0;
}
