// libFuzzer target: dc::Tokenizer encode/decode of arbitrary bytes and ids, SmolLM2 and spm_tiny vocabularies;
// decode(encode(s)) must give s back (less the bytes SmolLM2 has no token for).
// The logic lives in tests/support/fuzz_entry_points.hpp, shared with the regression test.
#include <cstddef>
#include <cstdint>

#include "../tests/support/fuzz_entry_points.hpp"

// Builds the vocabularies before the first input, so their load time never counts as a timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)dc_fuzz::vocabs(DC_FIXTURE_DIR);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)dc_fuzz::tokenizer_entry(data, size, DC_FIXTURE_DIR);
  return 0;
}
