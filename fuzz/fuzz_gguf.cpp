// libFuzzer target: GGUF files: dc::GgufFile (every metadata getter, every tensor), the model config, the whole model and the tokenizer the file describes.
// The logic lives in tests/support/fuzz_entry_points.hpp, shared with the regression test.
#include <cstddef>
#include <cstdint>

#include "../tests/support/fuzz_entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dc_fuzz::gguf_entry(data, size);
  return 0;
}
