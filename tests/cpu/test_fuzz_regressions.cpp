// Replays every input in tests/fixtures/fuzz/<target>/ through the same entry point its libFuzzer
// target runs (tests/support/fuzz_entry_points.hpp): each one crashed, hung, leaked or broke an
// invariant before its fix (fuzz/README.md lists them). Each must now either succeed or be
// rejected with dc::Error, which the entry points absorb; anything escaping them -- another
// exception type or an invariant violation -- fails the test. Crashes fail it by crashing, and
// the sanitizer build of the suite (scripts/test.sh) turns memory errors into failures as well.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <distillcache/io/hf_checkpoint.hpp>

#include "../support/fuzz_entry_points.hpp"
#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = DC_FIXTURE_DIR;

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = kFixtures / "fuzz" / target;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs entry on every input of `target`; returns how many were replayed.
template <class Entry>
int replay(const std::string& target, Entry&& entry) {
  int n = 0;
  for (const fs::path& p : inputs_of(target)) {
    const std::vector<std::uint8_t> bytes = read_bytes(p);
    CAPTURE(p.filename().string());
    try {
      if (entry(bytes.data(), bytes.size())) ++n;
    } catch (const dc_fuzz::InvariantViolation& e) {
      FAIL_CHECK("invariant violated: " << e.what());
    } catch (const std::exception& e) {  // dc::Error included: the entry points absorb expected ones
      FAIL_CHECK("escaped the entry point: " << e.what());
    }
  }
  MESSAGE(target << ": " << n << " regression inputs replayed");
  return n;
}

}  // namespace

TEST_CASE("fuzz regressions: gguf") {
  CHECK(replay("gguf", [](const std::uint8_t* d, std::size_t n) {
          dc_fuzz::gguf_entry(d, n);
          return true;
        }) > 0);
}

TEST_CASE("fuzz regressions: safetensors") {
  CHECK(replay("safetensors", [](const std::uint8_t* d, std::size_t n) {
          dc_fuzz::safetensors_entry(d, n);
          return true;
        }) > 0);
}

TEST_CASE("fuzz regressions: hf_config") {
  CHECK(replay("hf_config", [](const std::uint8_t* d, std::size_t n) {
          dc_fuzz::hf_config_entry(d, n);
          return true;
        }) > 0);
}

TEST_CASE("fuzz regressions: policy_checkpoint") {
  CHECK(replay("policy_checkpoint", [](const std::uint8_t* d, std::size_t n) {
          dc_fuzz::policy_checkpoint_entry(d, n);
          return true;
        }) > 0);
}

TEST_CASE("fuzz regressions: tokenizer") {
  // Inputs for the SmolLM2 vocabulary are skipped (with a note on stderr) when the model file is
  // absent; the spm_tiny ones always run.
  (void)replay("tokenizer", [](const std::uint8_t* d, std::size_t n) {
    return dc_fuzz::tokenizer_entry(d, n, kFixtures);
  });
}

// The GGUF finding "block_count = 2^31-1 allocates ~1 TB of layer slots" has a twin in the
// Hugging Face loader, which has no fuzz target of its own (it reads a folder): a config.json
// whose num_hidden_layers the checkpoint cannot back must be rejected before any allocation.
TEST_CASE("fuzz regressions: HF loader rejects a layer count the checkpoint cannot back") {
  const dc_test::TempDir dir("dc_fuzz_hf");
  fs::copy_file(kFixtures / "tiny_mistral" / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(kFixtures / "tiny_mistral" / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["num_hidden_layers"] = 2147483647;
  std::ofstream(dir / "config.json") << config.dump();
  try {
    (void)dc::load_hf_model(dir.path);
    FAIL("accepted num_hidden_layers = 2147483647");
  } catch (const dc::Error& e) {
    CHECK_MESSAGE(e.message().find("num_hidden_layers = 2147483647") != std::string::npos, e.message());
  }
}
