#pragma once
// Where tests find the real SmolLM2 GGUF: $DC_SMOLLM2_GGUF, else the cache that
// scripts/fetch_model.sh fills (${XDG_CACHE_HOME:-$HOME/.cache}/distillcache).
#include <cstdlib>
#include <filesystem>
#include <string>

namespace dc_test {

inline std::filesystem::path smollm2_gguf_path() {
  if (const char* p = std::getenv("DC_SMOLLM2_GGUF"); p && *p) return p;
  std::filesystem::path cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = x;
  else if (const char* h = std::getenv("HOME"); h && *h) cache = std::filesystem::path(h) / ".cache";
  return cache / "distillcache" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace dc_test
