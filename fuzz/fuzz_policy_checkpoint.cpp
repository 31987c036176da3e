// libFuzzer target: policy checkpoints: dc::parse_policy_checkpoint as given and with the checksum
// resealed, dc::load_policy_checkpoint, and the re-encoding of whatever is accepted.
// The logic lives in tests/support/fuzz_entry_points.hpp, shared with the regression test.
#include <cstddef>
#include <cstdint>

#include "../tests/support/fuzz_entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dc_fuzz::policy_checkpoint_entry(data, size);
  return 0;
}
